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

Two styles for a tool's result (``session.tool_results``): ``"tool"`` sends it as a
``tool`` message, the chat template's own form; ``"user"`` sends it as a user message that
gives the turn's question, names the tool and its result, and asks for an answer from it
(:data:`USER_RESULT`). The embedded model, held to plain text after a result, answers from
the second far more often (after a ``tool`` message it mostly writes "Mark ..." about
nothing); the question first and "in full sentences" made it answer, where "answer in one
sentence: QUESTION" after the result mostly got the result or the question echoed back
(measured: right answers after the right call 16/17 against 12/17).
Both depend only on the records, so the extension property holds for either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from actors.log.records import Assistant, Baseline, Record, ToolCall, ToolResult, User

__all__ = ["MISSING_RESULT", "USER_RESULT", "Message", "ResultStyle", "messages"]

MISSING_RESULT = "No result: the turn ended before this tool call ran."
USER_RESULT = (
    "Question: {question}\n\n{tool} returned:\n{result}\n\n"
    "Answer the question from that result, in full sentences."
)

Message = dict[str, Any]
ResultStyle = Literal["tool", "user"]


def messages(
    baseline: Baseline, records: Iterable[Record], *, results: ResultStyle = "tool"
) -> list[Message]:
    """The chat messages of a request: the system prompt, then the log in order."""
    out: list[Message] = [{"role": "system", "content": baseline.system}]
    pending: list[ToolCall] = []  # calls of the open block still waiting for a result
    question = ""  # the content of the last User record: the turn's question
    for record in records:
        if isinstance(record, User | Assistant):
            out.extend(_result(results, call.id, MISSING_RESULT, call, question)
                       for call in pending)
            pending = []
        if isinstance(record, User):
            out.append({"role": "user", "content": record.content})
            question = record.content
        elif isinstance(record, Assistant):
            out.append(_assistant(record))
            pending = list(record.tool_calls)
        elif isinstance(record, ToolResult):
            answered = None
            for i, call in enumerate(pending):
                if call.id == record.tool_call_id:
                    answered = pending.pop(i)
                    break
            out.append(_result(results, record.tool_call_id, record.content, answered, question))
        # Baseline, Usage, CacheLoss: nothing
    return out


def _result(
    style: ResultStyle, call_id: str, content: str, call: ToolCall | None, question: str
) -> Message:
    if style == "tool":
        return {"role": "tool", "tool_call_id": call_id, "content": content}
    tool = call.tool if call is not None else "A tool"
    text = USER_RESULT.format(tool=tool, result=content, question=question)
    return {"role": "user", "content": text}


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

