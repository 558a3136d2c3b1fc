"""The runaway-text limit: streamed text that repeats itself or copies the prompt, seen as it
comes (docs/turn.md#limits, ``loop.runaway_repeat_tokens`` and ``loop.runaway_copy_tokens``).

A small model that loses its way writes the same run of text again and again, or copies its
input back word for word (a pasted message, a file it read) until ``loop.max_tokens`` or the
request's wall-clock limit stops it, minutes later. The stream reader gives each piece of
answer or reasoning text to a :class:`Watcher`, which says when the text has run away; the
reader then closes the stream (the server stops generating) and keeps what came, marked cut.

The text is cut into pieces: a word, a number or a mark (spaces and line breaks are not
pieces), about one of the model's tokens each; a number counts as ``#``, so a list that
counts up while it repeats ("Item 3-12: the red box on shelf 12 holds 33 screws. Item
3-13: ...") is a repeat. Two runs are followed, each the way LZ77 finds a match: once the
last :data:`GRAM` pieces were seen before, the earlier text is followed piece by piece, and
the run is how many pieces in a row match it.

- **repeat**: the last ``repeat`` pieces copy the stream's own earlier text;
- **copy**: the last ``copy`` pieces copy the prompt (every message's text, a file's lines
  without the numbers ``read_file`` puts before them (:func:`unnumbered`), cut into pieces
  once per request, when a stream reaches :data:`LAZY` pieces: most answers are shorter, and
  cutting a long conversation into pieces costs milliseconds a request; the pieces said so far
  are then followed again, so the run is the same as if the prompt had been there at once).
  A list's own numbers or bullets the answer puts before each line it copies (:data:`MARKS`,
  two in a row at most) do not end the run, nor count in it.
- **echo** (the answer only): the last ``echo`` pieces repeat ``echoes``, the passages of tool
  results that earlier answers to other questions copied (the session picks them,
  :func:`actors.session.limits.passages`). A small model that once answered with a file's
  paragraph (the README's "Donate" one, after a read) gave the same paragraph to each of the
  next three questions; such a passage is short, far under ``copy``, and a right answer may
  quote it once, so only its second coming is cut.

Each piece costs a few dictionary look-ups (the cost per chunk is in docs/turn.md), so the
watch runs on every streamed token. A legitimate answer copies its prompt to show a file,
and a list or code repeats short runs: the defaults are far above what the eval's right
answers reach (scripts/runaway_scores.py measures them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["GRAM", "LAZY", "MARKS", "MARKS_SKIPPED", "Runaway", "Watcher", "pieces", "prompt_text",
           "unnumbered"]

GRAM = 8  # pieces that must match before a run is followed (and the shortest run)
_PIECE = re.compile(r"\d+|[^\W\d]+|[^\w\s]")
_WORD_END = re.compile(r"\w+\Z")
LAZY = 64  # pieces a stream says before the prompt is cut into pieces (0: at once)
# A copy of the prompt goes on through a list's own numbering or bullets put before each
# line copied ("1. " or "- " before a search match): a search's 67 matches given back as a
# numbered list was never a run longer than a line, and ran on to loop.max_tokens.
MARKS = frozenset({"#", ".", ")", ":", "-", "*", "+", "\u2022"})
MARKS_SKIPPED = 2  # of them in a row, at most
_HELD = 64  # characters of an unfinished word held back at most (one giant word: cut up)


def pieces(text: str) -> list[str]:
    """``text`` as the watch sees it: words, ``#`` for each number, and marks."""
    return ["#" if p[0].isdigit() else p for p in _PIECE.findall(text)]


_LINE_NUMBER = re.compile(r"^\d+: ", re.MULTILINE)


def unnumbered(text: str) -> str:
    """``text`` without the number ``read_file`` puts before each line ("12: "): a model
    that copies a file it read copies its lines, not their numbers, and with the numbers
    in the way no run was longer than a line (a README copied out whole was never cut)."""
    return _LINE_NUMBER.sub("", text)


