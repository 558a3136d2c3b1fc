"""The turn's renderer: the next request as loopd sends it and counts it (docs/rendering.md).

The turn asks it for the messages a request sends (:meth:`Renderer.messages_for`) and for
the last Usage the conversation shows (:meth:`Renderer.shown_usage`); the compactor asks it
for the next prompt's size in tokens (:meth:`Renderer.prompt`) and each record's
(:meth:`Renderer.sizes`). A request renders its conversation once: the messages counted
before it (by the compactor's check) are the ones it sends.

What it worked out is kept by the number of the log's records: a log only grows, so what
held for its first N records holds while it has N, and for N and the turn's message (a
User record changes no request's Usage; logged after its prompt was measured).

Counts are the server's (its ``/tokenize``, an estimate when it cannot say) or, not
``exact``, an upper bound that asks nobody (a request far from every limit costs no round
trip).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Protocol

from actors.base.config import Config
from actors.base.errors import Cancelled
from actors.inference.types import InferError, InferErrorKind
from actors.log.file import SessionLog
from actors.log.records import (
    Assistant,
    Baseline,
    Compaction,
    Record,
    Rewind,
    ToolResult,
    Usage,
    User,
)
from actors.session.limits import shown_usage
from actors.session.messages import Message, View, message_text, render, view
from actors.session.messages import messages as render_messages

__all__ = ["PER_MESSAGE", "Counts", "Prompt", "Renderer"]

PER_MESSAGE = 6  # tokens a chat template adds around one message (role, end), about
_CHARS_PER_TOKEN = 3  # the estimate when the server cannot count (a high one: safe)


class Counts(Protocol):
    """The model as the renderer needs it: the slot's context and the server's counts."""

    def context(self, session: str) -> int: ...  # the slot's n_ctx in tokens; 0: unknown

    def tokens(self, session: str, text: str) -> int: ...  # /tokenize; InferError: unknown


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """The next request as loopd sees it: records, view, messages, tokens."""

    records: tuple[Record, ...]  # the log's, and the pending User record (if any) after them
    shown: View
    messages: list[Message]
    tokens: int
    pending: int  # tokens of the pending message (0: none)
    ends: list[int]  # ends[i]: the messages rendered once records[i] was read


class Renderer:
    """One session's requests, rendered and counted, for one turn (or one compaction)."""

    def __init__(self, log: SessionLog, config: Config, model: Counts) -> None:
        self.log, self.model = log, model
        self.style = config.session.tool_results
        self._counted: dict[str, int] = {}
        # the last rendering: the log's records then, the pending message, its messages
        self._rendered: tuple[int, str | None, list[Message]] | None = None
        self._usage: tuple[int, Usage | None] | None = None  # see shown_usage

    def prompt(self, pending: str | None, *, exact: bool = True) -> Prompt:
        """The next request's records, view, messages and size in tokens; ``pending``: the
        turn's message, not logged yet."""
        records = self.log.records + ((User(content=pending),) if pending is not None else ())
        shown = view(records)
        ends: list[int] = []
        messages = render(self.log.baseline, records, shown, results=self.style, ends=ends)
        self._rendered = (len(self.log.records), pending, messages)
        previous = self.shown_usage(records, shown)
        if previous is None:
            tokens = self.baseline_tokens(exact) + self.messages_tokens(messages[1:], exact)
        else:
            at = max(i for i, r in enumerate(records) if r is previous)
            if any(isinstance(r, Compaction | Rewind) for r in records[at + 1 :]):
                then = len(render(self.log.baseline, records[: at + 1],
                                  view(records[: at + 1]), results=self.style))
            else:  # the view of records[: at + 1] is the prefix of this one: so are its messages
                then = ends[at]
            tokens = (previous.prompt_tokens + previous.completion_tokens
                      + self.messages_tokens(messages[then:], exact))
        return Prompt(records, shown, messages, tokens, self.pending_tokens(pending, exact), ends)

    def messages_for(self, records: Sequence[Record]) -> list[Message]:
        """The request's messages: those :meth:`prompt` last rendered when they were of these
        ``records`` (its pending message since logged counts as the same), else rendered now."""
        if self._rendered is not None:
            logged, pending, messages = self._rendered
            if pending is None and len(records) == logged:
                return messages
            if (pending is not None and len(records) == logged + 1
                    and isinstance(last := records[-1], User) and last.content == pending):
                return messages
        return render_messages(self.log.baseline, records, results=self.style)

    def shown_usage(
        self, records: Sequence[Record] | None = None, shown: View | None = None
    ) -> Usage | None:
        """:func:`~actors.session.limits.shown_usage` of the log as it is now, worked out
        once a request: when its prompt is measured, and not again when its answer is
        logged. ``records`` and ``shown``: the log's records (and maybe the pending User
        record) and their view, when the caller has them."""
        log = self.log.records
        if self._usage is not None:
            seen, usage = self._usage
            if len(log) == seen or (len(log) == seen + 1 and type(log[-1]) is User):
                self._usage = (len(log), usage)
                return usage
        usage = shown_usage(log if records is None else records, shown)
        self._usage = (len(log), usage)
        return usage

    def sizes(self, prompt: Prompt) -> dict[int, int]:
        """Tokens of each live record's messages (those it adds to the rendering)."""
        sizes: dict[int, int] = {}
        done = 1
        for i in prompt.shown.live:
            if not isinstance(prompt.records[i], User | Assistant | ToolResult):
                continue
            upto = render(self.log.baseline, prompt.records, prompt.shown.before(i + 1),
                          results=self.style)
            sizes[i] = self.messages_tokens(upto[done:])
            done = len(upto)
        return sizes

    # --- counting ----------------------------------------------------------------------

    def baseline_tokens(self, exact: bool = True) -> int:
        """Tokens of the system prompt and the tools."""
        baseline = self.log.baseline
        return (self.tokens(baseline.system, exact)
                + self.tokens(_tools_text(baseline), exact) + PER_MESSAGE)

    def pending_tokens(self, pending: str | None, exact: bool = True) -> int:
        return self.tokens(pending, exact) + PER_MESSAGE if pending is not None else 0

    def messages_tokens(self, messages: Sequence[Message], exact: bool = True) -> int:
        return sum(self.tokens(message_text(m), exact) + PER_MESSAGE for m in messages)

    def tokens(self, text: str, exact: bool = True) -> int:
        """Tokens of ``text``: the server's count (its ``/tokenize``, an estimate when it
        cannot say); not ``exact``, at most its UTF-8 bytes and one (a token holds a byte or
        more; one for the space a tokenizer may put before a text)."""
        if not text:
            return 0
        if not exact:
            return len(text.encode()) + 1
        found = self._counted.get(text)
        if found is None:
            try:
                found = self.model.tokens(self.log.name, text)
            except InferError as e:
                if e.kind is InferErrorKind.CANCELLED:
                    raise Cancelled() from e
                found = len(text) // _CHARS_PER_TOKEN + 1
            self._counted[text] = found
        return found


_TOOLS_TEXT: dict[int, tuple[Baseline, str]] = {}  # id(baseline) -> (it, its tools' text)


def _tools_text(baseline: Baseline) -> str:
    """The tools of ``baseline`` as the text counted for them, made once per baseline: a
    request counts them once or twice (every request's check, the compactor's), and dumping
    even the meta-tools alone took ~40 us each time. A log's baseline never changes."""
    found = _TOOLS_TEXT.get(id(baseline))
    if found is not None and found[0] is baseline:
        return found[1]
    text = json.dumps(list(baseline.tools))
    if len(_TOOLS_TEXT) >= 64:  # sessions come and go: keep the last ones' only
        _TOOLS_TEXT.clear()
    _TOOLS_TEXT[id(baseline)] = (baseline, text)
    return text
