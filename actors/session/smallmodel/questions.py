"""What a message asks, read from its words: nothing a tool could find, a name in the code,
or the project itself. Pure functions of the message's text, for the step rules
(:mod:`actors.session.smallmodel.step_rules`).

- :func:`needs_no_tool`: the message's ask (its last sentence) wants no fact from anywhere
  ("Reply with OK.", "What is 12 plus 30?", "Hello!"). Left the choice, the embedded model
  listed an empty workspace before each of ten pasted notes ending "Reply with OK." and
  answered "list_dir returned: (empty directory)"; such a message gets no call at all.
- :func:`code_names`: the names of code a question asks about ("Where is the class Context
  defined?" -> Context, "What does parse_value() do?" -> parse_value): on a workspace too big
  to tell by its words, the embedded model answered these from nothing ("in the file
  context" and a .py file name that is not there).
- :func:`asks_about_now`: a question about the present moment ("right now", "today's
  rate", "currently"): only a tool can know it, whatever its words name; a question
  without such a word and without a tool's word is answered from knowledge ("What is the
  capital of Japan?", where the embedded model called the one tool it had).
- :func:`about_the_project`: a question about the workspace as a whole ("What does this
  project do?", "What is the version?"), answered on a real repository with the text of
  loopd's own tool descriptions.
"""

from __future__ import annotations

import keyword
import re

from actors.session.smallmodel.decision_word import names_a_file

__all__ = ["about_the_project", "asks_a_number", "asks_about_now", "asks_the_version",
           "asks_to_write", "asks_what_uses", "code_names", "follows_on", "names_the_workspace",
           "needs_no_tool", "refers_to_code", "the_ask"]

# The ask: the message's last sentence (pasted notes come first, the request last).
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+|\n+")


def the_ask(message: str) -> str:
    """The last sentence of ``message`` (its request, after any pasted text)."""
    parts = [p.strip() for p in _SENTENCE_END.split(message.strip()) if p.strip()]
    return parts[-1] if parts else ""


_REPLY = re.compile(r"(?:^|[,;:]\s*)(?:please\s+)?(?:just\s+|only\s+)?(?:reply|answer|"
                    r"respond|say|write back|type)(?:\s+(?:with|only|just))*\b(?!\s+(?:what|"
                    r"which|where|who|how|whether|if)\b)", re.IGNORECASE)
_GREETING = re.compile(r"^(?:hi|hello|hey|thanks|thank you|good (?:morning|afternoon|evening|"
                       r"night)|bye|goodbye|ok|okay|great|cool|nice)\b[\s\w,'!.]*$",
                       re.IGNORECASE)
_NUMBER = r"-?\d+(?:[.,]\d+)?"
_ARITHMETIC = re.compile(
    rf"{_NUMBER}\s*(?:[-+*/x×÷^]|plus|minus|times|divided by|multiplied by|over|to the "
    rf"power of)\s*{_NUMBER}", re.IGNORECASE)
# words that make a message about a file or a tool's world, whatever else it says
_LOOKS = re.compile(r"\b(?:file|files|folder|directory|workspace|repo|repository|project|"
                    r"code|tool|search|read|list|open|write|create|find|look)\b", re.IGNORECASE)


def names_the_workspace(question: str) -> bool:
    """Whether ``question`` names a file, or the workspace or a tool by a word ("file",
    "folder", "project", "search", "read", ...)."""
    return names_a_file(question) or _LOOKS.search(question) is not None


def needs_no_tool(message: str) -> bool:
    """Whether the message's ask wants no fact a tool could give: an instruction to reply
    with given text ("Reply with OK."), arithmetic on numbers it gives ("What is 12 plus
    30?"), or a greeting or thanks, with no file, folder or tool named in it."""
    ask = the_ask(message)
    if not ask or names_a_file(ask) or _LOOKS.search(_NO_NEED.sub(" ", ask)):
        return False
    if _REPLY.search(ask) or _GREETING.fullmatch(ask.rstrip("?")):
        return True
    return _sum(ask)


# a clause that says no tool is wanted ("No need to look anything up: just say OK.", "Don't
# search, just reply with yes"): its "look" or "search" asks for no tool (the 1.5B listed
# the workspace for that message and answered with the listing)
_NO_NEED = re.compile(r"\b(?:no need to|(?:there is )?no need for|don't|do not|without|never)"
                      r"\b[^,;:.!?]*", re.IGNORECASE)


def _arithmetic(message: str) -> bool:
    """Whether the message's ask is arithmetic on numbers it gives ("What is 9 plus 8?"),
    with no file, folder or tool named in it: its answer is a number."""
    ask = the_ask(message)
    return bool(ask) and not names_a_file(ask) and not _LOOKS.search(ask) and _sum(ask)


