"""A real model through ``loopd acp``: the embedded llama-server and model (``embedded``
marker; skipped without the extra, a failure in CI when it is half installed). One prompt
from the Python SDK's client, the demo's question: the model reads the file with a tool and
answers from it."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from acp import spawn_agent_process, text_block
from acp.schema import AgentMessageChunk, ToolCallProgress, ToolCallStart

from tests.support.acp_editor import ROOT, Editor
from tests.support.embedded import MODEL, THREADS, require_embedded

# the defaults' baseline restored, not processed: what is shown is the turn through ACP
pytestmark = [pytest.mark.embedded, pytest.mark.baseline("defaults"), pytest.mark.timeout(600)]


async def _ask(argv: list[str], workspace: Path, stderr: Path) -> tuple[str, list[Any]]:
    editor = Editor()
    # the whole environment (the SDK passes on only PATH, HOME and a few more): the test's
    # own data, config and runtime homes (tests/conftest.py), not the person's
    spawn = {"cwd": ROOT, "env": {**os.environ, "PYTHONPATH": str(ROOT)},
             "transport_kwargs": {"stderr": stderr.open("ab"), "shutdown_timeout": 120}}
    async with spawn_agent_process(editor, *argv, **spawn) as (conn, proc):
        await conn.initialize(protocol_version=1)
        session = await conn.new_session(cwd=str(workspace), mcp_servers=[])
        done = await conn.prompt(session_id=session.session_id,
                                 prompt=[text_block("What does notes.txt say?")])
    assert proc.returncode == 0
    return done.stop_reason, [u for _, u in editor.updates]


def test_the_embedded_model_reads_a_file_and_answers_through_acp(tmp_path: Path) -> None:
    require_embedded()
    workspace = tmp_path / "ws"
    shutil.copytree(ROOT / "examples" / "workspace", workspace)
    config = tmp_path / "loopd.toml"
    config.write_text(  # the demo's settings (examples/loopd.toml), a log of the test's own
        f'[loop]\nmax_tokens = 256\n[log]\ndir = "{tmp_path / "sessions"}"\n'
        f'[tools]\nrules_file = "{tmp_path / "rules.toml"}"\n'
        # the tests' one thread and model (tests/support/embedded.py)
        f"[embedded]\nthreads = {THREADS}\nmodel = \"{MODEL}\"\n"
    )
    argv = [sys.executable, "-m", "actors.cli", "acp", "--config", str(config), "--local"]
    stderr = tmp_path / "acp-stderr.txt"
    reason, updates = asyncio.run(_ask(argv, workspace, stderr))
    said = stderr.read_text()
    assert reason == "end_turn", said
    (start,) = [u for u in updates if isinstance(u, ToolCallStart)][:1]
    assert start.kind == "read" and "notes.txt" in start.title
    results = [u for u in updates if isinstance(u, ToolCallProgress) and u.status == "completed"]
    assert results and results[0].content is not None
    assert "garden club" in results[0].content[0].content.text
    answer = "".join(u.content.text for u in updates if isinstance(u, AgentMessageChunk))
    assert any(word in answer.lower() for word in ("saturday", "garden", "gloves", "tomato")), (
        answer)
