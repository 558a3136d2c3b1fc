"""The ``chat`` span of one model request (GenAI semantic conventions), for the inference
handle; off, one shared no-op (:data:`OFF`) that hands the sink and the completion back."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlsplit

from actors.base import telemetry
from actors.base.events import Content, Event, Reasoning, Sink, ToolCallDelta
from actors.inference.types import ChatRequest, Completion

__all__ = ["OFF", "Chat", "chat"]

PROVIDER = "llama.cpp"  # gen_ai.provider.name: llama-server's


class Chat:
    """A request's span: the first token's time, then what the answer cost."""

    def __init__(self, span: telemetry.Span, started: float) -> None:
        self.span, self.started, self.first = span, started, 0.0

    def watch(self, sink: Sink) -> Sink:
        """``sink``, noting when the first token (answer, reasoning or call) arrives."""
        def noting(event: Event) -> None:
            if not self.first and isinstance(event, Content | Reasoning | ToolCallDelta):
                self.first = time.monotonic()
                ms = round((self.first - self.started) * 1000, 3)
                self.span.set("loopd.time_to_first_token_ms", ms)
                self.span.event("gen_ai.first_token", {"loopd.time_to_first_token_ms": ms})
            sink(event)
        return noting

    def done(self, completion: Completion, server: str) -> Completion:
        """The span's answer attributes (the conventions' names, loopd's own under loopd.)."""
        put, where = self.span.set, urlsplit(server)
        put("server.address", where.hostname or server)
        if where.port:
            put("server.port", where.port)
        put("gen_ai.usage.input_tokens", completion.prompt_tokens)
        put("gen_ai.usage.output_tokens", completion.completion_tokens)
        cached = completion.timings.get("cache_n")
        if isinstance(cached, int):
            put("gen_ai.usage.cache_read.input_tokens", cached)
        put("gen_ai.response.finish_reasons", [completion.finish_reason])
        put("loopd.reasoning_tokens", completion.reasoning_tokens)
        if completion.cut is not None:
            put("loopd.cut", completion.cut.why)
        if completion.slot is not None:
            put("loopd.slot.id", completion.slot.slot)
            put("loopd.slot.state", completion.slot.state.value)
            if completion.slot.restored:
                put("loopd.kv.restored_tokens", completion.slot.restored)
                put("loopd.kv.restore_ms", completion.slot.restore_ms)
        if telemetry.capture_content():
            put("gen_ai.output.messages", _output(completion))
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
        if telemetry.capture_content():
            attributes["gen_ai.input.messages"] = json.dumps(request.messages, default=str)
        self._cm = telemetry.span(f"chat {model}", attributes, kind="client")
        super().__init__(telemetry.OFF, time.monotonic())

    def __enter__(self) -> Chat:
        self.span = self._cm.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._cm.__exit__(*exc)


def chat(request: ChatRequest, model: str) -> Chat:
    """The ``chat {model}`` span of ``request`` (a context manager), or :data:`OFF`."""
    return _On(request, model) if telemetry.enabled() else OFF


def _output(completion: Completion) -> str:
    parts: list[dict[str, Any]] = []
    if completion.content:
        parts.append({"type": "text", "content": completion.content})
    parts += [{"type": "tool_call", "id": c.id, "name": c.name, "arguments": c.arguments}
              for c in completion.tool_calls]
    return json.dumps([{"role": "assistant", "parts": parts,
                        "finish_reason": completion.finish_reason}], default=str)
