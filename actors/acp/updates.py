"""What loopd's events and records are in ACP: session updates, permission requests, stop
reasons. Pure functions (and one small per-turn tracker): no I/O, tested on their own.

=====================================  ==============================================
loopd                                  ACP
=====================================  ==============================================
``Content`` / ``Reasoning``            ``agent_message_chunk`` / ``agent_thought_chunk``
``ToolCallStarted``                    ``tool_call``, status ``pending``
``ApprovalRequested``                  ``session/request_permission`` (see :func:`permission`)
``ApprovalDecided`` allow              ``tool_call_update`` ``in_progress``
``ToolResultEvent``                    ``tool_call_update`` ``completed`` or ``failed``,
                                       the result text as its content
a call the turn ended before it ran    ``tool_call_update`` ``failed`` (why, as content)
the answer / cut at ``max_tokens``     stop reason ``end_turn`` / ``max_tokens``
``TurnLimit`` (tool iterations,        stop reason ``max_turn_requests`` (the limit's
repeated call, calls per response)     message in ``_meta.loopd.limit``)
``Used`` (a model request logged)      ``usage_update``: ``used`` its prompt and response
                                       tokens, ``size`` the slot's context;
                                       ``_meta.loopd`` the cached and processed tokens
an agent's (``AgentEvent``) call,      the same, its id ``CHILD:N`` (the child session's
result or allow                        name and its call); its text is its answer, the
                                       parent's call result (docs/agents.md)
``Cancelled``                          stop reason ``cancelled``
any other ``LoopdError``               a JSON-RPC error: loopd's one-line message
=====================================  ==============================================

Waiting, progress, queueing, retries, cache losses and torn tails have no ACP update; they
are loopd's own (``loopd run --json`` shows them). ``Compacting`` / ``Compacted`` are draft
ACP's ``compaction_update`` (``in_progress`` / ``completed``) for a client that opted in:
JSON (:func:`compaction`), as the pinned SDK has no type for it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeAlias
from urllib.parse import unquote, urlsplit

from acp import (
    start_tool_call,
    text_block,
    tool_content,
    update_agent_message_text,
    update_agent_thought_text,
    update_tool_call,
    update_user_message_text,
)
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    PermissionOption,
    ResourceContentBlock,
    StopReason,
    TextContentBlock,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
    ToolCallUpdate,
    ToolKind,
    UsageUpdate,
    UserMessageChunk,
)

from actors.base import events as ev
from actors.base.errors import Cancelled, LoopdError, TurnLimit
from actors.base.events import Choice, Decision
from actors.log.records import Assistant, Record, ToolResult, User
from actors.service.types import TurnOutcome
from actors.session.limits import result_failed

__all__ = [
    "TurnView", "Update", "compaction", "decision_of", "history", "loopd_meta", "permission",
    "prompt_text", "stop_for_error", "stop_reason", "tool_call", "usage",
]  # fmt: skip

Update: TypeAlias = (
    AgentMessageChunk | AgentThoughtChunk | UserMessageChunk | ToolCallStart | ToolCallProgress
    | UsageUpdate
)

_KINDS: dict[str, ToolKind] = {
    "read_file": "read", "list_dir": "read", "search_files": "search", "find_tool": "search",
    "outline_file": "read", "find_definition": "search",
    "write_file": "edit", "run_command": "execute", "fetch_url": "fetch",
}  # fmt: skip
_BRIEF = ("path", "command", "query", "url", "pattern", "text")  # the argument a title shows
_TITLE_CHARS = 100
NO_RESULT = "It did not run: the turn ended before it ({why})."


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _unwrap(name: str, arguments: Any) -> tuple[str, Any]:
    """``call_tool {"name": T, "arguments": A}`` is a call of T with A (for the title)."""
    if name != "call_tool" or not isinstance(arguments, dict):
        return name, arguments
    tool = arguments.get("name")
    if not isinstance(tool, str):
        return name, arguments
    inner = arguments.get("arguments", {k: v for k, v in arguments.items() if k != "name"})
    return tool, _arguments(inner) if isinstance(inner, str) else inner


def _title(tool: str, arguments: Any) -> str:
    brief = ""
    if isinstance(arguments, dict):
        shown = next((arguments[k] for k in _BRIEF if isinstance(arguments.get(k), str)), None)
        brief = shown if shown is not None else json.dumps(arguments, ensure_ascii=False)
    elif arguments not in ("", None):
        brief = str(arguments)
    title = f"{tool} {brief}".strip().replace("\n", " ")
    return title if len(title) <= _TITLE_CHARS else title[: _TITLE_CHARS - 1] + "…"


def _locations(arguments: Any, workspace: Path) -> list[ToolCallLocation] | None:
    path = arguments.get("path") if isinstance(arguments, dict) else None
    if not isinstance(path, str) or not path:
        return None
    return [ToolCallLocation(path=str((workspace / path).resolve()))]


def tool_call(
    call_id: str, name: str, arguments_json: str, workspace: Path,
    status: ToolCallStatus = "pending",
) -> ToolCallStart:  # fmt: skip
    """The ``tool_call`` update of a model's call (``call_tool`` shown as the tool it calls)."""
    tool, arguments = _unwrap(name, _arguments(arguments_json))
    return start_tool_call(
        call_id, _title(tool, arguments), kind=_KINDS.get(tool, "other"), status=status,
        raw_input=arguments, locations=_locations(arguments, workspace),
    )  # fmt: skip


