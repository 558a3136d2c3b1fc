"""Compaction as a step of the turn, and by hand (docs/rendering.md#compaction).

:class:`Compactor` decides *when* and writes the record; what is kept and the elided
summary are :mod:`actors.session.compaction`'s pure parts. Three ways in:

- :meth:`Compactor.make_room`, before each request of a turn: the next prompt's size is the
  last request's (its Usage: prompt and generated tokens, the slot holds them) plus the
  server's ``/tokenize`` count of what is new (the first request of an epoch counts it all);
  a request that fits by an upper bound of those counts (UTF-8 bytes) asks the server nothing.
  It asks the turn's renderer (:mod:`actors.session.render`) for the prompt and its size:
  the messages rendered to count a request are the ones it sends.
  Past the threshold (``session.compact_at`` of the slot's context, raised where the
  baseline leaves no room for a few turns: :func:`~actors.session.compaction.threshold`) it
  compacts (``auto``), except right after a request that did, unless the context is full.
  That threshold is for a new message; a turn in progress (a call's result in, its answer
  to come) compacts only past :data:`~actors.session.compaction.CEILING` of the context: a
  compaction between a result and its answer sends the answer a context re-rendered around
  the result, and the small model then gave the result's first line as its answer ("The
  website launch moves to 14 June." for "Who will fix the login bug?"); the next message
  compacts at its start instead.
  A new message that alone does not fit the context is refused with SessionFull before it
  is logged.
- :meth:`Compactor.overflowed`, when the server answers that the prompt exceeds its context
  anyway: compacts (``overflow``) or raises SessionFull when nothing can be dropped.
  ``session.compaction = "off"``: neither (SessionFull once the context is full).
- :func:`compact_session`: ``loopd compact``, ``/compact``, the daemon's ``compact``.

A turn refused for a full context once its message is logged (the server still says it is
full after compacting, or nothing could be dropped) is taken back (:meth:`Compactor.taking_back`):
a Rewind to the turn before it, ``refused`` saying why. Its message and calls stay in the log
but are never sent again, so a later request (after a larger context, say) does not answer a
message typed while the conversation was full.

The summary (``session.compaction``): ``summary`` asks the model on the warm slot: the live
prompt (which the slot holds) plus :data:`SUMMARY_REQUEST`, thinking off, plain text under
constrained calls, at most ``session.summary_tokens`` (and a tenth of the context); no
Usage record is written for it (it is not a request of the conversation): its tokens are
on the Compacted event. When that
fails or says nothing, ``elide`` (no model call) writes it. The Compaction record is
appended only once the summary is ready: a crash before it loses only the summary, and the
next request compacts again.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.errors import Cancelled, SessionError, SessionFull, UsageError
from actors.base.events import Compacted, Compacting, Event, Progress, Queued, Retrying, Waiting
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind
from actors.log.file import SessionLog
from actors.log.records import (
    Assistant,
    Compaction,
    CompactionBy,
    Rewind,
    ToolResult,
    Usage,
    User,
)
from actors.session import traced
from actors.session.compaction import (
    CEILING,
    SUMMARY_REQUEST,
    Choice,
    choose_kept,
    elide,
    outside,
    summary_budget,
    summary_words,
    threshold,
)
from actors.session.messages import OUTSIDE_FRAME, SUMMARY_FRAME
from actors.session.render import PER_MESSAGE, Counts, Prompt, Renderer
from actors.session.smallmodel.decision_word import strip_word
from actors.session.smallmodel.grammar import cached_grammar

__all__ = ["Compactor", "Model", "compact_session"]

_PASSED_ON = (Queued, Waiting, Progress, Retrying)  # of the summary request, to the person


class Model(Counts, Protocol):
    """The model as a compaction needs it: the renderer's counts, and the summary asked."""

    def complete(
        self, request: ChatRequest, sink: Callable[[Event], None], cancel: CancelToken
    ) -> Completion: ...


