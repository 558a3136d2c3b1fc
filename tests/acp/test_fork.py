"""``session/fork`` (unstable in ACP) is ``loopd sessions fork``: the official Python SDK's
client forks a session of ``loopd acp`` and prompts the fork, on the fake llama-server that
saves and restores real slot files. The fork is a new session name holding the source's
conversation and a ``Forked`` note; its first request is served from the source's saved KV
state; the source's log is unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, spawn_agent_process, text_block

from actors.inference.slots.keeper import FORKED
from actors.log.records import CacheLoss, Forked, Usage, User
from actors.session.messages import messages
from tests.support.acp_editor import ROOT, AcpEnv, Editor, model
from tests.support.fake_llama import FakeLlama

pytestmark = pytest.mark.timeout(300)


async def _fork(env: AcpEnv, fake: FakeLlama) -> dict[str, Any]:
    editor = Editor()
    spawn = {"cwd": ROOT, "env": env.environ(),
             "transport_kwargs": {"stderr": env.stderr.open("ab"), "shutdown_timeout": 60}}
    async with spawn_agent_process(editor, *env.argv("--local"), **spawn) as (conn, _proc):
        init = await conn.initialize(protocol_version=1)
        capabilities = init.agent_capabilities
        assert capabilities is not None and capabilities.session_capabilities is not None
        assert capabilities.session_capabilities.fork is not None  # declared
        source = (await conn.new_session(cwd=str(env.workspace), mcp_servers=[])).session_id
        for tag in ("t1", "t2"):
            done = await conn.prompt(session_id=source, prompt=[text_block(tag)])
            assert done.stop_reason == "end_turn"
        before = hashlib.sha256((env.sessions / source / "log.bin").read_bytes()).hexdigest()

        forked = await conn.fork_session(session_id=source, cwd=str(env.workspace))
        fork = forked.session_id
        assert fork != source
        meta = (forked.field_meta or {})["loopd"]
        assert (meta["forkedFrom"], meta["atTurn"]) == (source, 2) and meta["stateTokens"] > 0
        done = await conn.prompt(session_id=fork, prompt=[text_block("t3")])
        assert done.stop_reason == "end_turn"
        sent = fake.requests[-1]["messages"]

        with pytest.raises(RequestError) as missing:
            await conn.fork_session(session_id="no-such-session", cwd=str(env.workspace))
        assert "session no-such-session does not exist" in str(missing.value)
        assert missing.value.data == {"loopd": "SessionError", "exitCode": 5}
    source_log = (env.sessions / source / "log.bin").read_bytes()
    return {"source": source, "fork": fork, "sent": sent,
            "unchanged": hashlib.sha256(source_log).hexdigest() == before}


def test_the_python_sdk_client_forks_a_session_and_the_fork_starts_warm(
    tmp_path: Path,
) -> None:
    (tmp_path / "save").mkdir()
    with FakeLlama(model(), save_dir=tmp_path / "save") as fake:
        env = AcpEnv(tmp_path, fake.url)
        with env.config.open("a") as f:
            f.write(f'[slots]\nsave_dir = "{tmp_path / "save"}"\n')
        result = asyncio.run(_fork(env, fake))
    assert result["unchanged"]  # the source's bytes
    records = env.records(result["fork"])
    assert [r.content for r in records if isinstance(r, User)] == ["t1", "t2", "t3"]
    (note,) = [r for r in records if isinstance(r, Forked)]
    assert (note.from_, note.at) == (result["source"], 2)
    # the fork's first request: the source's conversation and the new message
    asked = next(i for i, r in enumerate(records) if isinstance(r, User) and r.content == "t3")
    assert result["sent"] == messages(records[0], records[: asked + 1])
    # ... served from the source's saved state (a new process: only the file could)
    usage = [r for r in records if isinstance(r, Usage)][-1]
    assert usage.slot is not None and FORKED.format(origin=result["source"]) in usage.slot.reason
    assert usage.slot.restored > 0 and not [r for r in records if isinstance(r, CacheLoss)]
