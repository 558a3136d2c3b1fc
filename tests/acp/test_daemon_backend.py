"""``loopd acp`` runs its turns in the daemon when one answers for the session's workspace,
as ``loopd run`` does: approvals and cancels go through it, the session is attached to the
daemon's client while it is used; a project in another directory runs in its own process."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from actors.log.file import read_log
from actors.log.records import Approval, User
from tests.daemon.daemonkit import Daemon, cli, daemon_config
from tests.support.acp_editor import RawAgent
from tests.support.fake_llama import FakeLlama
from tests.tools.hostkit import short_dir

pytestmark = pytest.mark.timeout(240)


def acp(config: Path, stderr: Path) -> RawAgent:
    return RawAgent([sys.executable, "-m", "actors.cli", "acp", "--config", str(config)], stderr)


def prompt(agent: RawAgent, session: str, text: str, answer: str = "once") -> dict[str, Any]:
    """A prompt's answer; a permission request on the way gets ``answer``."""
    rid = agent.send("session/prompt", {"sessionId": session,
                                        "prompt": [{"type": "text", "text": text}]})
    while True:
        message = agent.read()
        if message.get("method") == "session/request_permission":
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "result": {"outcome": {"outcome": "selected", "optionId": answer}}}
            agent.write(json.dumps(reply).encode() + b"\n")
        elif message.get("id") == rid and "method" not in message:
            return message
        elif message.get("params", {}).get("update", {}).get("sessionUpdate") == (
                "agent_message_chunk") and "[stall]" in text:
            agent.send("session/cancel", {"sessionId": session}, notify=True)


def test_turns_run_in_the_daemon_that_serves_the_workspace(
    tmp_path: Path, fake: FakeLlama
) -> None:
    with short_dir() as run_dir:
        root = tmp_path / "d"
        config = daemon_config(root, run_dir, fake.url, allow=())  # write_file is asked
        with Daemon(config) as daemon:
            agent = acp(config, tmp_path / "acp.txt")
            session = agent.start(root / "ws")
            said = (tmp_path / "acp.txt").read_text()
            assert f"turns run in the loopd daemon (pid {daemon.pid})" in said
            shown = cli(config, "status").stdout
            assert f"session {session}: attached" in shown
            order = 't1 :: write_file {"path": "a.txt", "content": "from the editor"}'
            answered = prompt(agent, session, order)
            assert answered.get("result") == {"stopReason": "end_turn"}, answered
            assert (root / "ws" / "a.txt").read_text() == "from the editor"
            stopped = prompt(agent, session, "t2 [stall]")
            assert stopped["result"] == {"stopReason": "cancelled"}
            # session/fork goes through the daemon too: the fork is attached to this client
            forked = agent.request("session/fork", {"sessionId": session,
                                                    "cwd": str(root / "ws")})
            fork = forked["result"]["sessionId"]
            assert forked["result"]["_meta"]["loopd"]["forkedFrom"] == session
            assert f"session {fork}: attached" in cli(config, "status").stdout
            assert prompt(agent, fork, "t3")["result"] == {"stopReason": "end_turn"}
            # close detaches it in the daemon; resume attaches it again, and its turn's
            # usage_update crosses the daemon's wire
            assert "result" in agent.request("session/close", {"sessionId": session})
            assert f"session {session}: attached" not in cli(config, "status").stdout
            assert "result" in agent.request("session/resume", {
                "sessionId": session, "cwd": str(root / "ws"), "mcpServers": []})
            assert f"session {session}: attached" in cli(config, "status").stdout
            answered, seen = agent.answer(agent.send("session/prompt", {
                "sessionId": session, "prompt": [{"type": "text", "text": "t4"}]}))
            assert answered["result"] == {"stopReason": "end_turn"}
            (usage,) = [m["params"]["update"] for m in seen
                        if m["params"]["update"]["sessionUpdate"] == "usage_update"]
            assert usage["used"] > 0 and usage["_meta"]["loopd"]["cachedTokens"] > 0, usage
            assert agent.close() == 0
            assert f"session {session}" not in cli(config, "status").stdout  # detached

            # a project elsewhere: its own world, in its own process
            other = tmp_path / "other"
            other.mkdir()
            elsewhere = acp(config, tmp_path / "acp2.txt")
            elsewhere.start(other)
            refused = elsewhere.request("session/fork", {"sessionId": session,
                                                         "cwd": str(other)})
            assert f"session {session} works on {root / 'ws'}" in refused["error"]["message"]
            assert elsewhere.close() == 0
            said = (tmp_path / "acp2.txt").read_text()
            assert f"the loopd daemon serves {root / 'ws'}, not {other}" in said
            assert "turns run in this process" in said
    records, _ = read_log(root / "sessions" / session / "log.bin", name=session)
    assert [r.content for r in records if isinstance(r, User)] == [order, "t2 [stall]", "t4"]
    (approved,) = [r for r in records if isinstance(r, Approval)]
    assert (approved.decision.value, approved.by) == ("allow", "person")
    forked, _ = read_log(root / "sessions" / fork / "log.bin", name=fork)
    t4 = next(i for i, r in enumerate(records) if isinstance(r, User) and r.content == "t4")
    assert forked[:t4] == records[:t4]  # the source's records (up to the fork), then its own
    assert [r.content for r in forked if isinstance(r, User)][-1] == "t3"
