"""The ``chat`` span of one model request (GenAI semantic conventions), for the inference
handle; off, one shared no-op (:data:`OFF`) that hands the sink and the completion back."""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from actors.base import telemetry
from actors.base.events import Content, Event, Queued, Reasoning, Sink, ToolCallDelta
from actors.inference.types import ChatRequest, Completion
from actors.log.records import SlotUse

__all__ = ["OFF", "Chat", "chat", "kv_restore", "kv_save"]

PROVIDER = "llama.cpp"  # gen_ai.provider.name: llama-server's


class Chat:
    """A request's span: the first token's time, then what the answer cost."""

    def __init__(self, span: telemetry.Span, started: float) -> None:
        self.span, self.started, self.first = span, started, 0.0
        self.metric: dict[str, telemetry.Value] = {}  # the metrics' attributes
        self.content = False  # message content on the span (the capture setting)

    def watch(self, sink: Sink) -> Sink:
        """``sink``, noting when the first token (answer, reasoning or call) arrives. Once
        it has, an event costs one closure-cell test on its way (every streamed token)."""
        waiting = True

        def noting(event: Event) -> None:
            nonlocal waiting
            if waiting:
                if isinstance(event, Queued):  # waiting for a slot or an actor
                    self.span.event("loopd.queued", {"loopd.waiting_for": event.waiting_for,
                                                     "loopd.ahead": event.ahead})
                elif isinstance(event, Content | Reasoning | ToolCallDelta):
                    waiting, self.first = False, time.monotonic()
                    ms = round((self.first - self.started) * 1000, 3)
                    self.span.set("loopd.time_to_first_token_ms", ms)
                    self.span.event("gen_ai.first_token",
                                    {"loopd.time_to_first_token_ms": ms})
            sink(event)
        return noting

    def done(self, completion: Completion, server: str) -> Completion:
        """The span's answer attributes (the conventions' names, loopd's own under loopd.),
        set in one call; the metrics' measurements."""
        host, port = _where(server)
        given, made = completion.prompt_tokens, completion.completion_tokens
        put: dict[str, telemetry.Value] = {
            "server.address": host,
            "gen_ai.usage.input_tokens": given,
            "gen_ai.usage.output_tokens": made,
            "gen_ai.response.finish_reasons": [completion.finish_reason],
            "loopd.reasoning_tokens": completion.reasoning_tokens,
        }
        if port:
            put["server.port"] = port
        cached = completion.timings.get("cache_n")
        if isinstance(cached, int):
            put["gen_ai.usage.cache_read.input_tokens"] = cached
        if completion.cut is not None:
            put["loopd.cut"] = completion.cut.why
        if completion.slot is not None:
            put["loopd.slot.id"] = completion.slot.slot
            put["loopd.slot.state"] = completion.slot.state.value
            if completion.slot.restored:
                put["loopd.kv.restored_tokens"] = completion.slot.restored
                put["loopd.kv.restore_ms"] = completion.slot.restore_ms
        if self.content:
            put["gen_ai.output.messages"] = _output(completion)
        self.span.set_all(put)
        measured: dict[str, telemetry.Value] = {**self.metric, "server.address": host}
        telemetry.record("gen_ai.client.operation.duration", time.monotonic() - self.started,
                         measured)
        telemetry.record("gen_ai.client.token.usage", given,
                         {**measured, "gen_ai.token.type": "input"})
        telemetry.record("gen_ai.client.token.usage", made,
                         {**measured, "gen_ai.token.type": "output"})
        return completion

    def __enter__(self) -> Chat:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Off(Chat):
    def watch(self, sink: Sink) -> Sink:
        return sink

    def done(self, completion: Completion, server: str) -> Completion:
        return completion


OFF = _Off(telemetry.OFF, 0.0)


class _On(Chat):
    def __init__(self, request: ChatRequest, model: str) -> None:
        attributes: dict[str, telemetry.Value] = {
            "gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
            "gen_ai.request.model": model, "gen_ai.conversation.id": request.session,
        }
        if request.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = request.max_tokens
        for key in ("temperature", "seed"):
            if isinstance(request.sampling.get(key), int | float):
                attributes[f"gen_ai.request.{key}"] = request.sampling[key]
        content = telemetry.capture_content()
        if content:
            attributes["gen_ai.input.messages"] = json.dumps(request.messages, default=str)
        self._cm = telemetry.span(f"chat {model}", attributes, kind="client")
        super().__init__(telemetry.OFF, time.monotonic())
        self.content = content
        self.metric = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": PROVIDER,
                       "gen_ai.request.model": model}

    def __enter__(self) -> Chat:
        self.span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


@functools.lru_cache(maxsize=64)
def _where(server: str) -> tuple[str, int | None]:
    """``server``'s host and port (parsed once per server, not per request)."""
    where = urlsplit(server)
    return where.hostname or server, where.port


def chat(request: ChatRequest, model: str) -> Chat:
    """The ``chat {model}`` span of ``request`` (a context manager), or :data:`OFF`."""
    return _On(request, model) if telemetry.enabled() else OFF


def kv_restore(restore: Callable[..., SlotUse]) -> Callable[..., SlotUse]:
    """``loopd.kv_restore`` around the slot keeper's restore of a session's KV state (a
    child of the request's ``chat``): tokens, ms, or why nothing was restored."""

    @functools.wraps(restore)
    def traced(keeper: Any, target: int, index: int, session: Any, note: str) -> SlotUse:
        if not telemetry.enabled():
            return restore(keeper, target, index, session, note)
        with telemetry.span("loopd.kv_restore", {"gen_ai.conversation.id": session.name,
                                                 "loopd.slot.id": index}) as span:
            use = restore(keeper, target, index, session, note)
            span.set("loopd.slot.state", use.state.value)
            span.set("loopd.kv.restored_tokens", use.restored)
            span.set("loopd.kv.restore_ms", use.restore_ms)
            if use.reason:
                span.set("loopd.kv.reason", use.reason)
            return use

    return traced


def kv_save(save: Callable[..., bool]) -> Callable[..., bool]:
    """``loopd.kv_save`` around the slot keeper's save of a slot (after a turn, in its
    saver thread: a span of its own, the session named); the keeper adds tokens and bytes."""

    @functools.wraps(save)
    def traced(keeper: Any, target: int, index: int, key: str) -> bool:
        if not telemetry.enabled():
            return save(keeper, target, index, key)
        with telemetry.span("loopd.kv_save", {"loopd.slot.id": index}) as span:
            ok = save(keeper, target, index, key)
            span.set("loopd.kv.saved", ok)
            return ok

    return traced


def _output(completion: Completion) -> str:
    parts: list[dict[str, Any]] = []
    if completion.content:
        parts.append({"type": "text", "content": completion.content})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
              for c in completion.tool_calls]
    return json.dumps([{"role": "assistant", "parts": parts,
                        "finish_reason": completion.finish_reason}], default=str)