def _finished(call_id: str, text: str, failed: bool) -> ToolCallProgress:
    return update_tool_call(call_id, status="failed" if failed else "completed",
                            content=[tool_content(text_block(text))])


class TurnView:
    """One turn's events as ACP updates; remembers the calls that have not finished, so the
    turn's end can close them (a repeat that hit the limit, a cancel, an error)."""

    def __init__(self, workspace: Path, size: int = 0) -> None:
        self.workspace = workspace
        self.size = size  # tokens of context the session's slot holds (0: not known)
        self.open: list[str] = []

    def event(self, event: ev.Event, prefix: str = "") -> list[Update]:
        """``prefix``: a child agent's calls' ids start with its name (the parent's are bare)."""
        match event:
            case ev.AgentEvent(agent=agent, event=inner) if isinstance(
                    inner, ev.ToolCallStarted | ev.ToolResultEvent | ev.ApprovalDecided):
                return self.event(inner, f"{agent}:")
            case ev.Content(text=text) if text:
                return [update_agent_message_text(text)]
            case ev.Reasoning(text=text) if text:
                return [update_agent_thought_text(text)]
            case ev.ToolCallStarted(name=name, call=call, arguments=arguments):
                self.open.append(f"{prefix}{call}")
                return [tool_call(f"{prefix}{call}", name, arguments, self.workspace)]
            case ev.ApprovalDecided(call=call, decision="allow"):
                return [update_tool_call(f"{prefix}{call}", status="in_progress")]
            case ev.Used():
                return [usage(event, self.size)]
            case ev.ToolResultEvent(call=call, outcome=outcome, content=text, class_=cls):
                if f"{prefix}{call}" in self.open:
                    self.open.remove(f"{prefix}{call}")
                shown = text if cls != "secret" else f"(a secret result: {len(text)} characters)"
                return [_finished(f"{prefix}{call}", shown,
                                  outcome in ("failed", "denied", "invalid"))]
        return []

    def end(self, why: str) -> list[Update]:
        """The calls still open when the turn ended: failed, saying why."""
        closed: list[Update] = [_finished(c, NO_RESULT.format(why=why), True) for c in self.open]
        self.open.clear()
        return closed


def compaction(event: ev.Compacting | ev.Compacted, compaction_id: str) -> dict[str, Any]:
    """draft ACP's ``compaction_update`` (JSON: the pinned SDK has no type for it) for a
    compaction's start (``in_progress``) and end (``completed``), loopd's figures in
    ``_meta.loopd``."""
    if isinstance(event, ev.Compacting):
        status, meta = "in_progress", {"why": event.why, "tokensBefore": event.tokens_before,
                                       "how": event.how}
    else:
        status, meta = "completed", {"why": event.why, "tokensBefore": event.tokens_before,
                                     "tokensAfter": event.tokens_after,
                                     "turnsKept": event.turns_kept, "ms": round(event.ms, 1)}
    return {"sessionUpdate": "compaction_update", "compactionId": compaction_id,
            "status": status, "_meta": loopd_meta(**meta)}


def usage(used: ev.Used, size: int) -> UsageUpdate:
    """A request's ``usage_update``: the context it left (prompt and response) and the
    context's size (what was used when the size is not known); loopd's own figures of the
    request under ``_meta.loopd``."""
    tokens = used.prompt_tokens + used.completion_tokens
    return UsageUpdate(session_update="usage_update", used=tokens, size=max(size, tokens),
                       field_meta=loopd_meta(
                           promptTokens=used.prompt_tokens, cachedTokens=used.cached,
                           processedTokens=used.processed,
                           completionTokens=used.completion_tokens))


