"""``session/resume`` in a new ``loopd acp`` process is warm: the official Python SDK's
client makes a session and closes it in one process, resumes it in another (no history
replayed), and that process's first request is served from the session's saved KV state
(the fake llama-server saves and restores real slot files), processing only its new
tokens, as ``loopd run`` reopening a session does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from acp import spawn_agent_process, text_block

from actors.log.records import CacheLoss, SlotState, Usage, User
from tests.support.acp_editor import ROOT, AcpEnv, Editor, model
from tests.support.fake_llama import FakeLlama

pytestmark = pytest.mark.timeout(300)


def _spawn(env: AcpEnv) -> dict[str, Any]:
    return {"cwd": ROOT, "env": env.environ(),
            "transport_kwargs": {"stderr": env.stderr.open("ab"), "shutdown_timeout": 60}}


async def _make(env: AcpEnv) -> str:
    editor = Editor()
    async with spawn_agent_process(editor, *env.argv("--local"), **_spawn(env)) as (conn, _):
        await conn.initialize(protocol_version=1)
        session = (await conn.new_session(cwd=str(env.workspace), mcp_servers=[])).session_id
        for tag in ("t1", "t2"):
            assert (await conn.prompt(session_id=session,
                                      prompt=[text_block(tag)])).stop_reason == "end_turn"
        await conn.close_session(session_id=session)
    return session


async def _resume(env: AcpEnv, session: str) -> int:
    editor = Editor()
    async with spawn_agent_process(editor, *env.argv("--local"), **_spawn(env)) as (conn, _):
        init = await conn.initialize(protocol_version=1)
        assert init.agent_capabilities is not None
        assert init.agent_capabilities.session_capabilities is not None
        assert init.agent_capabilities.session_capabilities.resume is not None
        await conn.resume_session(session_id=session, cwd=str(env.workspace), mcp_servers=[])
        replayed = len(editor.updates)
        done = await conn.prompt(session_id=session, prompt=[text_block("t3")])
        assert done.stop_reason == "end_turn"
    return replayed


def test_resume_in_a_new_process_restores_the_saved_state_and_replays_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "save").mkdir()
    with FakeLlama(model(), save_dir=tmp_path / "save") as fake:
        env = AcpEnv(tmp_path, fake.url)
        with env.config.open("a") as f:
            f.write(f'[slots]\nsave_dir = "{tmp_path / "save"}"\n')
        session = asyncio.run(_make(env))
        assert asyncio.run(_resume(env, session)) == 0  # no history replayed
    records = env.records(session)
    assert [r.content for r in records if isinstance(r, User)] == ["t1", "t2", "t3"]
    before, after = [r for r in records if isinstance(r, Usage)][-2:]
    assert after.slot is not None and after.slot.state is SlotState.RESTORED, after.slot
    assert after.slot.restored >= before.prompt_tokens
    processed = after.timings["prompt_n"]
    assert isinstance(processed, int) and processed < after.prompt_tokens - before.prompt_tokens
    assert not [r for r in records if isinstance(r, CacheLoss)]
