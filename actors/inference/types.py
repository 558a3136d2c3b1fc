"""What the session and the inference actor exchange: requests, completions, errors."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from actors.base.errors import ServerError
from actors.base.events import Used
from actors.log import server_values
from actors.log.records import Assistant, Cut, SlotUse, ToolCall, Usage

__all__ = [
    "CUT",
    "MAX_ERROR_BODY",
    "BaselineUse",
    "ChatRequest",
    "Completion",
    "InferError",
    "InferErrorKind",
    "error_object",
    "is_context_full",
]


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRequest:
    session: str  # who asks: the slot keeper leases this session a slot for the request
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    thinking: bool = True
    max_tokens: int | None = None
    # Reasoning tokens still allowed in this turn (loop.thinking_cap minus what earlier
    # requests of the turn used). None: no cap.
    thinking_budget: int | None = None
    # Extra sampling fields sent as they are (temperature, seed), from the config.
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # A GBNF grammar the answer must follow (inference.constrained_calls): sent as
    # ``grammar`` with ``tool_choice: "none"``, the only way llama-server takes a grammar
    # together with tools.
    grammar: str | None = None
    # The runaway-text limit (actors/inference/runaway.py): the longest run of the answer
    # or reasoning that may copy its own earlier text, or the prompt (0: not watched).
    runaway_repeat: int = 0
    runaway_copy: int = 0
    # ... or repeat a passage that earlier answers to other questions copied (``echoes``).
    runaway_echo: int = 0
    echoes: tuple[str, ...] = ()


# How an answer ends when it was cut, not finished: at max_tokens ("length", the server's or
# loopd's), by the runaway-text limit ("repeat", "copy", "echo"), by the request's end once
# the answer had begun ("timeout", "error": what streamed is kept).
CUT = frozenset({"length", "repeat", "copy", "echo", "timeout", "error"})


@dataclasses.dataclass(frozen=True, slots=True)
class BaselineUse:
    """The baseline's prefix (system prompt and tools) a request's slot held before it:
    restored, still there, or processed first (docs/slots.md#a-new-session-starts-warm).
    Not logged itself: the request's SlotUse says it in words, and a CacheLoss its loss."""

    tokens: int  # its tokens in the slot (expected from its saved state, when that failed)
    loss: str = ""  # why its saved state could not be restored; "" when it was or none existed


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    timings: Mapping[str, Any]
    usage: Mapping[str, Any]
    reasoning_tokens: int
    thinking_capped: bool
    finish_reason: str
    slot: SlotUse | None = None  # what the slot keeper did for this request
    baseline: BaselineUse | None = None  # the baseline it gave the slot first, if any
    cut: Cut | None = None  # what loopd cut of the response, and why (logged after it)

    @property
    def prompt_tokens(self) -> int:
        return server_values.count(self.usage.get("prompt_tokens")) or 0

    @property
    def completion_tokens(self) -> int:
        return server_values.count(self.usage.get("completion_tokens")) or 0

    def assistant(self) -> Assistant:
        """The log's record of what the model said."""
        return Assistant(content=self.content, reasoning=self.reasoning,
                         tool_calls=self.tool_calls)

    def used(self) -> Used:
        """The event of this request's usage, for whoever shows the context (an editor)."""
        return Used(self.prompt_tokens, self.completion_tokens,
                    server_values.count(self.timings.get("prompt_n")) or 0,
                    server_values.count(self.timings.get("cache_n")) or 0)

    def usage_record(self) -> Usage:
        """The log's record of what answering cost, and what the slot keeper did."""
        return Usage(
            timings=self.timings, reasoning_tokens=self.reasoning_tokens,
            thinking_capped=self.thinking_capped, prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens, finish_reason=self.finish_reason,
            slot=self.slot,
        )



MAX_ERROR_BODY = 64 * 1024  # bytes of a server's error body kept on an InferError


class InferErrorKind(enum.StrEnum):
    HTTP = "http"
    CONNECT = "connect"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol"
    CANCELLED = "cancelled"


class InferError(ServerError):
    """A request to the model server that did not give a Completion; ``kind`` says how."""

    def __init__(
        self, kind: InferErrorKind, message: str, *, status: int | None = None, body: str = ""
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body

    def __str__(self) -> str:
        where = f"HTTP {self.status}: " if self.status is not None else ""
        return f"The model server failed: {self.kind.value}: {where}{self.message}"

    @classmethod
    def cancelled(cls, why: str = "cancelled") -> InferError:
        """The request was cancelled, or the inference side stopped under it."""
        return cls(InferErrorKind.CANCELLED, why)

    def error_body(self) -> Mapping[str, Any]:
        """The server's ``error`` object, or {} when the body is not llama-server JSON."""
        return error_object(self.body)


def error_object(body: str) -> Mapping[str, Any]:
    """The ``error`` object of a llama-server error body, or {} when it has none."""
    try:
        data = json.loads(body)
    except (ValueError, TypeError):
        return {}
    err = data.get("error") if isinstance(data, dict) else None
    return err if isinstance(err, dict) else {}


def is_context_full(e: InferError) -> bool:
    """True exactly for llama-server's 400 ``exceed_context_size_error``."""
    return (
        e.kind is InferErrorKind.HTTP
        and e.status == 400
        and e.error_body().get("type") == "exceed_context_size_error"
    )