def prompt_text(messages: Iterable[Mapping[str, Any]]) -> str:
    """Every message's text the model reads (content, reasoning, calls' arguments)."""
    parts: list[str] = []
    for m in messages:
        for key in ("content", "reasoning_content"):
            value = m.get(key)
            if isinstance(value, str):
                parts.append(value)
        for call in m.get("tool_calls") or ():
            fn = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(fn, Mapping) and isinstance(fn.get("arguments"), str):
                parts.append(fn["arguments"])
    return "\n".join(parts)


@dataclasses.dataclass(frozen=True, slots=True)
class Runaway:
    """Text that ran away: ``kind`` "repeat", "copy" or "echo", over the last ``run`` pieces;
    ``period``: for a repeat, how many pieces apart the copies are."""

    kind: str
    run: int
    period: int = 0

    def note(self, where: str, limit: int) -> str:
        """What the person reads: ``where`` ("answer", "reasoning") was cut, and why."""
        if self.kind == "repeat":
            return (f"{where} cut: its last {self.run} tokens repeat its own earlier text "
                    f"(the same {self.period} again and again; "
                    f"loop.runaway_repeat_tokens = {limit})")
        if self.kind == "echo":
            return (f"{where} cut: its last {self.run} tokens give again, word for word, a "
                    "passage of a tool's result that an earlier answer to another question "
                    f"already gave, not an answer to this one (loop.runaway_echo_tokens = "
                    f"{limit})")
        return (f"{where} cut: its last {self.run} tokens copy the prompt word for word "
                f"(loop.runaway_copy_tokens = {limit})")


class _Follow:
    """How many pieces in a row follow an earlier stretch of ``source`` verbatim; with
    ``marks``, up to :data:`MARKS_SKIPPED` of the :data:`MARKS` pieces in a row that are
    not in ``source`` keep the run going (not counted in it)."""

    __slots__ = ("at", "grams", "marks", "run", "skipped", "source")

    def __init__(self, source: list[str], grams: dict[tuple[str, ...], int],
                 marks: bool = False) -> None:
        self.source, self.grams = source, grams
        self.at = -1  # the index in source of the piece the next one should equal
        self.run = 0
        self.marks = MARKS_SKIPPED if marks else 0
        self.skipped = 0  # marks skipped since the last piece that followed

    def step(self, piece: str, gram: tuple[str, ...] | None) -> int:
        at = self.at
        if 0 <= at < len(self.source) and self.source[at] == piece:
            self.at, self.run, self.skipped = at + 1, self.run + 1, 0
            return self.run
        if self.run and self.skipped < self.marks and piece in MARKS:
            self.skipped += 1  # a list's own number or bullet before a copied line
            return self.run
        self.at, self.run, self.skipped = -1, 0, 0
        if gram is not None:
            end = self.grams.get(gram)
            if end is not None:
                self.at, self.run = end + 1, GRAM
        return self.run


class _Stream:
    """The watch over one stream of text (the answer, or the reasoning)."""

    __slots__ = ("copy", "echo", "held", "own", "repeat", "said")

    def __init__(self, echo: _Follow | None = None) -> None:
        self.said: list[str] = []
        self.own: dict[tuple[str, ...], int] = {}
        self.repeat = _Follow(self.said, self.own)
        self.copy: _Follow | None = None  # the prompt's follower, from LAZY pieces on
        self.echo = echo  # the echoes' follower (the answer's stream only)
        self.held = ""  # the end of the text so far, when it may be an unfinished word


