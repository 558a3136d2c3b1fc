"""The MCP servers an editor gives a session (``mcpServers``) run as that session's own tool
hosts: a real MCP server (the official ``mcp`` SDK's, tests/tools/mcp_test_server.py) whose
tool the model calls in that session, offered to no other, stopped when the session closes;
a server that cannot start is said in the session (an agent message naming it and the fix)
and the session works. Driven by the official Python SDK's client (``spawn_agent_process``)
in this process and through the daemon, and line by line for what no SDK would send (a
transport ACP does not name). The TypeScript SDK's client: tests/acp/flow.mjs.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from acp import spawn_agent_process, text_block
from acp.schema import (
    AgentMessageChunk,
    HttpHeader,
    HttpMcpServer,
    McpServerStdio,
    SseMcpServer,
    ToolCallProgress,
)

from actors.log.file import read_log
from actors.log.records import Baseline, ToolResult
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.acp_editor import (
    PROBE,
    ROOT,
    AcpEnv,
    Editor,
    RawAgent,
    assert_gone,
    children_of,
    probe,
)
from tests.support.fake_llama import FakeLlama
from tests.tools.hostkit import short_dir
from tests.tools.mcp_support import http_test_server

pytestmark = pytest.mark.timeout(300)



def order(tag: str, tool: str, args: dict[str, Any]) -> str:
    return f"{tag} :: {tool} {json.dumps(args)}"


def text_of(updates: list[Any]) -> str:
    return "".join(u.content.text for u in updates if isinstance(u, AgentMessageChunk))


def results(updates: list[Any]) -> list[str]:
    return [u.content[0].content.text for u in updates
            if isinstance(u, ToolCallProgress) and u.status in ("completed", "failed")
            and u.content]


def hosts_of(pid: int) -> list[psutil.Process]:
    """The tool hosts running under ``pid`` whose MCP server is the probe."""
    found = []
    for p in children_of(pid):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if "actors.tools.host" in cmd and any(str(PROBE) in c for c in cmd):
            found.append(p)
    return found


@dataclass
class Where:
    """A ``loopd acp`` to spawn (its argv), its workspace, its sessions' directory, and the
    process its tool hosts run under (None: the agent's own)."""

    argv: list[str]
    workspace: Path
    sessions: Path
    stderr: Path
    hosts_pid: int | None = None


async def _flow(where: Where) -> dict[str, Any]:
    editor = Editor()
    spawn = {"cwd": ROOT, "env": {**os.environ, "PYTHONPATH": str(ROOT)},
             "transport_kwargs": {"stderr": where.stderr.open("ab"), "shutdown_timeout": 60}}
    seen: dict[str, Any] = {}
    async with spawn_agent_process(editor, *where.argv, **spawn) as (conn, proc):
        pid = where.hosts_pid or proc.pid
        init = await conn.initialize(protocol_version=1)
        caps = init.agent_capabilities
        assert caps is not None and caps.mcp_capabilities is not None
        assert (caps.mcp_capabilities.http, caps.mcp_capabilities.sse) == (True, False)
        mark = len(editor.updates)
        made = await conn.new_session(cwd=str(where.workspace), mcp_servers=[
            probe(LOOPD_PROBE="from-the-editor"),
            McpServerStdio(name="broken", command="/no/such/mcp-server", args=[], env=[]),
            SseMcpServer(type="sse", name="old", url="http://127.0.0.1:9/sse", headers=[]),
        ])
        session = made.session_id
        seen["meta"] = (made.field_meta or {})["loopd"]["mcpServers"]
        await editor.wait_for_updates(mark + 2)  # the notes follow the answer
        seen["notes"] = [(sid, u) for sid, u in editor.updates[mark:]]
        seen["hosts"] = len(hosts_of(pid))

        async def prompt(sid: str, text: str) -> tuple[str, list[Any]]:
            at = len(editor.updates)
            done = await conn.prompt(session_id=sid, prompt=[text_block(text)])
            return done.stop_reason, editor.since(at)

        seen["echo"] = await prompt(session, order("t1", "echo", {"text": "hello"}))
        seen["env"] = await prompt(session, order("t2", "env_var", {"name": "LOOPD_PROBE"}))
        editor.answers = ["reject_once", "allow_once"]  # loopd's approval, as for its own
        seen["denied"] = await prompt(session, order("t2b", "note", {"text": "a"}))
        seen["allowed"] = await prompt(session, order("t2c", "note", {"text": "b"}))
        seen["asked"] = [call.title for call, _ in editor.asked]
        other = (await conn.new_session(cwd=str(where.workspace), mcp_servers=[])).session_id
        seen["other"] = await prompt(other, order("u1", "echo", {"text": "hello"}))
        seen["other_session"] = other
        seen["running"] = hosts_of(pid)
        await conn.close_session(session_id=session)
        assert_gone(seen["running"])  # stopped with its session, the agent still running
        seen["session"] = session
        # resumed without them: said, and the session goes on warm (nothing else changed)
        resumed = await conn.resume_session(session_id=session, cwd=str(where.workspace),
                                            mcp_servers=[])
        seen["resumed"] = (resumed.field_meta or {})["loopd"]["mcpServers"]
        seen["after"] = await prompt(session, order("t3", "echo", {"text": "gone"}))
    return seen


def _check(where: Where, seen: dict[str, Any]) -> None:
    meta = seen["meta"]
    assert meta["started"] == ["probe"] and meta["tools"] == ["echo", "env_var", "note"], meta
    notes = meta["notes"]
    assert len(notes) == 2, notes
    assert notes[0].startswith("MCP server old was not started: its transport 'sse'")
    assert "'/no/such/mcp-server' was not found" in notes[1] and "MCP server broken" in notes[1]
    assert "client's MCP server settings" in notes[1]
    session = seen["session"]
    said = [(sid, u.content.text) for sid, u in seen["notes"]]  # said in the session
    assert said == [(session, f"loopd: {n}\n") for n in notes]
    assert seen["hosts"] == 1 and len(seen["running"]) == 1
    reason, updates = seen["echo"]  # the model calls the server's tool in its session
    assert reason == "end_turn" and results(updates) == ["hello"], updates
    reason, updates = seen["env"]  # the server got the editor's env
    assert reason == "end_turn" and results(updates) == ["from-the-editor"], updates
    assert seen["asked"] == ["note a", "note b"], seen["asked"]  # not read-only: asked
    reason, updates = seen["denied"]
    assert reason == "end_turn" and "noted" not in results(updates)[0], updates
    reason, updates = seen["allowed"]
    assert reason == "end_turn" and results(updates) == ["noted: b"], updates
    reason, updates = seen["other"]  # another session of the same client: not offered
    assert reason == "end_turn" and "There is no tool named 'echo'" in results(updates)[0]
    resumed = seen["resumed"]
    assert (resumed["started"], resumed["tools"]) == ([], [])
    assert resumed["notes"] == [
        "the tools echo, env_var, note (of the MCP servers probe it had when last opened) are not "
        "offered to this session now: give those servers again to have them back; its "
        "conversation and KV state are kept as they were"]
    reason, updates = seen["after"]
    assert reason == "end_turn" and "There is no tool named 'echo'" in results(updates)[0]
    records, _ = read_log(where.sessions / session / "log.bin", name=session)
    logged = [r.content for r in records if isinstance(r, ToolResult)]
    assert logged[:2] == ["hello", "from-the-editor"] and logged[3] == "noted: b"
    assert len(logged) == 5
    # its prompt prefix is every session's: the servers' tools are not in its Baseline
    plain, _ = read_log(where.sessions / seen["other_session"] / "log.bin",
                        name=seen["other_session"])
    assert isinstance(records[0], Baseline) and isinstance(plain[0], Baseline)
    assert (records[0].system, records[0].tools) == (plain[0].system, plain[0].tools)


def test_a_sessions_mcp_servers_are_its_own_tool_hosts(env: AcpEnv) -> None:
    where = Where(env.argv("--local"), env.workspace, env.sessions, env.stderr)
    _check(where, asyncio.run(_flow(where)))


def test_through_the_daemon_they_run_there_and_stop_with_the_session(
    tmp_path: Path, fake: FakeLlama
) -> None:
    with short_dir() as run_dir:
        root = tmp_path / "d"
        config = daemon_config(root, run_dir, fake.url)
        with Daemon(config) as daemon:
            where = Where([sys.executable, "-m", "actors.cli", "acp", "--config", str(config)],
                          root / "ws", root / "sessions", tmp_path / "acp.txt", daemon.pid)
            seen = asyncio.run(_flow(where))
            assert f"turns run in the loopd daemon (pid {daemon.pid})" in where.stderr.read_text()
    _check(where, seen)


def test_an_unknown_transport_or_a_name_clash_is_a_note_and_the_session_works(
    env: AcpEnv, raw: Callable[..., RawAgent]
) -> None:
    agent = raw("--local")
    assert "result" in agent.request("initialize", {"protocolVersion": 1})
    given = {"name": "files", "command": sys.executable, "args": [str(PROBE)], "env": []}
    rid = agent.send("session/new", {"cwd": str(env.workspace), "mcpServers": [
        {"type": "websocket", "name": "ws", "url": "ws://127.0.0.1:9"},
        given,  # "files" is the name of loopd's own tool host here
        # its tools are offered, under the host my-tools; its read_file as my-tools__read_file
        {**given, "name": "my tools", "env": [{"name": "LOOPD_PROBE_CLASH", "value": "1"}]},
    ]})
    made, _ = agent.answer(rid)
    session = made["result"]["sessionId"]
    servers = made["result"]["_meta"]["loopd"]["mcpServers"]
    assert servers["started"] == ["my-tools"]
    assert "my-tools__read_file" in servers["tools"] and "read_file" not in servers["tools"]
    notes = servers["notes"]
    assert notes[0].startswith("MCP server ws was not started: its transport 'websocket'")
    assert "MCP server files: a tool host of this session already has the name files" in notes[1]
    assert notes[2].startswith("tool read_file of MCP server my-tools is offered as "
                               "my-tools__read_file: loopd's tool host files has a tool named "
                               "read_file and keeps that name")
    following = [agent.read() for _ in notes]  # each a message in the session, after it
    assert [m["params"]["sessionId"] for m in following] == [session] * 3
    assert [m["params"]["update"]["content"]["text"] for m in following] == [
        f"loopd: {n}\n" for n in notes]
    rid = agent.send("session/prompt", {"sessionId": session, "prompt": [{
        "type": "text", "text": " :: ".join([
            order("t1", "echo", {"text": "still here"}),
            'read_file {"path": "notes.txt"}',  # loopd's own
            'my-tools__read_file {"path": "notes.txt"}'])}]})
    while "method" in (message := agent.read()):
        if message["method"] == "session/request_permission":
            agent.write(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {
                "outcome": {"outcome": "selected", "optionId": "once"}}}).encode() + b"\n")
    assert message["id"] == rid and message["result"]["stopReason"] == "end_turn", message
    assert agent.close() == 0
    logged = [r.content for r in env.records(session) if isinstance(r, ToolResult)]
    assert logged == ["still here", "Buy seeds.\n", "the probe's notes.txt"]


