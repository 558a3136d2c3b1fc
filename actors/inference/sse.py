"""Turns llama-server's streamed ``data:`` objects into ChatEvents and one assembled answer.

Pure logic, no I/O: the client feeds it the ``data`` of each server-sent event (httpx-sse
has already skipped the ``:`` keep-alive comments) and passes the returned events to the
sink. Anything that is not the shape llama-server sends becomes an ``InferError``
(``PROTOCOL``), never another exception, so a broken or hostile server cannot crash a turn.
An ``error`` object inside the stream becomes ``InferError(HTTP)`` with the status the
server put in it (500 when it gave none), which the retry policy treats like a 5xx.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from actors.base.events import ChatEvent, Content, Progress, Reasoning, ToolCallDelta
from actors.inference.types import MAX_ERROR_BODY, Completion, InferError, InferErrorKind
from actors.log import server_values
from actors.log.file import MAX_RECORD
from actors.log.records import Cut, ToolCall

__all__ = ["DONE", "MAX_RESPONSE_CHARS", "StreamAssembler"]

DONE = "[DONE]"
# A response is logged as one record, and a record holds at most MAX_RECORD bytes (64 MiB):
# at 4 bytes per character at most, and _CALL_CHARS for each tool call's own fields, this
# many characters always fit, with 64 KiB to spare for the rest of the record. A stream
# that sends more is refused as it arrives, so a hostile server cannot fill memory either.
MAX_RESPONSE_CHARS = (MAX_RECORD - 64 * 1024) // 4
_CALL_CHARS = 16  # a tool call's map in the record: 3 keys and their headers, < 64 bytes
_SHOWN = 200  # characters of a bad chunk quoted in an error message


class _Call:
    """One tool call being assembled from its fragments."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self, id: str | None, name: str | None) -> None:
        self.id = id
        self.name = name
        self.arguments: list[str] = []


