"""The word a constrained answer starts with: ``TOOL`` before a call, ``ANSWER`` before text.

Under ``inference.constrained_calls`` the grammar (:mod:`actors.session.smallmodel.grammar`) makes
the model write one of :data:`WORDS` first, so that it decides between a call and an answer
before it writes either. Left to start with the call or the text itself, the embedded
0.5B model's first choice is ``{"`` for every question, "What is 12 plus 30?" included
(first-token log-probabilities). With a word first, the system prompt's worked examples
written the same way and its rule "Use a tool only when the question is about the
workspace or its files", it answered all 11 questions of a probe that need no tool (3 of
``make eval``'s, 8 held out) and called a tool first for 22 of the 29 that need one; the
7 others named a file, and a question that names a file (:func:`names_a_file`) gets no
choice: a call first (38 of the 40 first answers right, the 2 others the wrong tool).

The word is loopd's, not the answer's: :func:`strip_word` takes it off the completion and
:class:`WordFilter` off the streamed text, so the log, the view and the person never see it;
nor do they see the call after ``TOOL`` as answer text (the view shows it as a call).
The server's cache does not mind: the next request's prompt ends where the last one did
(generated tokens are not counted as cached, :func:`actors.session.limits.cache_outcome`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable

from actors.base.events import Content, Event, Retrying
from actors.session.smallmodel.bare_json import could_be_call

__all__ = ["ANSWER", "ANSWER_VALUE", "TOOL", "WORDS", "WordFilter", "about_the_workspace",
           "asked_steps", "asks_a_size", "named_files", "names_a_file", "place_named",
           "refers_back", "strip_word"]

TOOL = "TOOL "
ANSWER = "ANSWER "
# The word before an answer that is a value (arithmetic: "What is 9 plus 8?"). The system
# prompt's worked examples end at the word ANSWER, so after "ANSWER " the embedded model's
# likeliest next token is the end: a word-first answer goes on ("The capital of Spain is
# Madrid."), but a number ends after its first digit (each digit is a token of its own):
# "9 plus 8" -> "1", "15 minus 6" -> "1", "5 plus 7" -> "1" (5 of 12 sums probed). After
# "ANSWER: " it writes the value: 12 of 12 right. Only for such questions: after a colon it
# answers facts with one word ("What is the capital of Italy?" -> "Italy").
ANSWER_VALUE = "ANSWER: "
WORDS = (TOOL, ANSWER, ANSWER_VALUE)

# A file's name in a question: a name and an extension of 2 to 6 characters (a.txt,
# recipes/soup.md), not part of a longer dotted word (e.g., J.K., example.com.au).
_FILE = re.compile(r"(?<![\w./-])(?:[\w-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{1,5}(?![\w.]*\w)")


def named_files(question: str) -> list[str]:
    """The files' names in ``question``, as written (recipes/soup.md, a.txt)."""
    return _FILE.findall(question)


def names_a_file(question: str) -> bool:
    """Whether a question names a file. Under the grammar, such a question's first answer
    is a call: left the choice, the embedded model answered 7 of 19 such questions from
    nothing ("How much did the seeds cost? See budget.txt." -> "The seeds cost $10.")."""
    return _FILE.search(question) is not None


# Words of four letters or more that a question uses whatever it is about: they say nothing
# about whether the workspace holds its answer.
_COMMON = """
about above after again against also another answer anything around asked back been
before being below between both bytes call called came come could does doing done
down during each either else even ever every file files find first folder folders found
four from full give given gives goes going good have having here into just keep know last
least less like line lines list look looks made make many more most much must name named
need next none only other over part please read right said same says search second
should show some still such sure tell than that their them then there these they thing
things third this those three through tool tools under until upon very want well were
what when where which while whole will with within without word words work workspace
would write yes your
kept keeps makes took taken takes used uses using gets goes went gone came comes says
"""
COMMON = frozenset(_COMMON.split())
_WORD = re.compile(r"[^\W_]+")
# a word, or a version or name whose parts are joined by dots, dashes or apostrophes
_TERM = re.compile(r"[^\W_]+(?:[.'-][^\W_]+)*")


def about_the_workspace(question: str, words: frozenset[str] | None) -> tuple[str, ...]:
    """The words of ``question`` that the workspace's files hold (``words``:
    :func:`actors.session.smallmodel.workspace_words.workspace_words`, None for a folder too big to
    tell), as the question writes them, and each two of them in a row ("Omar Haddad"): a
    word of four letters or more that is not in :data:`COMMON`, a name of three (a capital,
    not the first word: Tom), or a version or name with a digit and a dot or dash (2.3.1,
    q1-summary). Plain numbers do not count ("What is 12 plus 30?" in a folder whose files
    have a 12). Under the grammar a question with such words gets a call first, like one
    that names a file, and a search for one of them: left the choice, the embedded model
    answered "In which city does Omar Haddad work?" with a city of its own."""
    if not words:
        return ()
    said: list[tuple[str, int, int]] = []  # word, start, end
    for term in _TERM.finditer(question):
        if any(c.isdigit() for c in term.group()):  # 2.3.1 whole; a plain number is left out
            said.append((term.group(), term.start(), term.end()))
        else:  # Tom's -> Tom, s
            said += [(m.group(), term.start() + m.start(), term.start() + m.end())
                     for m in _WORD.finditer(term.group())]
    held = [(w, a, b) for i, (w, a, b) in enumerate(said)
            if w.lower() in words and _counts(w, first=i == 0)]
    pairs = [f"{w} {v}" for (w, _, b), (v, c, _) in itertools.pairwise(held)
             if question[b:c] == " "]
    return tuple(dict.fromkeys([w for w, _, _ in held] + pairs))