class Compactor:
    """One session's compactions, for one turn (or one compaction by hand)."""

    def __init__(self, log: SessionLog, config: Config, model: Model,
                 emit: Callable[[Event], None], cancel: CancelToken,
                 renderer: Renderer | None = None) -> None:
        self.log, self.config, self.model, self.emit, self.cancel = log, config, model, emit, cancel
        self.settings = config.session
        self.renderer = renderer or Renderer(log, config, model)  # the turn's, in a turn
        self.budget = self.settings.summary_tokens  # the summary's tokens, at most
        self.made = 0  # compactions appended
        self._cost = (0, 0)  # the summary request's prompt tokens processed, tokens written

    # --- when --------------------------------------------------------------------------

    def make_room(self, pending: str | None = None) -> None:
        """Before a request: compact when it would pass the threshold;
        ``pending``, the turn's message not logged yet: SessionFull when it cannot fit."""
        n_ctx = self.model.context(self.log.name)
        if n_ctx <= 0:
            return  # not known: only the server's answer can say (overflowed)
        if self._fits(pending, n_ctx, exact=False):
            return  # far from both limits: the server was asked nothing
        prompt = self.renderer.prompt(pending)
        alone = self.renderer.baseline_tokens() + prompt.pending
        if alone > n_ctx:
            raise SessionFull(alone, n_ctx, message="not sent")
        if self.settings.compaction == "off":
            return
        limit = self._threshold(prompt, n_ctx, self._turn(prompt))
        if pending is None:  # a turn in progress finishes in the room up to the ceiling
            limit = max(limit, int(CEILING * n_ctx))  # (between a result and its answer)
        if prompt.tokens > limit and not (_fresh(prompt) and prompt.tokens <= n_ctx):
            self.compact(CompactionBy.AUTO, prompt.tokens, pending, n_ctx=n_ctx)

    def _fits(self, pending: str | None, n_ctx: int, *, exact: bool) -> bool:
        """Whether the next request passes neither limit of :meth:`make_room`. Not ``exact``:
        by an upper bound of every count that asks the server nothing, so a
        request that fits by it fits by the server's counts too, and each request of a turn
        far from the limits costs no ``/tokenize`` round trips."""
        prompt = self.renderer.prompt(pending, exact=exact)
        alone = self.renderer.baseline_tokens(exact) + prompt.pending
        return alone <= n_ctx and (self.settings.compaction == "off"  # the threshold's floor:
                                   or prompt.tokens <= self.settings.compact_at * n_ctx)

    def overflowed(self, error: InferError, compact: bool = True) -> None:
        """The server said the prompt exceeds its context: compact (when ``compact``: once
        per request), or SessionFull."""
        body = error.error_body()
        tokens, n_ctx = _count(body.get("n_prompt_tokens")), _count(body.get("n_ctx"))
        if (not compact or self.settings.compaction == "off"
                or not self.compact(CompactionBy.OVERFLOW, tokens, None, n_ctx=n_ctx)):
            raise SessionFull(tokens or "?", n_ctx or "?") from error

    @contextlib.contextmanager
    def taking_back(self) -> Iterator[None]:
        """Around a turn whose message is logged: SessionFull out of it takes the turn back
        (a Rewind to the turn before it, saying why) and says so."""
        try:
            yield
        except SessionFull as full:
            asked = sum(isinstance(r, User) for r in self.log.records)  # this turn's is last
            with contextlib.suppress(SessionError):  # the failed append already said so
                self.log.append(Rewind(to_turn=max(asked - 1, 0), refused=full.detail))
            raise SessionFull(full.prompt_tokens, full.n_ctx, message="taken back") from full

    # --- how ---------------------------------------------------------------------------

    @traced.compaction
    def compact(self, by: CompactionBy, tokens_before: int, pending: str | None = None, *,
                n_ctx: int = 0) -> Compacted | None:
        """Append a Compaction of the conversation; None when nothing can be dropped."""
        prompt = self.renderer.prompt(None)
        tokens_before = tokens_before or prompt.tokens
        n_ctx = n_ctx or self.model.context(self.log.name) or tokens_before
        sizes = self.renderer.sizes(prompt)
        records, shown = prompt.records, prompt.shown
        previous = records[shown.epoch] if shown.epoch else None
        framed = OUTSIDE_FRAME if outside(records, shown.live, previous) else SUMMARY_FRAME
        frame = self.renderer.tokens(framed.format(summary="")) + 2 * PER_MESSAGE
        budget = self.budget = summary_budget(self.settings.summary_tokens, n_ctx)
        asked = self.renderer.pending_tokens(pending)
        limit = self._threshold(prompt, n_ctx, max(asked, self._turn(prompt)))
        fixed = self.renderer.baseline_tokens() + asked + frame + budget
        room = limit - fixed
        # The kept turns take at most half the room, so the turns after a compaction have
        # the other half: where the baseline is much of a small context, compact_keep alone
        # would fill what a compaction frees and the next turn would compact again.
        choice = choose_kept(prompt.records, prompt.shown, sizes, room=room,
                             keep=min(int(self.settings.compact_keep * n_ctx), room // 2),
                             pending=pending is not None)
        if choice is None:  # the turn in progress alone passes the threshold (a long read in a
            # small context): kept when it fits halfway to the context, the rest for the answer
            wide = (limit + n_ctx) // 2 - fixed
            choice = choose_kept(prompt.records, prompt.shown, sizes, room=wide, keep=0,
                                 pending=pending is not None) if wide > room else None
        if choice is None:
            return None
        started = time.monotonic()
        how = "summary" if self.settings.compaction == "summary" else "elide"  # off: by hand
        self.emit(Compacting(why=by.value, tokens_before=tokens_before, how=how))
        self._cost = (0, 0)
        summary = self._summary(prompt, choice, how)
        marked = outside(records, [i for i in shown.live if i < choice.kept], previous)
        kept = sum(n for i, n in sizes.items() if i >= choice.kept)
        after = self.renderer.baseline_tokens() + frame + self.renderer.tokens(summary) + kept
        self.log.append(Compaction(summary=summary, kept=choice.kept, tokens_after=after,
                                   tokens_before=tokens_before, by=by, outside=marked))
        self.made += 1
        done = Compacted(
            why=by.value, tokens_before=tokens_before, turns_kept=choice.turns,
            tokens_after=after,
            ms=round((time.monotonic() - started) * 1000, 1),
            processed=self._cost[0], generated=self._cost[1],
        )
        self.emit(done)
        return done

    def _summary(self, prompt: Prompt, choice: Choice, how: str) -> str:
        records = prompt.records
        dropped = [i for i in prompt.shown.live if i < choice.kept
                   and isinstance(records[i], User | Assistant | ToolResult)]
        if how == "summary":
            written = self._written(prompt)
            if written:
                return written
        cap = self.budget * 4  # characters: about 4 a token in prose, fewer in figures
        summary = elide(records, dropped, prompt.shown.summary, cap)
        while (counted := self.renderer.tokens(summary)) > self.budget and cap > 200:
            cap = cap * self.budget // counted - 20  # held to its tokens, which the room counts
            summary = elide(records, dropped, prompt.shown.summary, cap)
        return summary

    def _written(self, prompt: Prompt) -> str:
        """The model's summary, asked on the warm slot; "" when it could not write one."""
        baseline, inference = self.log.baseline, self.config.inference
        grammar = (cached_grammar(baseline.tools, [], calls=False, text=True)
                   if inference.constrained_calls else None)
        ask = {"role": "user", "content": SUMMARY_REQUEST.format(
            words=summary_words(self.budget))}
        sampling = {k: v for k, v in (("temperature", inference.temperature),
                                      ("seed", inference.seed)) if v >= 0}
        request = ChatRequest(
            session=self.log.name, messages=(*prompt.messages, ask), tools=baseline.tools,
            thinking=False, max_tokens=self.budget, thinking_budget=0,
            sampling=sampling, grammar=grammar,
        )
        try:
            completion = self.model.complete(request, self._pass_on, self.cancel)
        except InferError as e:
            if e.kind is InferErrorKind.CANCELLED:
                raise Cancelled() from e
            return ""  # the context is full, the server failed: elide instead
        if self.cancel.cancelled:
            raise Cancelled()
        n = completion.timings.get("prompt_n")
        self._cost = (int(n) if isinstance(n, int | float) else completion.prompt_tokens,
                      completion.completion_tokens)
        text = strip_word(completion.content) if grammar is not None else completion.content
        return (text or "").strip()

    def _pass_on(self, event: Event) -> None:
        if isinstance(event, _PASSED_ON):
            self.emit(event)

    # --- counting ----------------------------------------------------------------------

    def _threshold(self, prompt: Prompt, n_ctx: int, turn: int) -> int:
        """:func:`~actors.session.compaction.threshold` for this session: its baseline, the
        summary's frame and budget, and ``turn`` (tokens of the turn in progress)."""
        fixed = (self.renderer.baseline_tokens() + self._frame()
                 + summary_budget(self.settings.summary_tokens, n_ctx))
        return threshold(n_ctx, self.settings.compact_at, fixed, turn)

    def _turn(self, prompt: Prompt) -> int:
        """Tokens of a turn as ``prompt`` sends them: the larger of the last two (the one in
        progress, or the pending message, and the whole one before it)."""
        records, ends = prompt.records, prompt.ends
        starts = [i for i in prompt.shown.live if isinstance(records[i], User)][-2:]
        bounds = [ends[i - 1] if i > 0 else 1 for i in starts] + [len(prompt.messages)]
        count = self.renderer.messages_tokens
        return max((count(prompt.messages[a:b]) for a, b in itertools.pairwise(bounds)),
                   default=count(prompt.messages[1:]))

    def _frame(self) -> int:
        """Tokens of a summary's frame (the longer one: either may come)."""
        frames = (SUMMARY_FRAME, OUTSIDE_FRAME)
        return max(self.renderer.tokens(f.format(summary="")) for f in frames) + 2 * PER_MESSAGE


def compact_session(log: SessionLog, config: Config, model: Model,
                    emit: Callable[[Event], None], cancel: CancelToken | None = None
                    ) -> Compacted:
    """Compact session ``log`` now (``by`` person); UsageError when nothing can be dropped."""
    done = Compactor(log, config, model, emit, cancel or CancelToken()).compact(
        CompactionBy.PERSON, 0)
    if done is None:
        raise UsageError(f"session {log.name}: nothing to compact (the conversation is its "
                         "last turn, or empty)")
    return done


def _fresh(prompt: Prompt) -> bool:
    """Whether the request before this one was the first of its epoch (it compacted): one
    Usage since the Compaction in effect. Compacting again at once frees little more and
    loses what that compaction kept (a file just read), so only the context itself, not
    ``compact_at``, may make this request compact (the threshold leaves room for a turn
    after a compaction, so this only holds back one turn larger than that room)."""
    epoch = prompt.shown.epoch
    return epoch > 0 and sum(isinstance(prompt.records[i], Usage)
                             for i in prompt.shown.live if i > epoch) == 1


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