class StreamAssembler:
    """State of one streamed answer: what arrived so far, and whether ``[DONE]`` was seen."""

    __slots__ = (
        "_calls",
        "_content",
        "_cut",
        "_fragments",
        "_reasoning",
        "_size",
        "done",
        "finish_reason",
        "id",
        "prompt_cache",
        "prompt_tokens",
        "timings",
        "usage",
    )

    def __init__(self) -> None:
        self.id: str | None = None  # the chatcmpl id, needed for the reasoning_end control
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _Call] = {}
        self._fragments = 0  # tool-call fragments received
        self._size = 0  # characters of content, reasoning and tool calls so far
        self.usage: dict[str, Any] = {}
        self.timings: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.done = False
        self.prompt_tokens = 0  # the prompt's size as its progress said (no usage yet)
        self.prompt_cache = 0  # of which its cache held, as its progress said
        self._cut: Cut | None = None  # what loopd cut, and why (cut_short)

    @property
    def reasoning_deltas(self) -> int:
        return len(self._reasoning)

    @property
    def deltas(self) -> int:
        """Reasoning, content and tool-call pieces so far: llama-server sends one per token."""
        return len(self._reasoning) + len(self._content) + self._fragments

    @property
    def answered(self) -> bool:
        """Content or a tool call started: the answer is under way."""
        return bool(self._content or self._calls)

    def feed(self, data: str) -> list[ChatEvent]:
        """The events carried by one ``data:`` payload; raises InferError on a bad one."""
        if self.done:
            raise _protocol("data after [DONE]", data)
        if data == DONE:
            self.done = True
            return []
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:  # also what orjson raises for too deep a nesting
            raise _protocol("a stream chunk is not JSON", data) from None
        if type(obj) is not dict:
            raise _protocol("a stream chunk is not a JSON object", data)
        try:
            return self._chunk(obj, data)
        except InferError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, RecursionError):
            raise _protocol("a stream chunk has an unexpected shape", data) from None

    def _chunk(self, obj: dict[str, Any], data: str) -> list[ChatEvent]:
        # Called once per streamed token: the rare fields are looked up only when present.
        get = obj.get
        if "error" in obj:
            raise _stream_error(obj["error"], data)
        if self.id is None:
            chunk_id = get("id")
            if type(chunk_id) is str:
                self.id = chunk_id
        if "usage" in obj and type(obj["usage"]) is dict:
            self.usage = obj["usage"]
        if "timings" in obj and type(obj["timings"]) is dict:
            self.timings = obj["timings"]
        progress = get("prompt_progress")
        if progress is not None:  # its role delta is not content
            if type(progress) is not dict:
                raise _protocol("prompt_progress is not an object", data)
            self.prompt_tokens = _int(progress.get("total", 0))
            self.prompt_cache = min(_int(progress.get("cache", 0)), self.prompt_tokens)
            return [
                Progress(
                    processed=_int(progress.get("processed", 0)),
                    total=self.prompt_tokens,
                    cache=_int(progress.get("cache", 0)),
                    time_ms=float(server_values.number(progress.get("time_ms")) or 0.0),
                )
            ]
        choices = get("choices")
        if choices is None or choices == []:
            return []  # the usage chunk, or a chunk with nothing to show
        if type(choices) is not list or type(choice := choices[0]) is not dict:
            raise _protocol("choices is not a list of objects", data)
        finish = choice.get("finish_reason")
        if finish is not None:
            if server_values.word(finish) is None:
                raise _protocol("finish_reason is not a short word", data)
            self.finish_reason = finish
        delta = choice.get("delta")
        if delta is None:
            return []
        if type(delta) is not dict:
            raise _protocol("delta is not an object", data)
        return self._delta(delta, data)

    def _grow(self, chars: int) -> None:
        self._size += chars
        if self._size > MAX_RESPONSE_CHARS:
            raise InferError(
                InferErrorKind.PROTOCOL,
                f"the response is longer than {MAX_RESPONSE_CHARS:,} characters, more than "
                "a session log record holds; it was stopped and nothing of it was kept",
            )

    def _delta(self, delta: dict[str, Any], data: str) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        reasoning = delta.get("reasoning_content")
        if reasoning:
            if type(reasoning) is not str:
                raise _protocol("reasoning_content is not a string", data)
            self._grow(len(reasoning))
            self._reasoning.append(reasoning)
            events.append(Reasoning(reasoning))
        content = delta.get("content")
        if content:
            if type(content) is not str:
                raise _protocol("content is not a string", data)
            self._grow(len(content))
            self._content.append(content)
            events.append(Content(content))
        calls = delta.get("tool_calls")
        if calls:
            if type(calls) is not list:
                raise _protocol("tool_calls is not a list", data)
            for fragment in calls:
                events.append(self._fragment(fragment, data))
        return events

    def _fragment(self, fragment: Any, data: str) -> ToolCallDelta:
        """First fragment of an index sets id and name; a later name replaces; args append."""
        if not isinstance(fragment, dict):
            raise _protocol("a tool-call fragment is not an object", data)
        index = fragment.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise _protocol("a tool-call fragment has no valid index", data)
        fn = fragment.get("function") or {}
        if not isinstance(fn, dict):
            raise _protocol("a tool-call fragment's function is not an object", data)
        call_id, name, args = fragment.get("id"), fn.get("name"), fn.get("arguments")
        if not all(v is None or isinstance(v, str) for v in (call_id, name, args)):
            raise _protocol("a tool-call fragment has non-string fields", data)
        self._grow(sum(len(t) for t in (call_id, name, args) if t))
        self._fragments += 1
        call = self._calls.get(index)
        if call is None:
            self._grow(_CALL_CHARS)
            call = self._calls[index] = _Call(call_id, name)
        else:
            call.id = call_id or call.id
            call.name = name or call.name
        if args:
            call.arguments.append(args)
        return ToolCallDelta(index=index, id=call_id, name=name, arguments=args or "")

    def reasoning_text(self) -> str | None:
        return "".join(self._reasoning) or None

    @property
    def said(self) -> bool:
        """Some answer or reasoning text has come: a cut keeps it."""
        return bool(self._content or self._reasoning)

    def cut_short(self, finish_reason: str, note: str) -> None:
        """loopd ends the answer here: what came is kept, but for tool calls (a call cut
        before its end is no call); ``note`` says why (the Completion's ``cut``)."""
        self.finish_reason, self._cut = finish_reason, Cut(why=finish_reason, note=note)
        self._calls.clear()
        if not self.usage:  # the usage chunk never came: what the stream itself showed
            self.usage = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.deltas}
        if not self.timings and self.prompt_tokens:  # nor its timings: what was processed
            self.timings = {"prompt_n": self.prompt_tokens - self.prompt_cache,
                            "cache_n": self.prompt_cache}

    def completion(
        self,
        *,
        thinking_capped: bool = False,
        extra_reasoning: int = 0,
        reasoning: str | None = None,
    ) -> Completion:
        """The assembled answer; ``extra_reasoning``/``reasoning`` carry an abandoned stream's."""
        calls = []
        for index in sorted(self._calls):
            call = self._calls[index]
            if not call.name:
                raise InferError(
                    InferErrorKind.PROTOCOL, f"tool call #{index} ended without a name"
                )
            calls.append(
                ToolCall(
                    id=call.id or uuid.uuid4().hex,
                    name=call.name,
                    arguments="".join(call.arguments),
                )
            )
        own = self.reasoning_text()
        return Completion(
            content="".join(self._content) or None,
            reasoning=(reasoning or "") + (own or "") or None,
            tool_calls=tuple(calls),
            timings=server_values.timings(self.timings),
            usage=server_values.usage(self.usage),
            reasoning_tokens=extra_reasoning + self._reasoning_tokens(),
            thinking_capped=thinking_capped,
            finish_reason=self.finish_reason or "stop",
            cut=self._cut,
        )

    def _reasoning_tokens(self) -> int:
        """The server's own count when it gives one, else the reasoning deltas seen."""
        details = self.usage.get("completion_tokens_details")
        if isinstance(details, Mapping):
            n = server_values.count(details.get("reasoning_tokens"))
            if n is not None:
                return n
        return self.reasoning_deltas


def _int(value: Any) -> int:
    n = server_values.count(value)
    if n is None:
        raise TypeError(value)
    return n


def _protocol(what: str, data: str) -> InferError:
    shown = data if len(data) <= _SHOWN else data[:_SHOWN] + "..."
    return InferError(
        InferErrorKind.PROTOCOL,
        f"{what}: {shown!r} (is inference.url a llama-server?)",
        body=data[:MAX_ERROR_BODY],
    )


def _stream_error(error: Any, data: str) -> InferError:
    """``data: {"error": ...}`` inside a 200 stream: the server failed mid-answer."""
    message, status = str(error), 500
    if isinstance(error, dict):
        message = str(error.get("message") or error)
        code = error.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599:
            status = code
    return InferError(
        InferErrorKind.HTTP,
        f"the server failed mid-answer: {message}",
        status=status,
        body=data[:MAX_ERROR_BODY],
    )
