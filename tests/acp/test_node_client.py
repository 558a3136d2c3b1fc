"""A client no one here wrote: the official ACP TypeScript SDK (``@agentclientprotocol/sdk``,
pinned in tests/acp/package-lock.json, installed by ``npm ci``) drives ``loopd acp``
through the whole flow of tests/acp/flow.mjs on the fake llama-server.

Skipped only when Node.js is not installed; ``LOOPD_REQUIRE_NODE=1`` (CI) makes that, or a
missing ``npm ci``, a failure instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from actors.log.records import ToolResult, Usage, User
from tests.support.acp_editor import ROOT, AcpEnv, check_flow_log

HERE = ROOT / "tests" / "acp"
REQUIRED = os.environ.get("LOOPD_REQUIRE_NODE") == "1"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if REQUIRED:
            pytest.fail("node is not installed and LOOPD_REQUIRE_NODE=1")
        pytest.skip("Node.js is not installed (the TypeScript SDK's client needs it)")
    if not (HERE / "node_modules" / "@agentclientprotocol" / "sdk").is_dir():
        message = "the TypeScript SDK is not installed: run `npm ci` in tests/acp (make test does)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    return node


@pytest.mark.timeout(300)
def test_the_typescript_sdk_client_drives_a_whole_session(env: AcpEnv) -> None:
    node = _node()
    compacting = env.root / "compacting.toml"  # compacts within a few turns
    compacting.write_text(env.config.read_text() + "[session]\ncompact_at = 0.05\n"
                          "compact_keep = 0.1\n")
    argv = env.argv("--local")
    setup = {"argv": argv, "cwd": str(ROOT), "workspace": str(env.workspace),
             "stderr": str(env.stderr), "probe": [sys.executable, str(HERE / "mcp_probe.py")],
             "argvCompact": [*argv[:argv.index("--config") + 1], str(compacting), "--local"]}
    done = subprocess.run([node, "flow.mjs"], cwd=HERE, capture_output=True, text=True,
                          timeout=290, env={**env.environ(), "LOOPD_ACP": json.dumps(setup)},
                          check=False)
    assert done.returncode == 0, (
        f"{done.stderr}\n--- loopd acp's stderr ---\n{env.stderr.read_text()[-4000:]}")
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["replayed"] > 20
    check_flow_log(env, summary["sessionId"])
    # resumed warm: the first request after session/resume processed only its own tokens
    first, after = [r for r in env.records(summary["resumed"]) if isinstance(r, Usage)]
    assert after.timings["cache_n"] >= first.prompt_tokens, (first, after)
    assert after.timings["prompt_n"] < after.prompt_tokens - first.prompt_tokens, after
    # each request's usage_update says what its Usage record says, the slot's size beside it
    for record, seen in zip((first, after), summary["usage"], strict=True):
        assert seen == {
            "used": record.prompt_tokens + record.completion_tokens, "size": 8192,
            "promptTokens": record.prompt_tokens, "completionTokens": record.completion_tokens,
            "cachedTokens": record.timings["cache_n"],
            "processedTokens": record.timings["prompt_n"],
        }, (seen, record)
    assert not (env.sessions / summary["deleted"]).exists()
    # forked at turn 1: the source's first turn, then its own
    users = [r.content for r in env.records(summary["forkedAt1"]) if isinstance(r, User)]
    assert users == ["r1 the first message of a session to close", "r3"]
    assert summary["compaction"]["_meta"]["loopd"]["why"] == "auto"
    # the editor's stdio MCP server's tool, called in its session: in the log
    (result,) = [r for r in env.records(summary["mcp"]) if isinstance(r, ToolResult)]
    assert result.content == "from the editor"
