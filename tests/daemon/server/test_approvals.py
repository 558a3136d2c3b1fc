"""actors/daemon/server/approvals.py on its own: a question sent to the client, the turn
waiting for its answer (not a late one), the deadline and the cancel; a turn's own rules.

The approver runs in the test's thread as it runs in the session actor's; the client's
answers are delivered from another thread, as the daemon's loop does.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest

from actors.approval.rulesfile import RuleStore, load_rules
from actors.base.cancel import CancelToken
from actors.base.errors import UsageError
from actors.base.events import ApprovalRequested, Choice, Decision
from actors.base.rules import Rule, RuleBook, parse_rule
from actors.daemon import protocol as p
from actors.daemon.server.approvals import RemoteApprover
from actors.service.local import TurnRules
from tests.support.watch import HANG_S

WAIT = HANG_S  # a hang guard


def question(call: int = 3) -> ApprovalRequested:
    return ApprovalRequested(call=call, tool="run_command", arguments='{"command": "git push"}',
                             prompt="run git push", rule="run_command = git push",
                             timeout_s=300.0)  # fmt: skip


class Client:
    """Receives what the approver posts; answers from its own thread once asked."""

    def __init__(self, *answers: p.Approve) -> None:
        self.posted: list[p.Message] = []
        self.asked = threading.Event()
        self.answers = answers
        self.approver = RemoteApprover(7, self.post)

    def post(self, msg: p.Message) -> None:
        self.posted.append(msg)
        self.asked.set()
        threading.Thread(target=self._answer).start()

    def _answer(self) -> None:
        for answer in self.answers:
            self.approver.answer(answer)


def test_the_question_goes_to_the_client_and_its_answer_decides() -> None:
    client = Client(p.Approve(7, 3, Choice.SESSION, "", "person"))
    decision = client.approver(question(), CancelToken(), math.inf)
    assert decision == Decision(Choice.SESSION, "", "person")
    assert client.posted == [p.Approval(7, 3, "run_command", '{"command": "git push"}',
                                        "run git push", "run_command = git push", 300.0)]


def test_a_late_answer_to_an_earlier_call_is_not_taken_for_this_one() -> None:
    client = Client(p.Approve(7, 2, Choice.ONCE), p.Approve(7, 3, Choice.DENY, "not now", ""))
    decision = client.approver(question(3), CancelToken(), math.inf)
    assert decision == Decision(Choice.DENY, "not now", "person")  # "" by: the person


def test_no_answer_by_the_deadline_is_none() -> None:
    client = Client()  # never answers
    assert client.approver(question(), CancelToken(), time.monotonic()) is None
    assert len(client.posted) == 1  # it was still asked


def test_a_cancel_ends_the_wait_with_none() -> None:
    client = Client()
    cancel = CancelToken()
    threading.Thread(target=lambda: client.asked.wait(WAIT) and cancel.cancel()).start()
    assert client.approver(question(), cancel, math.inf) is None
    assert cancel.cancelled


def test_a_turns_own_rules_add_to_the_shared_ones(tmp_path: Path) -> None:
    shared = RuleStore(tmp_path / "rules.toml", RuleBook.of(["echo"], ["run_command: rm"]))
    rules = TurnRules(shared, ("run_command: git status",))
    assert rules.book().allow == (Rule("echo"), parse_rule("run_command: git status"))
    assert rules.book().deny == (parse_rule("run_command: rm"),)
    rules.save(parse_rule("write_file"))  # an "always" answer: the shared store and its file
    assert parse_rule("write_file") in shared.book().allow
    assert load_rules(tmp_path / "rules.toml").allow == (parse_rule("write_file"),)
    other = TurnRules(shared, ())
    assert parse_rule("write_file") in other.book().allow  # every later turn has it
    assert parse_rule("run_command: git status") not in other.book().allow  # not this one's


def test_a_bad_approve_rule_is_a_usage_error_naming_the_flag() -> None:
    with pytest.raises(UsageError, match=r"^--approve: "):
        TurnRules(RuleStore(), ("run command",))