def test_a_session_closed_to_make_room_gets_its_servers_again_when_used(
    env: AcpEnv, tmp_path: Path
) -> None:
    """At ``daemon.max_sessions_per_client`` an idle session is closed for a new one (its
    servers stopped with it); its next prompt opens it again, and its servers with it."""
    one = tmp_path / "one.toml"
    one.write_text(env.config.read_text() + "[daemon]\nmax_sessions_per_client = 1\n")
    agent = RawAgent([sys.executable, "-m", "actors.cli", "acp", "--config", str(one), "--local"],
                     env.stderr)
    try:
        assert "result" in agent.request("initialize", {"protocolVersion": 1})
        given = {"name": "probe", "command": sys.executable, "args": [str(PROBE)], "env": []}
        first = agent.request("session/new", {"cwd": str(env.workspace),
                                              "mcpServers": [given]})["result"]["sessionId"]
        running = hosts_of(agent.proc.pid)
        assert len(running) == 1
        agent.request("session/new", {"cwd": str(env.workspace), "mcpServers": []})
        assert_gone(running)  # the first was closed to make room, its server with it
        rid = agent.send("session/prompt", {"sessionId": first, "prompt": [
            {"type": "text", "text": order("t1", "echo", {"text": "back"})}]})
        answered, _ = agent.answer(rid)
        assert answered["result"]["stopReason"] == "end_turn", answered
        assert len(hosts_of(agent.proc.pid)) == 1
        assert agent.close() == 0
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait()
    logged = [r.content for r in env.records(first) if isinstance(r, ToolResult)]
    assert logged == ["back"]


