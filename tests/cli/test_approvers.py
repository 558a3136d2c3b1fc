"""The CLI approvers' own parts: folding, the JSON answer, the no-terminal message, the lines
the live view and ``loopd log show`` print for a decision. The prompts themselves run in a
pseudo-terminal in tests/cli/test_cli_approval.py."""

from __future__ import annotations

import io
import os
import threading

import pytest
from rich.console import Console

from actors.base.cancel import CancelToken
from actors.base.events import ApprovalDecided, ApprovalRequested, Choice, Decision
from actors.cli.approvers import FOLD_CHARS, JsonApprover, NoTerminal, fold, parse_answer
from actors.cli.view import LiveView, describe
from actors.log.records import Approval, ApprovalDecision, ApprovalScope


def request(rule: str = "run_command: git status", **kw: object) -> ApprovalRequested:
    return ApprovalRequested(call=3, tool="run_command", arguments='{"command": "git status"}',
                             prompt="Allow?", rule=rule, **kw)  # type: ignore[arg-type]


def test_long_arguments_are_folded_with_what_is_left_out() -> None:
    assert fold("short") == "short"
    long = "x" * (FOLD_CHARS + 50)
    assert fold(long) == "x" * FOLD_CHARS + "… [50 more characters; v shows all]"
    lines = "\n".join(f"line {i}" for i in range(20))
    folded = fold(lines)
    assert folded.startswith("line 0\nline 1") and "line 6" not in folded
    assert folded.endswith(f"[{len(lines) - len(folded.split('…')[0])} more characters; "
                           "v shows all]")
    assert fold({"a": 1}) == '{"a": 1}'


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"decision": "once"}', Decision(Choice.ONCE)),
        ('{"decision": "always"}', Decision(Choice.ALWAYS)),
        ('{"decision": "deny", "reason": "no"}', Decision(Choice.DENY, "no")),
        ("yes", "not JSON"),
        ('["once"]', 'a JSON object with "decision"'),
        ('{"decision": "forever"}', "'forever' is not one of once, session, always, deny"),
        ('{"decision": "deny", "reason": 3}', '"reason" must be a string'),
    ],
)
def test_json_answers(line: str, expected: Decision | str) -> None:
    got = parse_answer(line)
    if isinstance(expected, Decision):
        assert got == expected
    else:
        assert isinstance(got, str) and expected in got


def test_the_json_approver_reads_lines_until_an_answer_and_denies_at_the_end_of_stdin() -> None:
    said: list[dict[str, object]] = []
    r, w = os.pipe()
    try:
        # three lines in one write, and the answer to the next request sent ahead
        os.write(w, b'\nnope\n{"decision": "session"}\n{"decision": "deny"}\n')
        approver = JsonApprover(said.append, r)
        assert approver(request(), CancelToken(), float("inf")) == Decision(Choice.SESSION)
        assert [s["event"] for s in said] == ["approval_invalid"]
        assert approver(request(), CancelToken(), float("inf")) == Decision(Choice.DENY)
        os.close(w)
        w = -1
        ended = approver(request(), CancelToken(), float("inf"))
        assert ended is not None and ended.choice is Choice.DENY
        assert ended.by == "no answer on stdin"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_the_json_approver_gives_up_on_cancel() -> None:
    r, w = os.pipe()
    cancel = CancelToken()
    try:
        threading.Timer(0.05, cancel.cancel).start()
        assert JsonApprover(lambda _: None, r)(request(), cancel, float("inf")) is None
    finally:
        os.close(r)
        os.close(w)


def test_no_terminal_names_the_flag_and_the_rule_that_would_allow_it() -> None:
    decision = NoTerminal()(request(), CancelToken(), 0.0)
    assert decision.choice is Choice.DENY and decision.by == "no terminal"
    assert "--approve 'run_command: git status'" in decision.reason
    assert '"run_command: git status" to tools.allow' in decision.reason
    ops = NoTerminal()(request(rule=""), CancelToken(), 0.0)
    assert "only --approve run_command" in ops.reason


@pytest.mark.parametrize(
    ("decision", "scope", "by", "rule", "reason", "line"),
    [
        ("allow", "once", "person", "", "", "allowed once (person)"),
        ("allow", "session", "person", "run_command: ls", "",
         "allowed for this session: run_command: ls (person)"),
        ("allow", "always", "person", "write_file", "",
         "allowed always: write_file (person)"),
        ("allow", "always", "rule", "run_command: git", "", "allowed by the rule run_command: git"),
        ("allow", "session", "session", "run_command: ls", "",
         "allowed by this session's earlier answer (run_command: ls)"),
        ("deny", "once", "timeout", "", "no answer within 5 s", "denied (timeout): no answer "
         "within 5 s"),
    ],
)
def test_each_decision_has_a_line(
    decision: str, scope: str, by: str, rule: str, reason: str, line: str
) -> None:
    record = Approval(call=2, tool="run_command", decision=ApprovalDecision(decision),
                      scope=ApprovalScope(scope), by=by, reason=reason, rule=rule)
    assert describe(record) == f"call 2 run_command: {line}"
    out = io.StringIO()
    LiveView(Console(file=out, width=200))(ApprovalDecided(
        call=2, tool="run_command", decision=decision, scope=scope, by=by, reason=reason,
        rule=rule))
    assert out.getvalue().strip() == line


def test_what_an_always_answer_allows_is_said_in_words() -> None:
    from actors.cli.approvers import allows

    assert allows("write_file = notes.txt") == (
        "write_file on the path notes.txt only [write_file = notes.txt]")
    assert allows("write_file") == "every write_file call, whatever its arguments [write_file]"
    assert allows("run_command = git status") == (
        "the command `git status` exactly, nothing added [run_command = git status]")
    assert allows("run_command: git") == "commands starting with `git` [run_command: git]"
    assert allows("write_file: notes") == "write_file on paths under notes [write_file: notes]"
