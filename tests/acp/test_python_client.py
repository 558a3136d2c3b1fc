"""The official Python SDK's client side (``acp.spawn_agent_process``) drives ``loopd acp``
through a whole session on the fake llama-server: a tool call, each approval answer, a
cancel mid-turn, every stop reason, and a second process that loads the session.

The same flow with the TypeScript SDK's client is tests/acp/test_node_client.py.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import psutil
import pytest
from acp import spawn_agent_process, text_block
from acp.schema import (
    AgentMessageChunk,
    ToolCallProgress,
    ToolCallStart,
    UserMessageChunk,
)

from tests.support.acp_editor import ROOT, AcpEnv, Editor, assert_gone, check_flow_log

pytestmark = pytest.mark.timeout(300)


def order(tag: str, *steps: tuple[str, dict[str, Any]]) -> str:
    return " :: ".join([tag, *(f"{name} {json.dumps(args)}" for name, args in steps)])


def write(path: str, content: str) -> tuple[str, dict[str, Any]]:
    return ("write_file", {"path": path, "content": content})


def run(command: str) -> tuple[str, dict[str, Any]]:
    return ("run_command", {"command": command})


def text_of(updates: list[Any]) -> str:
    return "".join(u.content.text for u in updates if isinstance(u, AgentMessageChunk))


def statuses(updates: list[Any]) -> list[tuple[str, str | None]]:
    return [(type(u).__name__, u.status) for u in updates
            if isinstance(u, ToolCallStart | ToolCallProgress)]


async def _flow(env: AcpEnv) -> dict[str, Any]:
    editor = Editor()
    # stderr kept for a failure's message; the agent gets all the time it needs to stop
    # (the SDK's default is 2 s, then SIGTERM, then SIGKILL: too short on a loaded machine)
    spawn = {"cwd": ROOT, "env": env.environ(),
             "transport_kwargs": {"stderr": env.stderr.open("ab"), "shutdown_timeout": 60}}
    async with spawn_agent_process(editor, *env.argv("--local"), **spawn) as (conn, proc):
        agent_pid = proc.pid
        init = await conn.initialize(protocol_version=1)
        assert init.protocol_version == 1 and init.agent_capabilities is not None
        assert init.agent_capabilities.load_session is True
        assert init.agent_info is not None and init.agent_info.name == "loopd"
        session = (await conn.new_session(cwd=str(env.workspace), mcp_servers=[])).session_id

        async def prompt(text: str) -> tuple[str, list[Any]]:
            mark = len(editor.updates)
            done = await conn.prompt(session_id=session, prompt=[text_block(text)])
            return done.stop_reason, editor.since(mark)

        # a tool call that needs no approval
        reason, updates = await prompt(order("t1", ("read_file", {"path": "notes.txt"})))
        assert reason == "end_turn" and editor.asked == []
        start = next(u for u in updates if isinstance(u, ToolCallStart))
        assert (start.title, start.kind, start.status) == ("read_file notes.txt", "read",
                                                           "pending")
        assert start.locations and start.locations[0].path == str(env.workspace / "notes.txt")
        done = [u for u in updates if isinstance(u, ToolCallProgress)]
        assert done[-1].status == "completed" and done[-1].content is not None
        assert done[-1].content[0].content.text == "Buy seeds.\n"
        assert text_of(updates) == "done t1."

        # allow once: asked, runs
        editor.answers = ["allow_once"]
        reason, updates = await prompt(order("t2", write("a.txt", "one")))
        assert reason == "end_turn" and len(editor.asked) == 1
        call, options = editor.asked[0]
        assert [o.kind for o in options] == ["allow_once", "allow_always", "reject_once",
                                             "reject_always"]
        assert call.title == "write_file a.txt" and call.kind == "edit"
        assert statuses(updates) == [("ToolCallStart", "pending"),
                                     ("ToolCallProgress", "in_progress"),
                                     ("ToolCallProgress", "completed")]
        assert (env.workspace / "a.txt").read_text() == "one"

        # allow always: asked, runs, saved as a rule; the next such call is not asked
        editor.answers = ["allow_always"]
        reason, updates = await prompt(order("t3", run("touch made.txt")))
        assert reason == "end_turn" and len(editor.asked) == 2
        always = editor.asked[1][1][1]
        assert always.name == "Always allow run_command = touch made.txt"
        assert (env.workspace / "made.txt").exists()
        (env.workspace / "made.txt").unlink()
        assert (await prompt(order("t4", run("touch made.txt"))))[0] == "end_turn"
        assert len(editor.asked) == 2  # not asked
        assert (env.workspace / "made.txt").exists()

        # reject once; reject always (a deny rule: the next such call is refused unasked)
        editor.answers = ["reject_once", "reject_always"]
        reason, updates = await prompt(order("t5", write("b.txt", "no")))
        assert reason == "end_turn" and statuses(updates)[-1] == ("ToolCallProgress", "failed")
        assert not (env.workspace / "b.txt").exists()
        assert (await prompt(order("t6", run("rm notes.txt"))))[0] == "end_turn"
        reason, updates = await prompt(order("t7", run("rm notes.txt")))
        assert len(editor.asked) == 4  # t7 was not asked
        assert statuses(updates)[-1] == ("ToolCallProgress", "failed")
        assert (env.workspace / "notes.txt").exists()

        # a cancel mid-turn: the answer has begun when the editor cancels
        async def cancel_on_first_chunk(sid: str, update: Any) -> None:
            if isinstance(update, AgentMessageChunk):
                editor.on_update = None
                await conn.cancel(session_id=sid)

        editor.on_update = cancel_on_first_chunk
        reason, updates = await prompt("t8 [stall]")
        assert reason == "cancelled" and text_of(updates)  # it had begun

        # every other stop reason
        assert (await prompt("t9 [long]"))[0] == "max_tokens"
        looping = [("find_tool", {"query": f"q{i}"}) for i in range(TOOL_STEPS)]
        reason, updates = await prompt(order("t10", *looping))
        assert reason == "max_turn_requests"
        repeat = [("read_file", {"path": "notes.txt"})] * 3
        reason, updates = await prompt(order("t11", *repeat))
        assert reason == "max_turn_requests"
        # the repeat that hit the limit never ran: its call is closed as failed
        assert statuses(updates)[-1] == ("ToolCallProgress", "failed")

        listed = await conn.list_sessions()
        assert session in [s.session_id for s in listed.sessions]
        hosts = psutil.Process(agent_pid).children(recursive=True)
        assert hosts  # the tool host
    assert proc.returncode == 0
    assert_gone(hosts)

    # a second process loads the session and receives its history
    reader = Editor()
    async with spawn_agent_process(reader, *env.argv("--local"), **spawn) as (conn, proc):
        await conn.initialize(protocol_version=1)
        await conn.load_session(cwd=str(env.workspace), session_id=session, mcp_servers=[])
        history = [u for _, u in reader.updates]
        mark = len(reader.updates)
        again = await conn.prompt(session_id=session, prompt=[text_block("t12")])
        assert again.stop_reason == "end_turn" and text_of(reader.since(mark)) == "done t12."
    assert proc.returncode == 0
    return {"session": session, "history": history}


TOOL_STEPS = 4  # one more than loop.tool_iterations (3)


def test_the_python_sdk_client_drives_a_whole_session(env: AcpEnv) -> None:
    result = asyncio.run(_flow(env))
    session, history = result["session"], result["history"]
    users = [u.content.text for u in history if isinstance(u, UserMessageChunk)]
    assert users[0] == order("t1", ("read_file", {"path": "notes.txt"})) and len(users) == 11
    first = next(u for u in history if isinstance(u, ToolCallProgress))
    assert first.status == "completed" and first.content[0].content.text == "Buy seeds.\n"
    assert "done t1." in text_of(history)
    check_flow_log(env, session)


def test_stdout_carries_nothing_but_the_protocol(env: AcpEnv) -> None:
    """A chatty start (status lines, warnings) goes to stderr: every stdout line is JSON-RPC.
    The input ends right after the requests: they are answered all the same."""
    import subprocess

    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                         "params": {"protocolVersion": 1}}),
             json.dumps({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                         "params": {"cwd": str(env.workspace), "mcpServers": [
                             {"name": "notes", "command": "/bin/true", "args": [],
                              "env": []}]}})]
    done = subprocess.run(env.argv("--local"), cwd=ROOT, env=env.environ(), timeout=120,
                          input="\n".join(lines) + "\n", capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    out = [json.loads(line) for line in done.stdout.splitlines()]
    assert [m.get("id") for m in out] == [1, 2, None]
    assert all("result" in m for m in out[:2])
    assert "starting tool hosts" in done.stderr  # the status lines are there, on stderr
    # an editor's MCP server that does not start (/bin/true ends at once) is said: in the
    # answer, on stderr, and in the session right after the answer
    session = out[1]["result"]["sessionId"]
    (note,) = out[1]["result"]["_meta"]["loopd"]["mcpServers"]["notes"]
    assert note.startswith("MCP server notes did not start: "), note
    assert f"session {session}: {note}" in done.stderr
    assert out[2]["params"] == {"sessionId": session, "update": {
        "sessionUpdate": "agent_message_chunk", "content": {"type": "text",
                                                            "text": f"loopd: {note}\n"}}}
