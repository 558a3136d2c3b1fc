"""One turn: a user message in, an answer out, tool calls in between, and its limits.

docs/turn.md tells it step by step, with every limit and where it lives. It runs inside
the session actor's thread: the session actor is the only writer of the log and the only
judge of every limit. The model and the tools are reached through handles that ask their
own actors (the inference actor, the tool ports); their events go straight to
``on_event`` while this thread waits.

The limits decided here, and where:
  tool iterations   -> ``agents.Tree``, the turn's and its agents' (loop.tool_iterations, turn_*)
  calls per response -> ``_ask_model``, before the response is logged
                       (loop.max_calls_per_response)
  repeated call     -> ``_run_tool`` with ``limits.Repeats`` (loop.repeat_detection)
  thinking cap      -> ``thinking_budget`` given to the inference actor, counted down here
  runaway text      -> ``runaway_*`` given to the inference actor (loop.runaway_*_tokens)
  context full      -> ``compactor.Compactor``: compacts, else SessionFull (taken back)
  tool result size  -> ``cap_result``         (loop.tool_result_cap)
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from actors.approval.gate import Gate
from actors.approval.rulesfile import RuleStore
from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.errors import Cancelled, SessionError, TurnLimit
from actors.base.events import (
    Approver,
    CacheLossEvent,
    Event,
    ToolCallDelta,
    ToolCallStarted,
    ToolResultEvent,
)
from actors.inference.types import (
    CUT,
    ChatRequest,
    Completion,
    InferError,
    InferErrorKind,
    is_context_full,
)
from actors.log.file import SessionLog
from actors.log.records import SlotState, SlotUse, ToolCall, ToolResult, Usage, User
from actors.service.types import TurnOutcome
from actors.session import compactor, traced
from actors.session.agents import Tree, TurnAgents
from actors.session.frame_words import FrameFilter, compacted
from actors.session.limits import (
    REPEAT_NOTICE,
    TOO_MANY_CALLS,
    Answered,
    Repeats,
    answer_text,
    cache_outcome,
    cap_result,
    passages,
)
from actors.session.render import Renderer
from actors.session.smallmodel.bare_json import bare_call
from actors.session.smallmodel.decision_word import WordFilter, strip_word
from actors.session.smallmodel.grammar import cached_grammar
from actors.session.smallmodel.step_rules import next_step
from actors.tools.registry import Local, Registry, dispatch

__all__ = ["Runtime", "TurnOutcome", "run_turn"]

class Model(compactor.Model, Protocol):  # complete, context, tokens (the renderer's), and
    def turn_ended(self, session: str) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Runtime:
    """What a turn needs besides its session: config, the model, the tools, the rules."""
    config: Config
    inference: Model
    registry: Registry
    # The rules file and the command's --approve rules (tools.allow/deny come from config).
    rules: RuleStore = dataclasses.field(default_factory=RuleStore)
    hidden: tuple[str, ...] = ()  # loopd's own places, which the file tools refuse (toolbox's)
    traceparent: str = ""  # the caller's span (a daemon client's): the turn's is its child
    tree: Tree | None = None  # an agent's turn: its parent's budget (actors.session.agents)


def run_turn(
    session: SessionLog,
    runtime: Runtime,
    content: str,
    on_event: Callable[[Event], None],
    cancel: CancelToken | None = None,
    approver: Approver | None = None,
) -> TurnOutcome:
    """Run one turn to its answer; every record is appended here.

    ``approver`` answers the calls that wait for the person (its contract is in
    :mod:`actors.approval.gate`); without one they are denied unless a rule allows them.
    A turn that ends without an answer raises a :class:`~actors.base.errors.LoopdError`:
    TurnLimit or SessionFull (a limit), InferError (the server), SessionError (the log),
    Cancelled (also while waiting for approval: the call does not run). The log stays valid
    and the next turn works.
    """
    log, cancel = session, cancel or CancelToken()
    try:
        with TurnAgents(log, runtime, cancel, on_event, approver) as agents:
            return _Turn(log, runtime, on_event, agents, approver).run(content)
    finally:
        runtime.inference.turn_ended(log.name)  # its KV state may be saved now
        if runtime.config.log.fsync == "turn":
            with contextlib.suppress(SessionError):  # the failed append already said so
                log.sync()


class _Turn:
    def __init__(
        self, log: SessionLog, runtime: Runtime, on_event: Callable[[Event], None],
        agents: TurnAgents, approver: Approver | None,
    ) -> None:
        self.log, self.runtime, self.emit, self.agents = log, runtime, on_event, agents
        self.cancel = cancel = agents.cancel  # the tree's: the person's, a spent budget
        self.gate = Gate(
            tools=runtime.config.tools, store=runtime.rules, records=lambda: log.records,
            append=log.append, emit=on_event, approver=approver, cancel=cancel,
        )
        self.loop = runtime.config.loop
        self.thinking_left = self.loop.thinking_cap
        self.iterations = self.tool_calls = 0
        self.repeats = Repeats()
        self.restored: SlotUse | None = None
        self.renderer = Renderer(log, runtime.config, runtime.inference)  # and the compactor's
        self.compactor = compactor.Compactor(log, runtime.config, runtime.inference, on_event,
                                             cancel, self.renderer)
        self.question = ""  # the user's message this turn answers
        self.echoes: tuple[str, ...] = ()  # passages earlier answers copied (limits.passages)
        inference = runtime.config.inference
        self.sampling = {k: v for k, v in (("temperature", inference.temperature),
                                           ("seed", inference.seed)) if v >= 0}

    @traced.turn  # invoke_agent
    def run(self, content: str) -> TurnOutcome:
        self.question = content
        self.echoes = passages(self.log.records, content, self.loop.runaway_echo_tokens)
        self.compactor.make_room(content)  # SessionFull here logs nothing
        self.log.append(User(content=content))
        with self.compactor.taking_back():  # SessionFull from here takes the turn back
            while True:
                completion, usage = self._ask_model()
                cut = completion.finish_reason in CUT  # an answer cut is the turn's answer
                if not completion.tool_calls or cut:
                    return TurnOutcome(
                        content=completion.content or "", usage=usage, cut=cut,
                        iterations=self.iterations, tool_calls=self.tool_calls,
                        restored=self.restored, compactions=self.compactor.made)
                self.agents.tree.iteration()
                self.iterations += 1
                self.agents.start(completion.tool_calls)  # its agent calls, all at once
                for call in completion.tool_calls:
                    self._run_tool(call)

    def _ask_model(self) -> tuple[Completion, Usage]:
        """One model response: asked, read as loopd takes it, checked, logged in one write."""
        if self.iterations:
            self.compactor.make_room()
        grammar = self._grammar(self.log.baseline.tools)
        frames = FrameFilter(self._pass_on, lambda: compacted(self.log.records))  # its wording
        sink = WordFilter(frames, word=grammar is not None,
                          bare=self.runtime.config.inference.bare_json_tool_calls)
        completion = self._complete(grammar, sink)
        if grammar is not None:  # the grammar's decision word is loopd's, not the answer's
            completion = dataclasses.replace(completion, content=strip_word(completion.content))
        completion = self._bare_json(completion)
        if completion.content is not None:
            sink.flush()  # text held back as a possible bare call was not one: shown now
            completion = dataclasses.replace(completion, content=frames.answer(completion.content))
        if len(completion.tool_calls) > self.loop.max_calls_per_response:
            raise TurnLimit("calls per response", TOO_MANY_CALLS.format(
                count=len(completion.tool_calls), cap=self.loop.max_calls_per_response))
        if completion.slot is not None and completion.slot.state is SlotState.RESTORED:
            self.restored = self.restored or completion.slot
        self.thinking_left -= completion.reasoning_tokens
        usage = self._record(completion, self.renderer.shown_usage())
        self.agents.tree.generated(usage)
        return completion, usage

    def _request(self, grammar: str | None) -> ChatRequest:
        shown = self.renderer.messages_for(self.log.records)  # make_room rendered them
        return ChatRequest(
            session=self.log.name, messages=tuple(shown), tools=self.log.baseline.tools,
            thinking=self.thinking_left > 0, max_tokens=self.loop.max_tokens,
            thinking_budget=max(self.thinking_left, 0), sampling=self.sampling, grammar=grammar,
            runaway_repeat=self.loop.runaway_repeat_tokens, echoes=self.echoes,
            runaway_copy=self.loop.runaway_copy_tokens, runaway_echo=self.loop.runaway_echo_tokens)

    def _complete(self, grammar: str | None, sink: WordFilter, again: bool = True) -> Completion:
        """The model's response; the server's failures as the turn's (cancelled, full: the
        conversation compacted and asked once more, else SessionFull)."""
        try:
            completion = self.runtime.inference.complete(self._request(grammar), sink,
                                                          self.cancel)
        except InferError as e:
            if e.kind is InferErrorKind.CANCELLED:
                raise Cancelled() from e
            if is_context_full(e):
                self.compactor.overflowed(e, again)
                return self._complete(grammar, sink, again=False)
            raise
        if self.cancel.cancelled:
            raise Cancelled()
        return completion

    def _record(self, completion: Completion, previous: Usage | None) -> Usage:
        """The response, its usage, what loopd cut of it and a lost cache's loss, logged."""
        assistant, usage = completion.assistant(), completion.usage_record()
        loss = cache_outcome(previous.timings if previous else None, completion.timings,
                             completion.slot, completion.baseline)
        self.log.append(assistant, usage, *(r for r in (completion.cut, loss) if r))  # one write
        self.emit(completion.used())
        if loss is not None:
            self.emit(CacheLossEvent(expected=loss.expected, got=loss.got, cause=loss.cause))
        return usage

    def _grammar(self, offered: tuple[Any, ...]) -> str | None:
        """The next response's grammar (:func:`actors.session.smallmodel.step_rules.next_step`):
        what this step may say, built once per set of tools and holds."""
        if not self.runtime.config.inference.constrained_calls:
            return None
        specs = self.runtime.registry.specs()
        step = next_step(self.question, self.iterations, self.runtime.config, specs, offered,
                         self.log.records, self.runtime.hidden)
        return cached_grammar(offered, [(s.name, s.parameters) for s in specs if step.calls],
                              calls=step.calls, text=step.text, exclude=step.exclude,
                              values=step.values, value=step.value)

    def _pass_on(self, event: Event) -> None:
        if not isinstance(event, ToolCallDelta):
            self.emit(event)

    def _bare_json(self, completion: Completion) -> Completion:
        """A small model's tool call written as bare JSON in the answer, taken as the call."""
        if not self.runtime.config.inference.bare_json_tool_calls or completion.tool_calls:
            return completion
        offered = [t["function"]["name"] for t in self.log.baseline.tools if "function" in t]
        found = bare_call(completion.content, offered,
                          [spec.name for spec in self.runtime.registry.specs()])
        if found is None:
            return completion
        call = ToolCall(id=f"loopd-{len(self.log.records)}", name=found[0], arguments=found[1])
        return dataclasses.replace(
            completion, content=None, tool_calls=(call,), finish_reason="tool_calls"
        )

    def _run_tool(self, call: ToolCall) -> None:
        if self.cancel.cancelled and not self.agents.spent:  # spent: each call's result says so
            raise Cancelled()
        number = self.log.next_call()
        self.emit(ToolCallStarted(name=call.name, call=number, arguments=call.arguments))
        earlier = self.repeats.seen(call.name, call.arguments) if self.loop.repeat_detection else 0
        if earlier >= 2:
            raise TurnLimit(
                "repeated call", f"{call.name} was called with the same arguments {earlier + 1} "
                "times in this turn (the first repeat was answered with a notice)",
            )
        answered = (Answered(REPEAT_NOTICE.format(name=call.name), outcome="repeat")
                    if earlier == 1 else self._dispatch(call, number))
        if self.cancel.cancelled and not self.agents.spent:  # spent: its result is logged
            raise Cancelled()
        text, truncated = cap_result(answered.text, self.loop.tool_result_cap)
        self.log.append(ToolResult(call=number, tool_call_id=call.id, content=text,
                                   class_=answered.class_, untrusted=answered.untrusted,
                                   truncated=truncated))
        self.tool_calls += 1
        self.emit(ToolResultEvent(name=call.name, call=number, class_=answered.class_.value,
                                  truncated=truncated, outcome=answered.outcome, content=text))

    @traced.tool  # execute_tool
    def _dispatch(self, call: ToolCall, number: int) -> Answered:
        if (answered := self.agents.answer(call)) is not None:  # an agent call: its child's
            return answered
        target = dispatch(self.runtime.registry, call.name, call.arguments)
        if isinstance(target, Local):
            return Answered(target.text, outcome="local")
        port, tool, arguments = target.port, target.tool, target.arguments
        return answer_text(self.gate.run(number, tool, arguments, lambda approved, lands: port.call(
            session=self.log.name, call=number, tool=tool, arguments=arguments, cancel=self.cancel,
            approved=approved, landing=lands, ask=self.gate.asker(number, tool),
        )))
