"""A compaction's wording kept out of answers (docs/sessions.md, compaction).

Once a conversation was compacted, the request carries loopd's own text: the frame around the
summary (:data:`~actors.session.messages.SUMMARY_FRAME`), the elided summary's header and its
line labels ("- The person asked: ...", "- You answered: ..."). A small model copies what it
reads: asked "What was the first question I asked you?" after a compaction, the embedded
model answered "The person asked: What is this project for?", right in content, loopd's in
form; earlier it answered with the whole frame. A prompt cannot promise that never happens,
so the turn's answer goes through :class:`FrameFilter`, which takes each piece of that
wording (:data:`PIECES`, with the marks after it) out of the streamed text before the person,
a script or the log sees it, and keeps the rest: the answer above becomes "What is this
project for?". What could still be the start of a piece is held back until it is one or
cannot be one (a few words at most), so the text streams as it did. :func:`unframed` is the
same on a whole text (the answer the turn logs), and gives what the stream showed.
The same goes for :data:`~actors.session.messages.ECHOED`, the text an answer cut as an echo
is shown as: on the chat over click the next answer was that text, word for word.

The pieces are the frame's and the header's clauses of 24 characters or more, the labels, and
the wording of earlier summaries still in older logs; the eval fails an answer holding any
(``frame_text`` in scripts/eval.py reads them from here). The filter runs only in a session
that was compacted: before that the prompt holds none of this wording to copy.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from actors.base.events import AnswerCut, Content, Event, Retrying
from actors.log.records import Compaction, Cut, Record
from actors.session.compaction import ELIDE_HEADER
from actors.session.messages import ECHOED, OUTSIDE_FRAME, SUMMARY_FRAME

__all__ = ["PIECES", "FrameFilter", "compacted", "frame_piece", "unframed"]

_SHORTEST = 24  # characters of a clause of the frame counted as its wording
# the elided summary's line labels, the frame's own mark, and older summaries' wording
_LABELS = ("the person asked:", "you answered:", "[loopd:", "no longer fits the context",
           "earlier lines left out", "earlier line left out", "call it again to see them")


def _pieces() -> tuple[str, ...]:
    texts = [*SUMMARY_FRAME.split("{summary}"), *OUTSIDE_FRAME.split("{summary}"), ELIDE_HEADER]
    wholes = {" ".join(t.lower().split()) for t in [*texts, ECHOED]}  # with its brackets
    clauses = {" ".join(p.lower().split()) for t in texts for p in re.split(r"[.,:()\[\]]", t)}
    found = ({w for w in wholes if w} | {w.strip("[]") for w in wholes if w}
             | {c for c in clauses if len(c) >= _SHORTEST} | set(_LABELS))
    return tuple(sorted(found, key=lambda p: (-len(p), p)))  # the longest first: taken whole


PIECES = _pieces()  # lower case, one space between words
_JUNK = "[:,.;)\\]]*[ \t]*"  # the marks and spaces a piece leaves behind when taken out
_FOUND = re.compile("(?:" + "|".join(r"\s+".join(map(re.escape, p.split(" "))) for p in PIECES)
                    + ")" + _JUNK, re.IGNORECASE)
_STARTS = frozenset(p[:k] for p in PIECES for k in range(1, len(p) + 1))
_HEADS = frozenset(p[:3] for p in PIECES)  # a quick test before the whole one
_LONGEST = max(map(len, PIECES)) + 8  # characters a possible piece (and its marks) spans
_SPACES = re.compile(r"\s+")
_AS_SPACE = {ord(c): " " for c in "\t\n\r\x0b\x0c"}
_ONLY_JUNK = re.compile(_JUNK + r"\Z")


def compacted(records: Sequence[Record]) -> bool:
    """Whether the session was ever compacted, or had an answer cut as an echo (shown to
    the model as :data:`~actors.session.messages.ECHOED`, which it copied once as the next
    answer): before that no wording is there to copy."""
    return any(type(r) is Compaction or (type(r) is Cut and r.why == "echo") for r in records)


def frame_piece(text: str) -> str | None:
    """The first piece of the wording ``text`` holds (None: none)."""
    low = " ".join(text.lower().split())
    return next((piece for piece in PIECES if piece in low), None)


def _may_start(tail: str) -> bool:
    """Whether ``tail`` (the end of the text so far) could still become a piece with its
    marks: a piece's start, or a whole piece followed by marks that may go on."""
    low = _SPACES.sub(" ", tail.lower())
    if low in _STARTS:
        return True
    return any(low.startswith(p) and _ONLY_JUNK.match(low, len(p)) for p in PIECES)


class FrameFilter:
    """A sink that passes events on with the wording (:data:`PIECES`) taken out of the
    streamed text. ``active`` is asked at the first text (a session never compacted:
    every event passes as it came). What was held back is passed at :meth:`flush` (the
    stream ended) or before an ``AnswerCut``; ``text`` is the text passed so far once
    active."""

    def __init__(self, sink: Callable[[Event], None], active: Callable[[], bool]) -> None:
        self._sink, self._active = sink, active
        self._on: bool | None = None
        self._held = ""
        self.text = ""

    def __call__(self, event: Event) -> None:
        if self._on is False:  # never compacted: every event as it came
            self._sink(event)
            return
        if type(event) is not Content:
            if isinstance(event, Retrying):  # the stream starts again: nothing held is shown
                self._held = self.text = ""
            elif isinstance(event, AnswerCut):
                self.flush()
            self._sink(event)
            return
        if self._on is None:
            self._on = self._active()
            if not self._on:
                self._sink(event)
                return
        held = self._held + event.text
        hold = len(held)
        low = held.lower().translate(_AS_SPACE)
        for at in range(max(0, len(held) - _LONGEST), len(held)):
            head = low[at:at + 3]
            if (head in _HEADS or (len(head) < 3 and head in _STARTS)) and _may_start(held[at:]):
                hold = at
                break
        for found in _FOUND.finditer(held):  # a piece the hold would cut stays whole
            if found.start() < hold < found.end():
                hold = found.start()
                break
        if not self.text and not held[:hold].strip():
            hold = 0  # the answer's leading spaces wait for its first word
        self._held = held[hold:]
        self._pass(self._clean(held[:hold]), event)

    def flush(self) -> None:
        """The stream ended: what was held back is passed, without its wording."""
        held, self._held = self._held, ""
        self._pass(self._clean(held), None)

    def answer(self, content: str) -> str:
        """The stream's whole ``content`` as it was passed on (after :meth:`flush`)."""
        self.flush()
        if self._on is None:
            self._on = self._active()
        return unframed(content) if self._on else content

    def _clean(self, text: str) -> str:
        out = text
        while (cleaner := _FOUND.sub("", out)) != out:
            out = cleaner
        if not self.text and out != text and _FOUND.match(text, len(text) - len(text.lstrip())):
            out = out.lstrip()  # an answer that began with a piece begins after it
        return out

    def _pass(self, text: str, event: Content | None) -> None:
        if text:
            self.text += text
            self._sink(event if event is not None and event.text == text else Content(text))


def unframed(text: str) -> str:
    """``text`` without the wording, as :class:`FrameFilter` streams it."""
    out = FrameFilter(lambda event: None, lambda: True)
    out(Content(text))
    out.flush()
    return out.text
