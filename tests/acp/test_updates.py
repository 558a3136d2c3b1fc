"""loopd's events and records as ACP updates, approvals as permission requests, prompts as
text: the pure mapping of actors/acp/updates.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from acp.schema import (
    AgentMessageChunk,
    AgentThoughtChunk,
    ImageContentBlock,
    ResourceContentBlock,
    TextContentBlock,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)
from hypothesis import given

from actors.acp import updates as up
from actors.base import events as ev
from actors.base.errors import Cancelled, SessionFull, TurnLimit
from actors.base.events import Choice
from actors.log.records import Assistant, Record, ToolCall, ToolResult, User
from actors.tools.protocol.spec import ResultClass
from tests.strategies import conversations

WS = Path("/work/ws")


def result(call: int, tool_call_id: str, content: str) -> ToolResult:
    return ToolResult(call=call, tool_call_id=tool_call_id, content=content,
                      class_=ResultClass.PUBLIC, untrusted=False, truncated=False)


def test_a_log_replays_as_messages_and_tool_calls_with_their_final_status() -> None:
    read = json.dumps({"name": "read_file", "arguments": {"path": "notes.txt"}})
    records: list[Record] = [
        User(content="what do the notes say?"),
        Assistant(content=None, reasoning="look first",
                  tool_calls=(ToolCall("c1", "call_tool", read),
                              ToolCall("c2", "write_file", '{"path": "x"}'))),
        result(1, "c1", "Buy seeds."),
        result(2, "c2", "The call was denied: the person said no"),
        Assistant(content="Buy seeds.", reasoning=None,
                  tool_calls=(ToolCall("c3", "list_dir", "{}"),)),  # never answered
    ]
    out = list(up.history(records, WS))
    assert [type(u).__name__ for u in out] == [
        "UserMessageChunk", "AgentThoughtChunk", "ToolCallStart", "ToolCallProgress",
        "ToolCallStart", "ToolCallProgress", "AgentMessageChunk", "ToolCallStart",
        "ToolCallProgress"]
    first = out[2]
    assert isinstance(first, ToolCallStart)
    # call_tool shown as the tool it calls, with its path as a location
    assert (first.tool_call_id, first.title, first.kind) == ("1", "read_file notes.txt", "read")
    assert first.locations and first.locations[0].path == "/work/ws/notes.txt"
    assert [(u.tool_call_id, u.status) for u in out if isinstance(u, ToolCallProgress)] == [
        ("1", "completed"), ("2", "failed"), ("4-0", "failed")]
    last = out[-1]
    assert isinstance(last, ToolCallProgress) and last.content
    assert "did not run" in last.content[0].content.text


@given(conversations(compacting=True))
def test_every_replayed_call_ends_once_with_a_final_status(
    convo: tuple[object, list[Record]],
) -> None:
    _, records = convo
    out = list(up.history(records, WS))
    users = [u.content.text for u in out if isinstance(u, UserMessageChunk)]
    assert users == [r.content for r in records if isinstance(r, User)]
    starts = [u.tool_call_id for u in out if isinstance(u, ToolCallStart)]
    ends = [(u.tool_call_id, u.status) for u in out if isinstance(u, ToolCallProgress)]
    assert [c for c, _ in ends] == starts
    assert all(status in ("completed", "failed") for _, status in ends)
    calls = sum(len(r.tool_calls) for r in records if isinstance(r, Assistant))
    assert len(starts) == calls
    for u in out:  # each one serialises as the wire wants it
        assert u.model_dump(mode="json", by_alias=True, exclude_none=True)["sessionUpdate"]


def test_a_turn_s_events_and_the_calls_its_end_closes() -> None:
    view = up.TurnView(WS)
    assert view.event(ev.Waiting()) == []
    assert view.event(ev.Progress(processed=1, total=2, cache=0)) == []
    (thought,) = view.event(ev.Reasoning("hmm"))
    (said,) = view.event(ev.Content("Hi"))
    assert isinstance(thought, AgentThoughtChunk) and isinstance(said, AgentMessageChunk)
    (start,) = view.event(ev.ToolCallStarted(name="run_command", call=7,
                                             arguments='{"command": "make test"}'))
    assert isinstance(start, ToolCallStart)
    assert (start.title, start.kind, start.status) == ("run_command make test", "execute",
                                                       "pending")
    (running,) = view.event(ev.ApprovalDecided(call=7, tool="run_command", decision="allow",
                                               scope="once", by="person"))
    assert isinstance(running, ToolCallProgress) and running.status == "in_progress"
    assert view.event(ev.ApprovalDecided(call=7, tool="run_command", decision="deny",
                                         scope="once", by="person")) == []
    (done,) = view.event(ev.ToolResultEvent(name="run_command", call=7, class_="secret",
                                            truncated=False, outcome="result", content="pw"))
    assert isinstance(done, ToolCallProgress) and done.status == "completed"
    assert done.content and "secret" in done.content[0].content.text  # not shown
    view.event(ev.ToolCallStarted(name="read_file", call=8, arguments="{}"))
    (closed,) = view.end("Stopped by the repeated call limit")
    assert isinstance(closed, ToolCallProgress)
    assert (closed.tool_call_id, closed.status) == ("8", "failed")
    assert view.end("again") == []


def test_a_child_agent_s_calls_are_tool_calls_of_their_own() -> None:
    view = up.TurnView(WS)
    view.event(ev.ToolCallStarted(name="agent", call=3, arguments='{"task": "read a"}'))
    assert view.event(ev.AgentEvent("s.a1", ev.Content("not the parent's answer"))) == []
    (start,) = view.event(ev.AgentEvent("s.a1", ev.ToolCallStarted(
        name="read_file", call=3, arguments='{"path": "a"}')))
    assert isinstance(start, ToolCallStart) and start.tool_call_id == "s.a1:3"
    (done,) = view.event(ev.AgentEvent("s.a1", ev.ToolResultEvent(
        name="read_file", call=3, class_="public", truncated=False, outcome="result",
        content="a")))
    assert isinstance(done, ToolCallProgress) and done.tool_call_id == "s.a1:3"
    (closed,) = view.end("cancelled")
    assert closed.tool_call_id == "3"  # the parent's agent call, still open


def test_a_call_waiting_for_approval_asks_with_loopd_s_decisions() -> None:
    request = ev.ApprovalRequested(call=3, tool="run_command",
                                   arguments='{"command": "rm -rf build"}',
                                   prompt="Run rm -rf build?", rule="run_command = rm -rf build")
    call, options = up.permission(request, WS)
    assert (call.tool_call_id, call.status, call.kind) == ("3", "pending", "execute")
    assert [(o.option_id, o.kind) for o in options] == [
        ("once", "allow_once"), ("always", "allow_always"), ("deny", "reject_once"),
        ("never", "reject_always")]
    assert options[3].name == "Always reject run_command = rm -rf build"
    assert [up.decision_of(o.option_id, options).choice for o in options] == [
        Choice.ONCE, Choice.ALWAYS, Choice.DENY, Choice.NEVER]
    odd = up.decision_of("session", options)  # loopd's word, but not offered here
    assert odd.choice is Choice.DENY and odd.by == "editor" and "not offered" in odd.reason
    # a call no rule can match: only once, either way
    _, only = up.permission(ev.ApprovalRequested(call=4, tool="run_command",
                                                 arguments='{"command": "a | b"}',
                                                 prompt=""), WS)
    assert [o.kind for o in only] == ["allow_once", "reject_once"]


def test_how_a_turn_ends() -> None:
    assert up.stop_for_error(TurnLimit("tool iterations", "x")) == "max_turn_requests"
    assert up.stop_for_error(TurnLimit("repeated call", "x")) == "max_turn_requests"
    assert up.stop_for_error(Cancelled()) == "cancelled"
    assert up.stop_for_error(SessionFull()) is None  # a JSON-RPC error


def test_a_prompt_s_blocks_become_the_user_message(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    blocks = [TextContentBlock(type="text", text="Explain "),
              ResourceContentBlock(type="resource_link", name="main.py",
                                   uri=(tmp_path / "src" / "main.py").as_uri()),
              TextContentBlock(type="text", text=" and "),
              ResourceContentBlock(type="resource_link", name="x", uri="https://example.org/x")]
    assert up.prompt_text(blocks, tmp_path) == "Explain src/main.py and https://example.org/x"
    image = ImageContentBlock(type="image", data="AA==", mime_type="image/png")
    with pytest.raises(ValueError, match="not 'image'"):
        up.prompt_text([image], tmp_path)
