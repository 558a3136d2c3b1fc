"""Rendering the log as chat messages: ``messages(baseline, records)`` (design 3).

A left fold that only ever emits: each record adds messages at the end and none are
changed later, so the rendering after one more record always starts with the rendering
before it, for any record sequence. That is what lets llama-server reuse its KV cache for
the whole earlier prompt of every request.

A tool call that never got a result (a turn stopped by a limit) is answered with
:data:`MISSING_RESULT`, always the same text, when its block is *closed*: when the next
User or Assistant record comes. While the block is still open at the end of the records,
nothing is emitted for it, so a ToolResult appended later still extends the rendering.
Results are matched to calls by ``tool_call_id``; a result that answers no open call is
still rendered (the log is the truth: nothing is dropped). Baseline (in any position),
Usage and CacheLoss records render to nothing, and ``time`` is never sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from actors.records import Assistant, Baseline, Record, ToolCall, ToolResult, User

__all__ = ["MISSING_RESULT", "Message", "messages"]

MISSING_RESULT = "No result: the turn ended before this tool call ran."

Message = dict[str, Any]


def messages(baseline: Baseline, records: Iterable[Record]) -> list[Message]:
    """The chat messages of a request: the system prompt, then the log in order."""
    out: list[Message] = [{"role": "system", "content": baseline.system}]
    pending: list[ToolCall] = []  # calls of the open block still waiting for a result
    for record in records:
        if isinstance(record, User | Assistant):
            out.extend(_placeholder(call) for call in pending)
            pending = []
        if isinstance(record, User):
            out.append({"role": "user", "content": record.content})
        elif isinstance(record, Assistant):
            out.append(_assistant(record))
            pending = list(record.tool_calls)
        elif isinstance(record, ToolResult):
            for i, call in enumerate(pending):
                if call.id == record.tool_call_id:
                    del pending[i]
                    break
            out.append(
                {"role": "tool", "tool_call_id": record.tool_call_id, "content": record.content}
            )
        # Baseline, Usage, CacheLoss: nothing
    return out



def _assistant(record: Assistant) -> Message:
    message: Message = {"role": "assistant", "content": record.content or ""}
    if record.reasoning is not None:
        message["reasoning_content"] = record.reasoning
    if record.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for c in record.tool_calls
        ]
    return message


def _placeholder(call: ToolCall) -> Message:
    return {"role": "tool", "tool_call_id": call.id, "content": MISSING_RESULT}

