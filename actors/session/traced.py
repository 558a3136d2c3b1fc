"""The turn's spans (GenAI semantic conventions): ``invoke_agent`` around a turn and
``execute_tool`` around each call, as decorators of the turn's methods so the turn itself
stays as it reads. The model requests' ``chat`` spans are the inference handle's
(:mod:`actors.inference.traced`); the tool port adds the host and carries the trace to it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Protocol, TypeVar, cast

from actors.base import telemetry
from actors.log.records import ToolCall
from actors.service.types import TurnOutcome
from actors.session.limits import Answered

__all__ = ["AGENT", "compaction", "fork", "tool", "turn"]

AGENT = "loopd"  # gen_ai.agent.name


class _Turn(Protocol):
    @property
    def log(self) -> Any: ...

    @property
    def runtime(self) -> Any: ...


T = TypeVar("T", bound=_Turn)
F = TypeVar("F", bound=Callable[..., Any])


def turn(run: Callable[[T, str], TurnOutcome]) -> Callable[[T, str], TurnOutcome]:
    """``invoke_agent loopd`` around a turn: the session, what the turn did, its error."""

    @functools.wraps(run)
    def traced(self: T, content: str) -> TurnOutcome:
        if not telemetry.enabled():
            return run(self, content)
        attributes: dict[str, telemetry.Value] = {
            "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": AGENT,
            "gen_ai.conversation.id": self.log.name,
        }
        if telemetry.capture_content():
            attributes["gen_ai.input.messages"] = _message("user", content)
        parent = self.runtime.traceparent  # the caller's (a daemon client's), else ""
        with telemetry.span(f"invoke_agent {AGENT}", attributes, parent=parent) as span:
            outcome = run(self, content)
            for key, value in (("iterations", outcome.iterations),
                               ("tool_calls", outcome.tool_calls), ("cut", outcome.cut),
                               ("compactions", outcome.compactions)):
                span.set(f"loopd.turn.{key}", value)
            if telemetry.capture_content():
                span.set("gen_ai.output.messages", _message("assistant", outcome.content))
            return outcome

    return traced


def tool(dispatch: Callable[[T, ToolCall, int], Answered]
         ) -> Callable[[T, ToolCall, int], Answered]:
    """``execute_tool {name}`` around a call's dispatch (the approval wait included, an
    event of its own): the call's id, its outcome (result, failed, denied, local)."""

    @functools.wraps(dispatch)
    def traced(self: T, call: ToolCall, number: int) -> Answered:
        if not telemetry.enabled():
            return dispatch(self, call, number)
        attributes: dict[str, telemetry.Value] = {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id, "gen_ai.tool.type": "function",
            "gen_ai.conversation.id": self.log.name, "loopd.tool.call": number,
            "loopd.tool.called_as": call.name,  # call_tool: the port names the tool it runs
        }
        if telemetry.capture_content():
            attributes["gen_ai.tool.call.arguments"] = call.arguments  # the model's JSON
        with telemetry.span(f"execute_tool {call.name}", attributes) as span:
            answered = dispatch(self, call, number)
            span.set("loopd.tool.outcome", answered.outcome)
            if answered.outcome in ("failed", "denied"):
                span.fail(answered.outcome, answered.text)
            if telemetry.capture_content():
                span.set("gen_ai.tool.call.result", answered.text)
            return answered

    return traced


def compaction(compact: F) -> F:
    """``loopd.compaction`` around a compaction (a child of the turn, or of nothing for
    ``loopd compact``): why, the tokens before and after, the turns kept, its cost."""

    @functools.wraps(compact)
    def traced(self: Any, by: Any, tokens_before: int, *args: Any, **kwargs: Any) -> Any:
        if not telemetry.enabled():
            return compact(self, by, tokens_before, *args, **kwargs)
        with telemetry.span("loopd.compaction", {"gen_ai.conversation.id": self.log.name,
                                                 "loopd.compaction.why": by.value}) as span:
            done = compact(self, by, tokens_before, *args, **kwargs)
            if done is None:
                span.set("loopd.compaction.nothing_to_drop", True)
                return done
            for key in ("tokens_before", "tokens_after", "turns_kept", "ms", "processed",
                        "generated"):
                span.set(f"loopd.compaction.{key}", getattr(done, key))
            return done

    return cast(F, traced)


def fork(make: F) -> F:
    """``loopd.fork`` around a fork: the source, the new session, the turns and records
    copied, the KV state's tokens copied (0: none)."""

    @functools.wraps(make)
    def traced(config: Any, src: str, new: str, *args: Any, **kwargs: Any) -> Any:
        if not telemetry.enabled():
            return make(config, src, new, *args, **kwargs)
        with telemetry.span("loopd.fork", {"loopd.fork.source": src,
                                           "gen_ai.conversation.id": new}) as span:
            report = make(config, src, new, *args, **kwargs)
            span.set("loopd.fork.at", report.forked.at)
            span.set("loopd.fork.records", report.records)
            span.set("loopd.fork.state_tokens", report.state.tokens if report.state else 0)
            return report

    return cast(F, traced)


def _message(role: str, text: str) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]}])