async def _http_flow(env: AcpEnv, url: str) -> dict[str, Any]:
    editor = Editor()
    spawn = {"cwd": ROOT, "env": {**os.environ, "PYTHONPATH": str(ROOT)},
             "transport_kwargs": {"stderr": env.stderr.open("ab"), "shutdown_timeout": 60}}
    bearer = [HttpHeader(name="Authorization", value="Bearer s3cret"),
              HttpHeader(name="X-Team", value="blue")]
    async with spawn_agent_process(editor, *env.argv("--local"), **spawn) as (conn, _proc):
        await conn.initialize(protocol_version=1)
        made = await conn.new_session(cwd=str(env.workspace), mcp_servers=[
            HttpMcpServer(type="http", name="remote", url=url, headers=bearer),
            HttpMcpServer(type="http", name="refused", url=url, headers=[]),
        ])
        done = await conn.prompt(session_id=made.session_id, prompt=[
            text_block(order("h1", "echo", {"text": "over http"}))])
        assert done.stop_reason == "end_turn"
        return {"session": made.session_id, "meta": (made.field_meta or {})["loopd"]}


def test_an_http_server_with_the_editors_headers(env: AcpEnv) -> None:
    """``mcpCapabilities.http``: a streamable-HTTP server (the official SDK's, refusing
    requests without its bearer token) gets the editor's headers; one without them is
    refused by the server, a note, and the session works."""
    with http_test_server("--token", "s3cret") as url:
        seen = asyncio.run(_http_flow(env, url))
    servers = seen["meta"]["mcpServers"]
    assert servers["started"] == ["remote"] and "echo" in servers["tools"]
    (note,) = servers["notes"]
    assert note.startswith("MCP server refused did not start: its tool host exited"), note
    assert "answered HTTP 401 Unauthorized" in note  # why, from the host's log
    logged = [r.content for r in env.records(seen["session"]) if isinstance(r, ToolResult)]
    assert logged == ["over http"]
