"""A child agent's tool calls in ACP, through the official Python SDK's client: every id is
unique across the tree (the child's ``CHILD:N``, its approval's the same), so an editor never
attaches a child's question to the parent's call of the same number; and the child calls the
editor's MCP servers (the session's own tool hosts) as its parent can (docs/agents.md)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from acp import spawn_agent_process, text_block
from acp.schema import ToolCallProgress, ToolCallStart

from tests.support.acp_editor import ROOT, AcpEnv, Editor, probe
from tests.support.fake_llama import FakeLlama, Reply, answer

pytestmark = pytest.mark.timeout(300)

QUESTION = "Hand the writing of c.txt to an agent."
TASK = "Write c.txt saying hi."


def script(body: dict[str, Any]) -> Reply:
    """The parent starts one agent; the child writes a file (a call needing approval); each
    answers after its calls' results. The parent's agent call and the child's write_file
    are each their session's call number 1; the child's second call is the editor's MCP
    server's tool."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return answer("done.")
    if last["content"] == QUESTION:
        return answer(tool_calls=[("agent", json.dumps({"task": TASK}))])
    return answer(tool_calls=[("write_file", json.dumps({"path": "c.txt", "content": "hi"})),
                              ("echo", json.dumps({"text": "from the editor's server"}))])


async def _flow(env: AcpEnv) -> tuple[Editor, str]:
    editor = Editor()
    editor.answers = ["allow_once"]
    spawn = {"cwd": ROOT, "env": env.environ(),
             "transport_kwargs": {"stderr": env.stderr.open("ab"), "shutdown_timeout": 60}}
    async with spawn_agent_process(editor, *env.argv("--local"), **spawn) as (conn, _):
        await conn.initialize(protocol_version=1)
        session = (await conn.new_session(cwd=str(env.workspace), mcp_servers=[probe()])
                         ).session_id
        done = await conn.prompt(session_id=session, prompt=[text_block(QUESTION)])
        assert done.stop_reason == "end_turn"
    return editor, session


def test_a_childs_calls_and_its_approval_carry_ids_unique_in_the_tree(tmp_path: Any) -> None:
    with FakeLlama(script) as fake:
        env = AcpEnv(tmp_path, fake.url)
        env.config.write_text(env.config.read_text() + "[agents]\nenabled = true\n")
        editor, session = asyncio.run(_flow(env))
    starts = [u for _, u in editor.updates if isinstance(u, ToolCallStart)]
    ids = [u.tool_call_id for u in starts]
    assert [u.title.split()[0] for u in starts] == ["agent", "write_file", "echo"], starts
    assert len(set(ids)) == 3 and ids[1] == f"{session}.a1:{ids[0]}", ids  # both number 1
    ((asked, _),) = editor.asked
    assert asked.tool_call_id == ids[1], (asked.tool_call_id, ids)  # the child's call
    ended = {u.tool_call_id: u.status for _, u in editor.updates
             if isinstance(u, ToolCallProgress) and u.status in ("completed", "failed")}
    assert ended == {i: "completed" for i in ids}, ended
    echoed = [u.content[0].content.text for _, u in editor.updates
              if isinstance(u, ToolCallProgress) and u.tool_call_id == ids[2] and u.content]
    assert echoed == ["from the editor's server"], echoed
    assert (env.workspace / "c.txt").read_text() == "hi"
