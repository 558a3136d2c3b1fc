"""``loopd chat`` through the daemon on a terminal (pexpect): an approval asked at the
prompt as in-process, Ctrl-C cancelling a turn (its command killed), Ctrl-D leaving."""

from __future__ import annotations

import json
from pathlib import Path

from actors.log.records import Approval, ApprovalDecision, ApprovalScope, ToolResult
from tests.daemon.daemonkit import Daemon, chat
from tests.support.terminal import leave
from tests.support.watch import wait_until


def _sleeping(daemon: Daemon) -> bool:
    return any("sleep 60" in c for c in daemon.commands())


def test_chat_through_the_daemon_asks_cancels_and_leaves(asking_daemon: Daemon) -> None:
    with chat(asking_daemon.config_path, "c") as child:
        child.expect("Ctrl-D leaves")
        child.expect("> ")
        write = json.dumps({"path": "chat.txt", "content": "from chat"})
        child.sendline(f"t1 :: write_file {write}")
        child.expect("wants to run")  # the daemon's question, asked at this terminal
        child.expect("Ctrl-C cancels the turn")
        child.send("y")
        child.expect(r"done t1\.")
        child.expect("> ")
        child.sendline('t2 :: run_command {"command": "sleep 60; echo too-late"}')
        child.expect("run_command")
        wait_until(lambda: _sleeping(asking_daemon), 20, "the command to run in the daemon's host")
        child.sendintr()  # Ctrl-C: the turn is cancelled in the daemon
        child.expect("Cancelled")
        child.expect("> ")
        wait_until(lambda: not _sleeping(asking_daemon), 20, "the cancelled command to be killed")
        leave(child)
    with asking_daemon.client() as client:
        records = client.read_log("c")
    approvals = [r for r in records if isinstance(r, Approval)]
    assert [(a.decision, a.scope, a.by) for a in approvals] == [
        (ApprovalDecision.ALLOW, ApprovalScope.ONCE, "person")]  # fmt: skip
    assert (Path(asking_daemon.config.tools.workspace) / "chat.txt").read_text() == "from chat"
    assert len([r for r in records if isinstance(r, ToolResult)]) == 1  # t2 wrote none