# "How many minutes are in two hours?", "How many days are in a week?": a number of units in
# another, which the question says in words
_UNITS = re.compile(r"^how many \w+ (?:are|is) (?:there )?in (?:a|an|one|two|three|four|five|"
                    r"six|seven|eight|nine|ten|twelve|\d+) \w+\W*$", re.IGNORECASE)


def asks_a_number(message: str) -> bool:
    """Whether the message's ask is arithmetic (:func:`_arithmetic`) or a number of
    units in another ("How many minutes are in two hours?"), naming no file, folder or
    tool: its answer is a number (the 0.5B cut "120" to "12" after "ANSWER ")."""
    ask = the_ask(message)
    return _arithmetic(message) or (bool(_UNITS.match(ask)) and not names_the_workspace(ask))


def _sum(ask: str) -> bool:
    words = re.findall(r"[A-Za-z]+", _ARITHMETIC.sub(" ", ask))
    return bool(_ARITHMETIC.search(ask)) and len(words) <= 6


# A name as code writes it: snake_case, camelCase, CamelCase with an inner capital,
# dotted.names, a call's (), or anything in backquotes.
_BACKQUOTED = re.compile(r"`([^`\s]{1,80})`")
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)(\(\))?")
# (not after "that" or "this": "that class case-sensitive" names no class "case")
_AFTER_KIND = re.compile(r"(?<!that )(?<!this )\b(?:class|function|method|def|module|variable|"
                         r"constant|attribute|decorator|exception|enum)\s+`?([A-Za-z_][\w.]*)",
                         re.IGNORECASE)
_BEFORE_KIND = re.compile(r"\b([A-Za-z_][\w.]*)`?(?=\s+(?:class|function|method|decorator|"
                          r"exception)\b)", re.IGNORECASE)
_WHAT_DOES = re.compile(r"\b(?:what|how) does\s+(?:the\s+)?`?([A-Za-z_][\w.]*)`?(?:\(\))?\s+"
                        r"(?:do|work|return|mean)\b", re.IGNORECASE)
_WHERE = re.compile(r"\bwhere\s+(?:is|are)\s+(?:the\s+)?`?([A-Za-z_][\w.]*)`?(?:\(\))?\s+"
                    r"(?:defined|declared|implemented|made|set|used|called|imported|referenced|"
                    r"raised|instantiated)\b", re.IGNORECASE)
_USES = re.compile(r"\b(?:uses|use|calls|call|imports|import|raises|raise|subclasses|"
                   r"subclass|inherits from)\s+`?([A-Za-z_][\w.]*)`?(?:\(\))?", re.IGNORECASE)
_NOT_NAMES_WORDS = """
a an the this that these those it its they them what which who whom how why when where is
are was were be do does did done have has had use uses used call calls called class
function method module variable constant attribute type enum code project file files repo
repository package library any some all each every one here there my your our their
for of in on at to by with from if as or and not no new own same other returns mean means
work works
"""
_NOT_NAMES = frozenset(_NOT_NAMES_WORDS.split()) | frozenset(map(str.lower, keyword.kwlist))


_THAT_KIND = re.compile(r"\b(?:that|this|the same)\s+(?:class|function|method|module|"
                        r"variable|constant|exception|decorator|enum)\b", re.IGNORECASE)


def refers_to_code(question: str) -> bool:
    """Whether ``question`` names code by an earlier question's name ("Are the keys of that
    class case-sensitive?" after "Where is the class Headers defined?")."""
    return _THAT_KIND.search(question) is not None


def _codelike(word: str) -> bool:
    return ("_" in word or "." in word.strip(".") or re.search(r"[a-z][A-Z]", word) is not None
            or re.search(r"[A-Z]{2,}[a-z]", word) is not None)


def code_names(question: str) -> tuple[str, ...]:
    """The names of code ``question`` asks about, as written: in backquotes, after or
    before a kind (class Context, the parse function), in "what does X do", "where is X
    defined" and "what uses X", or written as code (snake_case, camelCase, a.b, f())."""
    found: list[str] = []
    found += _BACKQUOTED.findall(question)
    for pattern in (_AFTER_KIND, _BEFORE_KIND, _WHAT_DOES, _WHERE, _USES):
        found += pattern.findall(question)
    for m in _IDENT.finditer(question):
        word = m.group(1)
        if (m.group(2) or _codelike(word)) and not _is_file(word):
            found.append(word)
    names = [n.strip(".").removesuffix("()") for n in found]
    return tuple(dict.fromkeys(n for n in names if n and n.lower() not in _NOT_NAMES
                               and not n.isdigit()))


def _is_file(word: str) -> bool:
    """A dotted word that ends like a file name's extension (notes.txt, a .py file)."""
    return bool(re.fullmatch(r"[\w-]+\.(?:py|pyi|md|txt|toml|cfg|ini|json|yaml|yml|csv|rst|"
                             r"js|ts|go|rs|c|h|html|css|lock|log|sh)", word))


