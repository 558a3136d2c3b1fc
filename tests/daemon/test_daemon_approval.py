"""Approvals through the daemon: the question travels to the client, its answer decides.

The daemon's tool host runs write_file, which needs approval here (``tools.allow`` has only
run_command); the client's ``on_approval`` is the same Approver interface a turn takes
in-process (:mod:`actors.approval.gate`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.base.cancel import CancelToken
from actors.base.events import NO_APPROVER, ApprovalDecided, ApprovalRequested, Choice, Decision
from actors.log.records import Approval, ApprovalDecision, ApprovalScope, ToolResult
from tests.daemon.daemonkit import Daemon, cli, client_gone_mid_turn


def _write(tag: str, name: str) -> str:
    return f'{tag} :: write_file {json.dumps({"path": name, "content": "written"})}'


class Person:
    """An approver that answers ``decision`` and keeps what it was asked."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[ApprovalRequested] = []

    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision:
        assert not cancel.cancelled
        self.asked.append(request)
        return self.decision


def test_an_approval_travels_to_the_client_and_its_answer_lets_the_call_run(
    asking_daemon: Daemon,
) -> None:
    ws = Path(asking_daemon.config.tools.workspace)
    person = Person(Decision(Choice.ONCE))
    with asking_daemon.client() as client:
        turn = client.turn("s", _write("t1", "out.txt"), person)
        events = list(turn)
        records = client.read_log("s")
    assert [(r.tool, r.call) for r in person.asked] == [("write_file", 1)]
    assert "out.txt" in person.asked[0].arguments and person.asked[0].prompt
    assert (ws / "out.txt").read_text() == "written"
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ApprovalRequested") < kinds.index("ApprovalDecided")
    decided = next(e for e in events if isinstance(e, ApprovalDecided))
    assert (decided.decision, decided.scope, decided.by) == ("allow", "once", "person")
    approval = next(i for i, r in enumerate(records) if isinstance(r, Approval))
    result = next(i for i, r in enumerate(records) if isinstance(r, ToolResult))
    assert approval < result  # the decision is logged before the call's result
    assert records[approval].decision is ApprovalDecision.ALLOW
    assert turn.outcome is not None and turn.outcome.content == "done t1."


def test_a_denial_with_a_reason_reaches_the_model_and_nothing_runs(asking_daemon: Daemon) -> None:
    ws = Path(asking_daemon.config.tools.workspace)
    with asking_daemon.client() as client:
        client.turn("s", _write("t1", "no.txt"), Person(Decision(Choice.DENY, "not now")))\
            .run(lambda e: None)
        records = client.read_log("s")
    assert not (ws / "no.txt").exists()
    result = next(r for r in records if isinstance(r, ToolResult))
    assert "the person said no: not now" in result.content


def test_without_an_approver_the_client_denies_as_in_process(asking_daemon: Daemon) -> None:
    with asking_daemon.client() as client:
        client.turn("s", _write("t1", "none.txt")).run(lambda e: None)
        records = client.read_log("s")
    approval = next(r for r in records if isinstance(r, Approval))
    assert (approval.decision, approval.by, approval.reason) == (
        ApprovalDecision.DENY, "no approver", NO_APPROVER)  # fmt: skip


def test_for_this_session_is_asked_once(asking_daemon: Daemon) -> None:
    person = Person(Decision(Choice.SESSION))
    with asking_daemon.client() as client:
        for n in (1, 2):  # the same file twice: a grant is the path the person saw
            client.turn("s", _write(f"t{n}", "f1.txt"), person).run(lambda e: None)
        records = client.read_log("s")
    assert len(person.asked) == 1
    scopes = [(r.scope, r.by) for r in records if isinstance(r, Approval)]
    assert scopes == [(ApprovalScope.SESSION, "person"), (ApprovalScope.SESSION, "session")]


def test_a_client_gone_while_an_approval_waits_cancels_the_turn(asking_daemon: Daemon) -> None:
    ws = Path(asking_daemon.config.tools.workspace)
    with client_gone_mid_turn(asking_daemon, "s", _write("t1", "late.txt"),
                              "--hang-on-approval") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "asked":
                break
    with asking_daemon.client() as client:
        records = client.read_log("s")
        assert client.turn("s", "t2 :: list_dir {}").run(lambda e: None).content == "done t2."
    approval = next(r for r in records if isinstance(r, Approval))
    assert (approval.decision, approval.by) == (ApprovalDecision.DENY, "cancel")
    assert not any(isinstance(r, ToolResult) for r in records)
    assert not (ws / "late.txt").exists()


def _approvals(daemon: Daemon, session: str) -> list[tuple[object, ...]]:
    with daemon.client() as client:
        records = client.read_log(session)
    return [(r.decision, r.scope, r.by, r.reason, r.rule) for r in records
            if isinstance(r, Approval)] + [
        ("result", r.content) for r in records if isinstance(r, ToolResult)]  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "stdin"),
    [(("--json",), '{"decision": "once"}\n'), (("--approve", "write_file"), None), ((), None)],
    ids=["json-answer", "approve-flag", "no-terminal"],
)
def test_loopd_run_decides_through_the_daemon_as_in_process(
    asking_daemon: Daemon, flags: tuple[str, ...], stdin: str | None
) -> None:
    runs = {}
    for session, extra in (("remote", ()), ("local", ("--local",))):
        runs[session] = cli(asking_daemon.config_path, "run", _write("t1", f"{session}.txt"),
                            "--session", session, *flags, *extra, stdin=stdin)  # fmt: skip
        assert runs[session].returncode == 0, runs[session].stderr
    remote, local = _approvals(asking_daemon, "remote"), _approvals(asking_daemon, "local")
    assert [str(x).replace("remote", "S") for x in remote] == [
        str(x).replace("local", "S") for x in local]  # fmt: skip
    assert remote  # an approval was decided
    if "--json" in flags:
        names = [[json.loads(line)["event"] for line in r.stdout.splitlines()]
                 for r in runs.values()]  # fmt: skip
        assert [n for n in names[0] if n != "status"] == [n for n in names[1] if n != "status"]
        assert "approval_requested" in names[0] and "approval_decided" in names[0]