def history(records: Sequence[Record], workspace: Path) -> Iterator[Update]:
    """A session's log as the updates a client replays on ``session/load``: user and agent
    messages, thoughts, and every tool call with its final status and result. (Every
    record, compacted or not: the editor shows the whole conversation, as ``loopd log
    show`` does.)"""
    for i, record in enumerate(records):
        if isinstance(record, User):
            yield update_user_message_text(record.content)
        elif isinstance(record, Assistant):
            if record.reasoning:
                yield update_agent_thought_text(record.reasoning)
            if record.content:
                yield update_agent_message_text(record.content)
            results = _results_of(records, i)
            for k, call in enumerate(record.tool_calls):
                answered = results.get(call.id)
                result = answered.pop(0) if answered else None
                call_id = str(result.call) if result else f"{i}-{k}"
                yield tool_call(call_id, call.name, call.arguments, workspace)
                if result is None:
                    yield _finished(call_id, NO_RESULT.format(why="no result in the log"), True)
                else:
                    yield _finished(call_id, result.content, result_failed(result.content))


def _results_of(records: Sequence[Record], at: int) -> dict[str, list[ToolResult]]:
    """The results that answer the Assistant record at ``at``, by tool call id, in order
    (a model may give two calls of one response the same id)."""
    found: dict[str, list[ToolResult]] = {}
    for record in records[at + 1:]:
        if isinstance(record, User | Assistant):
            break
        if isinstance(record, ToolResult):
            found.setdefault(record.tool_call_id, []).append(record)
    return found


# --- approvals ---------------------------------------------------------------------------


def permission(
    request: ev.ApprovalRequested, workspace: Path
) -> tuple[ToolCallUpdate, list[PermissionOption]]:
    """A call waiting for approval as ``session/request_permission``'s tool call and options.

    The option ids are loopd's decision words (:class:`~actors.base.events.Choice`): allow
    once, allow always (saved as an allow rule in the rules file), reject once, reject
    always (saved as a deny rule). The "always" ones only when a rule can match the call
    (not, e.g., a command with shell operators)."""
    arguments = _arguments(request.arguments)
    call = ToolCallUpdate(
        tool_call_id=f"{request.child}:{request.call}" if request.child else str(request.call),
        title=_title(request.tool, arguments),
        kind=_KINDS.get(request.tool, "other"), status="pending", raw_input=arguments,
        locations=_locations(arguments, workspace),
        content=[tool_content(text_block(request.prompt))] if request.prompt else None,
    )  # fmt: skip
    options = [PermissionOption(option_id=Choice.ONCE.value, name="Allow once", kind="allow_once")]
    if request.rule:
        options.append(PermissionOption(option_id=Choice.ALWAYS.value, kind="allow_always",
                                        name=f"Always allow {request.rule}"))
    options.append(PermissionOption(option_id=Choice.DENY.value, name="Reject", kind="reject_once"))
    if request.rule:
        options.append(PermissionOption(option_id=Choice.NEVER.value, kind="reject_always",
                                        name=f"Always reject {request.rule}"))
    return call, options


def decision_of(option_id: str, offered: Sequence[PermissionOption]) -> Decision:
    """The decision an answer's option id means; an id that was not offered is a denial that
    says so (the model reads it)."""
    if option_id in {o.option_id for o in offered}:
        return Decision(Choice(option_id))
    return Decision(Choice.DENY, f"the editor answered with an option that was not offered "
                                 f"({option_id!r:.60})", by="editor")


# --- how a turn ends ---------------------------------------------------------------------


def stop_reason(outcome: TurnOutcome) -> StopReason:
    return "max_tokens" if outcome.cut else "end_turn"


def stop_for_error(error: LoopdError) -> StopReason | None:
    """The stop reason a turn's error is, or None: then it is a JSON-RPC error."""
    if isinstance(error, TurnLimit):
        return "max_turn_requests"
    if isinstance(error, Cancelled):
        return "cancelled"
    return None


# --- prompts -----------------------------------------------------------------------------


def prompt_text(blocks: Sequence[Any], workspace: Path) -> str:
    """A prompt's content blocks as the user message: text as it is, a link to a file as its
    path (relative to the workspace when inside it, so the file tools can open it). Other
    blocks (images, audio, embedded resources) are not declared in ``initialize``: a
    ValueError says so."""
    parts = []
    for block in blocks:
        if isinstance(block, TextContentBlock):
            parts.append(block.text)
        elif isinstance(block, ResourceContentBlock):
            parts.append(_linked(block.uri, workspace))
        else:
            kind = getattr(block, "type", type(block).__name__)
            raise ValueError(f"loopd takes text and resource_link prompt blocks, not {kind!r} "
                             "(its initialize declares no images, audio or embedded context)")
    return "".join(parts)


def _linked(uri: str, workspace: Path) -> str:
    parts = urlsplit(uri)
    if parts.scheme != "file":
        return uri
    path = Path(unquote(parts.path))
    try:
        return str(path.resolve().relative_to(workspace))
    except ValueError:
        return str(path)


def loopd_meta(**fields: Any) -> dict[str, Any]:
    """loopd's own additions to a response, under ``_meta.loopd``."""
    return {"loopd": fields}