def _counts(word: str, *, first: bool) -> bool:
    if any(c.isdigit() for c in word):
        return not word.isdigit() and any(c in ".-'" for c in word)
    if word.lower() in COMMON:
        return False
    return len(word) >= 4 or (len(word) == 3 and word[0].isupper() and not first)


# The verbs by which a question asks for a file tool.
_STEPS = {"search": "search_files", "list": "list_dir", "read": "read_file",
          "open": "read_file", "write": "write_file", "create": "write_file"}


def asked_steps(question: str) -> tuple[str, ...]:
    """The file tools ``question`` asks for by their verbs, in the order it names them:
    "Search for backup, then read the file you found" asks for search_files, then
    read_file; "Read a.txt and tell me" for read_file. Under the grammar a turn asked for
    two or more gets those calls in that order: left the choice after the first result,
    the embedded model answered from it (0 of 3 such questions on the folders never tuned
    on read the file)."""
    words = _WORD.findall(_FILE.sub(" ", question).lower())  # not reading-list.md's "list"
    return tuple(dict.fromkeys(_STEPS[w] for w in words if w in _STEPS))


# "the second one", "the last one": an earlier answer's list, named by its place in it
_BACK = re.compile(r"\b(?:first|second|third|fourth|fifth|sixth|last|next|other|previous)"
                   r"\s+(?:one|file)\b", re.IGNORECASE)


def refers_back(question: str) -> bool:
    """Whether ``question`` names a thing by its place in an earlier answer ("What does the
    second one say?"). Left the choice, the embedded model answered such follow-ups with
    the system prompt's example ("The second one says: hi") instead of reading."""
    return _BACK.search(question) is not None


_PLACES = {"first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6,
           "last": -1}
_PLACE = re.compile(r"\b(first|second|third|fourth|fifth|sixth|last)\s+(?:one|file)\b",
                    re.IGNORECASE)


def place_named(question: str) -> int | None:
    """The place in an earlier list that ``question`` names: 2 for "the second one", -1
    for "the last file"; None when it names none."""
    found = _PLACE.search(question)
    return _PLACES[found.group(1).lower()] if found else None


_SIZE = frozenset({"big", "bigger", "biggest", "byte", "bytes", "large", "larger", "largest",
                   "long", "size", "sizes", "small", "smaller", "smallest"})


def asks_a_size(question: str) -> bool:
    """Whether ``question`` asks how big something is (a listing says, not the text)."""
    return any(w in _SIZE for w in _WORD.findall(_FILE.sub(" ", question).lower()))


def strip_word(content: str | None) -> str | None:
    """``content`` without its leading decision word (unchanged when it has none)."""
    if content is None:
        return None
    for word in WORDS:
        if content.startswith(word):
            return content[len(word):]
    return content


class WordFilter:
    """A sink that passes events on, the streamed text as the person may see it.

    ``word`` (a request under the grammar): text is held back only while it could still be
    the start of a decision word; after ``ANSWER`` the rest is the answer, after ``TOOL`` the
    rest is a call and is never passed on. ``bare`` (``inference.bare_json_tool_calls``):
    text that could still be a call written as bare JSON (:func:`could_be_call`) is held
    back until it cannot be one, or until :meth:`flush` says the stream was not a call. So
    neither the person nor a ``--json`` script sees a call as answer text. A retry (the
    stream starts again) drops what was held and looks for the word again.
    """

    def __init__(self, sink: Callable[[Event], None], *, word: bool = True,
                 bare: bool = False) -> None:
        self._sink, self._word, self._bare = sink, word, bare
        self._reset()

    def _reset(self) -> None:
        self._start: str | None = "" if self._word else None  # None: no word (any more)
        self._call = False  # the word was TOOL: the rest is a call
        self._held: str | None = "" if self._bare else None  # None: shown as it comes
        self._open = not (self._word or self._bare)  # no word, nothing held: pass text on

    def __call__(self, event: Event) -> None:
        if self._open and type(event) is Content:  # every chunk once decided: as it came
            self._sink(event)
            return
        if isinstance(event, Retrying):
            self._reset()
        if not isinstance(event, Content):
            self._sink(event)
            return
        text = event.text
        if self._start is not None:
            start = self._start + text
            if any(word.startswith(start) for word in WORDS):
                self._start = start  # still maybe a word: wait for more
                return
            self._start = None
            self._call = start.startswith(TOOL)
            text = strip_word(start) or ""
        if self._call or not text:
            return
        if self._held is not None:
            held = self._held + text
            if could_be_call(held):
                self._held = held
                return
            self._held, text = None, held
        self._open = True  # decided, nothing held: the next chunks pass as they come
        self._sink(event if text is event.text else Content(text))

    def flush(self) -> None:
        """The stream ended and was not taken as a call: what was held back is shown now."""
        held, self._held = self._held, None
        self._open = self._start is None and not self._call
        if held:
            self._sink(Content(held))