_PROJECT = re.compile(
    r"\b(?:this|the|your|our)\s+(?:project|repo|repository|package|library|codebase|code|"
    r"module|program|app|application|tool)\b|\bcode\s*base\b|\b(?:version|versions|"
    r"licen[cs]e|dependencies|depends on|entry point|tests?)\b|\b(?:defined|declared|"
    r"implemented|implementation|subclass(?:es)?|imports?|raises?|exceptions?|class|"
    r"classes|functions?|methods?|modules?|workspace|folders?|director(?:y|ies)|files?)\b",
    re.IGNORECASE)


def about_the_project(question: str) -> bool:
    """Whether ``question`` asks about the workspace as a project: what it is or does, its
    version, licence, dependencies or tests, where something is defined, its classes,
    functions and exceptions, or its files and folders."""
    return _PROJECT.search(question) is not None


_FOLLOW = re.compile(r"^(?:and|and what about|what about|how about|same for|now for|and for)\b",
                     re.IGNORECASE)


def follows_on(question: str) -> bool:
    """Whether ``question`` is a short follow-up asking the last question again of
    something else ("And in Lyon?", "What about Paris?"): the same tool, other arguments."""
    return _FOLLOW.match(question.strip()) is not None and len(question.split()) <= 8


_NOW = re.compile(r"\b(?:now|nowadays|today|today's|tonight|currently|current|at the moment|"
                  r"at present|this (?:morning|afternoon|evening|week|month)|latest|"
                  r"so far|yet|still)\b|\b(?:is|are|am)\s+(?:\w+\s+){0,2}\w+ing\b",
                  re.IGNORECASE)  # and what is going on: "Is it raining in Oslo?"


def asks_about_now(question: str) -> bool:
    """Whether ``question`` asks about the present moment ("today's rate", "Is the room free
    this morning?") or what is going on ("Is it raining in Oslo?"): a fact only a tool can
    give."""
    return _NOW.search(question) is not None


# the verbs of a request to write, change or remove a file
_WRITE = re.compile(r"\b(?:write|writes|rewrite|overwrite|create|save|store|make|add|append|"
                    r"put|change|edit|update|replace|record|note|jot|fix|rename|delete|"
                    r"remove|copy|move|fill)\b", re.IGNORECASE)


def asks_to_write(question: str) -> bool:
    """Whether ``question`` asks for something written, changed or removed ("Save the text
    to a.txt", "Create a file ...", "Add eggs to the list"): the only questions that may
    call write_file. Left the choice, the embedded model wrote a file for "How do you say
    thank you in German?" and answered with its refusal."""
    return _WRITE.search(question) is not None


_VERSION = re.compile(r"\bversions?\b", re.IGNORECASE)
# a version of something else the project needs ("Which Python version does it require?")
_OTHER_VERSION = re.compile(r"\b(?:python|node|npm|rust|java|go|ruby|php|perl|gcc|clang|"
                            r"requires?|required|needs?|needed|supports?|supported|minimum|"
                            r"dependency|dependencies)\b", re.IGNORECASE)


def asks_the_version(question: str) -> bool:
    """Whether ``question`` asks for the project's own version ("What is the version of
    this project?", "Which version is this?"), not one it needs ("Which Python version
    does it require?"): its manifest's version line says it. Left the choice, the embedded
    model listed the top folder and answered with a file's size."""
    return (_VERSION.search(question) is not None and not _OTHER_VERSION.search(question)
            and not _A_VERSION.search(question))


# a version named ("What changed in version 2.0?"): not the question which one this is
_A_VERSION = re.compile(r"\d+\.\d+|\b(?:changed?|changes|changelog|new in|added|removed|"
                        r"since|before|after)\b", re.IGNORECASE)


_USED = re.compile(r"\b(?:which|what|where|who)\b.*\b(?:uses?|used|using|calls?|called|"
                   r"imports?|imported|references?|referenced|mentions?|mentioned|"
                   r"subclass(?:es|ed)?|inherits?|inherited|instantiates?|instantiated)\b",
                   re.IGNORECASE)


def asks_what_uses(question: str) -> bool:
    """Whether ``question`` asks what uses a name ("Which files use the class Whitespace?",
    "Where is parse_value called?", "What imports Container?"): the places that mention it,
    which a search finds and a definition's place does not (the embedded model called
    find_definition for it and answered with the defining file)."""
    return _USED.search(question) is not None and not _PURPOSE.search(question)


# what a name is for, not what uses it: "What is the class X used for?", "What can I use X
# for?", "What is X used to do?"
_PURPOSE = re.compile(r"^\s*what\b.*\bused?\s+(?:\S+\s+){0,3}?(?:for|to)\b|\bfor\s*\?*\s*$",
                      re.IGNORECASE)