class Watcher:
    """Watches the answer and the reasoning of one response; ``repeat``/``copy``: the
    longest run allowed (0: not watched). ``messages``: the request's, cut into pieces
    when a stream reaches ``lazy`` pieces (a short answer, or a response that only calls a
    tool, never pays for it)."""

    __slots__ = ("_copy", "_echo", "_echoes", "_grams", "_lazy", "_messages", "_prompt",
                 "_repeat", "_streams", "peaks")

    def __init__(self, messages: Iterable[Mapping[str, Any]], repeat: int, copy: int,
                 lazy: int = LAZY, *, echo: int = 0, echoes: Iterable[str] = ()) -> None:
        self._repeat, self._copy, self._echo = repeat or 1 << 62, copy or 1 << 62, echo
        self._echoes = tuple(echoes) if echo else ()
        self._lazy = max(1, min(lazy, copy or lazy))  # never later than a cut could come
        self._messages = messages if copy else ()
        self._prompt: list[str] | None = None
        self._grams: dict[tuple[str, ...], int] = {}
        self._streams: dict[bool, _Stream] = {}
        self.peaks = [0, 0, 0]  # the longest repeat, copy and echo runs seen (as measured)

    def feed(self, text: str, reasoning: bool = False) -> Runaway | None:
        """The next text of the answer (or of the reasoning); a Runaway once it ran away."""
        # Once per streamed token: pieces() inline (its call and list were a tenth of the cost).
        stream = self._streams.get(reasoning)
        if stream is None:
            echoes = None if reasoning or not self._echoes else _following(self._echoes)
            stream = self._streams[reasoning] = _Stream(echoes)
        if stream.held:
            text = stream.held + text
            stream.held = ""
        last = text[-1:]
        if last.isalnum() or last == "_":  # a word that may go on in the next text
            end = _WORD_END.search(text, max(0, len(text) - _HELD))
            if end is not None:
                start = end.start()
                if start > 0 or len(text) < _HELD:
                    stream.held, text = text[start:], text[:start]
        if not text:
            return None
        add = self._add
        for piece in _PIECE.findall(text):
            found = add(stream, "#" if piece[0].isdigit() else piece)
            if found is not None:
                return found
        return None

    def _add(self, stream: _Stream, piece: str) -> Runaway | None:
        said = stream.said
        said.append(piece)
        end = len(said) - 1
        gram = tuple(said[-GRAM:]) if end >= GRAM - 1 else None
        run = stream.repeat.step(piece, gram)
        if gram is not None:
            stream.own[gram] = end
        peaks = self.peaks
        if run > peaks[0]:
            peaks[0] = run
            if run >= self._repeat:
                return Runaway("repeat", run, period=end + 1 - stream.repeat.at)
        if stream.echo is not None and (echoed := stream.echo.step(piece, gram)) > peaks[2]:
            peaks[2] = echoed
            if echoed >= self._echo:
                return Runaway("echo", echoed)
        if stream.copy is not None:
            return self._copied(stream.copy.step(piece, gram))
        if end + 1 == self._lazy and self._messages:
            return self._catch_up(stream)
        return None

    def _copied(self, copied: int) -> Runaway | None:
        peaks = self.peaks
        if copied > peaks[1]:
            peaks[1] = copied
            if copied >= self._copy:
                return Runaway("copy", copied)
        return None

    def _catch_up(self, stream: _Stream) -> Runaway | None:
        """Follow the prompt over every piece said so far, as if it had been there at once."""
        copy = stream.copy = self._prompt_follow()
        said = stream.said
        for i, piece in enumerate(said):
            gram = tuple(said[i - GRAM + 1: i + 1]) if i >= GRAM - 1 else None
            found = self._copied(copy.step(piece, gram))
            if found is not None:
                return found
        return None

    def _prompt_follow(self) -> _Follow:
        if self._prompt is None:
            self._prompt = pieces(unnumbered(prompt_text(self._messages)))
            self._grams = _first_places(self._prompt)
        return _Follow(self._prompt, self._grams, marks=True)


def _first_places(p: list[str]) -> dict[tuple[str, ...], int]:
    """Each n-gram of ``p`` and its first place (set last): the longest run to follow."""
    grams = list(zip(*(p[k:] for k in range(GRAM)), strict=False))
    return dict(zip(reversed(grams), range(len(p) - 1, GRAM - 2, -1), strict=True))


def _following(texts: Iterable[str]) -> _Follow:
    """A follower of ``texts``, each apart (a run never goes from one into the next)."""
    source: list[str] = []
    for text in texts:
        source.extend([*pieces(text), "\0"])
    return _Follow(source, _first_places(source))
