"""The turn waits for approval: each decision, the timeout, cancel, rules, the session's grants.

Actor-level: a fake llama-server over real HTTP, the inference actor, a real log, and a
scripted tool port that answers PendingApproval like a host until a call comes approved.
The real terminal prompt and real tool hosts are in tests/cli/test_cli_approval.py.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from actors.approval import rulesfile
from actors.approval.rulesfile import RuleStore, load_rules
from actors.base.cancel import CancelToken
from actors.base.errors import Cancelled, RulesError
from actors.base.events import NO_APPROVER, ApprovalDecided, ApprovalRequested, Choice, Decision
from actors.base.rules import Rule
from actors.log.file import SessionLog
from actors.log.records import Approval, ApprovalDecision, ApprovalScope, ToolResult
from actors.session.messages import MISSING_RESULT
from actors.session.turn import Runtime, TurnOutcome, run_turn
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from actors.tools.registry import Registry
from tests.support.fake_llama import answer
from tests.support.turn_rig import ECHO, Rig, ScriptedPort, baseline

Make = Callable[..., Rig]

RUN = ToolSpec(
    name="run_command", description="Run a command.", needs_approval=True,
    parameters={"type": "object", "properties": {"command": {"type": "string"}},
                "required": ["command"]},
)


def run(command: str) -> tuple[str, str]:
    return ("call_tool", json.dumps({"name": "run_command", "arguments": {"command": command}}))


class Person:
    """An approver that answers from a list and keeps every request it was asked."""

    def __init__(self, *answers: Decision | None) -> None:
        self.answers = list(answers)
        self.asked: list[ApprovalRequested] = []

    def __call__(self, request: ApprovalRequested, cancel: CancelToken,
                 deadline: float) -> Decision | None:
        self.asked.append(request)
        return self.answers.pop(0)


def setup(rig: Make, script: list[Any], tmp_path: Path, **tools: Any) -> tuple[Rig, ScriptedPort]:
    port = ScriptedPort(lambda tool, args: wire.Result(
        content=f"ran {args.get('command', args.get('text'))}"), specs=(ECHO, RUN))
    r = rig(script, Registry([port]))
    config = r.config.replace("tools", **tools) if tools else r.config
    r.runtime = dataclasses.replace(r.runtime, config=config,
                                    rules=RuleStore(tmp_path / "rules.toml"))
    return r, port


def turn(r: Rig, approver: Any = None, cancel: CancelToken | None = None) -> TurnOutcome:
    return run_turn(r.log, r.runtime, "go", r.events.append, cancel, approver)


def approvals(r: Rig) -> list[Approval]:
    return [x for x in r.records if isinstance(x, Approval)]


def results(r: Rig) -> list[str]:
    return [x.content for x in r.records if isinstance(x, ToolResult)]


def test_allow_once_runs_the_call_after_the_person_says_yes(rig: Make, tmp_path: Path) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git status")]),
                          answer(tool_calls=[run("git status -s")]), answer("done")], tmp_path)
    person = Person(Decision(Choice.ONCE), Decision(Choice.ONCE))
    assert turn(r, person).content == "done"
    assert [c[2:] for c in port.calls] == [("run_command", {"command": "git status"}),
                                           ("run_command", {"command": "git status -s"})]
    # asked twice: once is once
    assert [(q.tool, json.loads(q.arguments), q.rule, q.call) for q in person.asked] == [
        ("run_command", {"command": "git status"}, "run_command = git status", 1),
        ("run_command", {"command": "git status -s"}, "run_command = git status -s", 2)]
    assert person.asked[0].prompt == "Allow run_command?"  # the host's prompt, passed on
    assert r.kinds() == ["User", "Assistant", "Usage", "Approval", "ToolResult",
                         "Assistant", "Usage", "Approval", "ToolResult", "Assistant", "Usage"]
    first = approvals(r)[0]
    assert (first.call, first.tool, first.decision, first.scope, first.by, first.rule) == (
        1, "run_command", ApprovalDecision.ALLOW, ApprovalScope.ONCE, "person", "")
    assert results(r) == ["ran git status", "ran git status -s"]
    decided = [e for e in r.events if isinstance(e, ApprovalDecided)]
    assert [(e.call, e.decision, e.scope, e.by) for e in decided] == [
        (1, "allow", "once", "person"), (2, "allow", "once", "person")]
    # the request was emitted to the sink too, before the decision
    assert r.events.index(person.asked[0]) < r.events.index(decided[0])


def test_deny_with_a_reason_the_model_reads(rig: Make, tmp_path: Path) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("rm -rf build")]), answer("ok")], tmp_path)
    assert turn(r, Person(Decision(Choice.DENY, "use make clean"))).content == "ok"
    assert port.calls == []
    assert results(r) == ["The call was denied: the person said no: use make clean"]
    (a,) = approvals(r)
    assert (a.decision, a.by, a.reason) == (ApprovalDecision.DENY, "person",
                                            "the person said no: use make clean")
    tool_message = r.fake.requests[-1]["messages"][-1]
    assert tool_message["content"] == results(r)[0]  # what the model read


def test_for_this_session_is_kept_and_reread_when_the_session_reopens(
    rig: Make, tmp_path: Path
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git status")]), answer("one"),
                          answer(tool_calls=[run("git  status")]), answer("two"),
                          answer(tool_calls=[run("git status -s")]), answer("three"),
                          answer(tool_calls=[run("git status")]), answer("four")],
                    tmp_path)
    person = Person(Decision(Choice.SESSION), Decision(Choice.DENY))
    turn(r, person)
    turn(r, person)  # the same words: granted by the first answer, not asked
    turn(r, person)  # git status -s: more than the person saw, asked (and denied)
    assert [json.loads(q.arguments)["command"] for q in person.asked] == [
        "git status", "git status -s"]
    assert [(a.scope, a.by, a.rule) for a in approvals(r)][:2] == [
        (ApprovalScope.SESSION, "person", "run_command = git status"),
        (ApprovalScope.SESSION, "session", "run_command = git status")]
    # reopen: a new log object (as a new command would), the same file
    r.log.close()
    r.log, _ = SessionLog.open(r.path, fsync="never", name="s")
    nobody = Person()  # would fail if asked
    turn(r, nobody)
    assert nobody.asked == []
    assert [c[3]["command"] for c in port.calls] == ["git status", "git  status",
                                                     "git status"]
    # nothing reached the rules file: "session" is not "always"
    assert load_rules(tmp_path / "rules.toml").allow == ()


def test_always_saves_a_rule_in_force_at_once_and_for_every_session(
    rig: Make, tmp_path: Path
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("make test")]), answer("one"),
                          answer(tool_calls=[run("make 'test'")]), answer("two")], tmp_path)
    person = Person(Decision(Choice.ALWAYS))
    turn(r, person)
    assert load_rules(tmp_path / "rules.toml").allow == (
        Rule("run_command", ("make", "test"), exact=True),)
    (a,) = approvals(r)
    assert (a.scope, a.rule) == (ApprovalScope.ALWAYS, "run_command = make test")
    # a fresh log with no grants: the saved rule allows it (by rule, not by the session)
    r.log.close()
    r.path.unlink()
    r.log, _ = SessionLog.open(r.path, fsync="never", baseline=baseline(), name="s")
    r.runtime = dataclasses.replace(r.runtime, rules=RuleStore(tmp_path / "rules.toml"))
    turn(r, Person())
    (b,) = approvals(r)
    assert (b.by, b.rule, b.scope) == ("rule", "run_command = make test", ApprovalScope.ALWAYS)
    assert [c[3]["command"] for c in port.calls] == ["make test", "make 'test'"]


def test_never_saves_a_deny_rule_that_refuses_the_next_call_without_asking(
    rig: Make, tmp_path: Path
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git push")]), answer("one"),
                          answer(tool_calls=[run("git push")]), answer("two"),
                          answer(tool_calls=[run("git push --force")]), answer("three")],
                    tmp_path)
    person = Person(Decision(Choice.NEVER))
    turn(r, person)
    exact = Rule("run_command", ("git", "push"), exact=True)  # what the person was shown
    assert load_rules(tmp_path / "rules.toml").deny == (exact,)
    assert load_rules(tmp_path / "rules.toml").allow == ()
    (a,) = approvals(r)
    assert (a.decision, a.scope, a.by, a.rule) == (
        ApprovalDecision.DENY, ApprovalScope.ALWAYS, "person", "run_command = git push")
    turn(r, Person())  # would fail if asked: the deny rule is in force at once
    turn(r, Person())  # a deny rule holds against more of the command, too (base.rules)
    assert [(x.by, x.rule) for x in approvals(r)][1:] == [("rule", "run_command = git push")] * 2
    assert port.calls == []  # no call reached the host
    assert results(r)[0] == "The call was denied: the person said no"


def test_never_on_a_call_no_rule_can_match_denies_it_once(rig: Make, tmp_path: Path) -> None:
    r, _ = setup(rig, [answer(tool_calls=[run("ls | wc -l")]), answer("ok")], tmp_path)
    turn(r, Person(Decision(Choice.NEVER)))
    assert [(a.decision, a.scope, a.rule) for a in approvals(r)] == [
        (ApprovalDecision.DENY, ApprovalScope.ONCE, "")]
    assert not (tmp_path / "rules.toml").exists()


def test_a_deny_rule_that_cannot_be_saved_denies_once_and_says_why(
    rig: Make, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git push")]), answer("ok")], tmp_path)

    def cannot(path: Path, rule: Rule, *, deny: bool = False) -> None:
        raise RulesError(f"rules file {path}: cannot save the rule {str(rule)!r}: disk full")

    monkeypatch.setattr(rulesfile, "save_rule", cannot)
    turn(r, Person(Decision(Choice.NEVER)))
    (a,) = approvals(r)
    assert (a.decision, a.scope, a.rule) == (ApprovalDecision.DENY, ApprovalScope.ONCE, "")
    assert "not saved as a rule" in a.reason and "disk full" in a.reason
    assert port.calls == []


def test_a_rules_file_gone_bad_after_the_start_asks_and_says_why(
    rig: Make, tmp_path: Path
) -> None:
    """Its deny rules cannot be read, so no rule applies: the person is asked (here: a call
    an allow rule of the file allowed) and the decision says why."""
    r, port = setup(rig, [answer(tool_calls=[run("git push")]), answer("ok")], tmp_path)
    path = tmp_path / "rules.toml"
    path.write_text('allow = ["run_command: git"]\n')
    r.runtime = dataclasses.replace(r.runtime, rules=RuleStore(path))
    path.write_text('allow = ["run command"]\n')  # malformed, after the start
    person = Person(Decision(Choice.NEVER))
    turn(r, person)
    (asked,) = person.asked
    assert asked.rule == "" and asked.prompt.startswith("loopd: rules file")
    (a,) = approvals(r)
    assert (a.decision, a.scope, a.rule) == (ApprovalDecision.DENY, ApprovalScope.ONCE, "")
    assert "line 1" in a.reason and "needs approval is asked" in a.reason
    assert port.calls == []


def test_a_command_with_shell_operators_can_only_be_allowed_once(
    rig: Make, tmp_path: Path
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("ls | wc -l")]),
                          answer(tool_calls=[run("ls | wc")]), answer("ok")], tmp_path)
    person = Person(Decision(Choice.ALWAYS), Decision(Choice.SESSION))
    turn(r, person)
    assert [q.rule for q in person.asked] == ["", ""]  # asked both times
    assert [(a.scope, a.rule) for a in approvals(r)] == [(ApprovalScope.ONCE, "")] * 2
    assert load_rules(tmp_path / "rules.toml").allow == ()
    assert len(port.calls) == 2


def test_no_answer_in_time_is_a_denial_that_says_so(rig: Make, tmp_path: Path) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git push")]), answer("ok")], tmp_path,
                    approval_timeout_s=0.05)
    seen: list[float] = []

    def waits(request: ApprovalRequested, cancel: CancelToken, deadline: float) -> None:
        seen.append(request.timeout_s)
        cancel.wait(max(0.0, deadline - time.monotonic()))  # nobody answers until the deadline
        return None

    turn(r, waits)
    assert seen == [0.05]
    assert port.calls == []
    (a,) = approvals(r)
    assert (a.decision, a.by) == (ApprovalDecision.DENY, "timeout")
    assert results(r) == ["The call was denied: no answer within 0.05 s "
                          "(tools.approval_timeout_s), so it did not run"]


def test_cancel_while_waiting_ends_the_turn_and_nothing_runs(rig: Make, tmp_path: Path) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git push")]), answer("next turn")], tmp_path)
    cancel = CancelToken()
    asked = threading.Event()

    def blocks(request: ApprovalRequested, token: CancelToken, deadline: float) -> None:
        asked.set()
        assert token.wait(30), "never cancelled"
        return None

    threading.Thread(target=lambda: asked.wait(30) and cancel.cancel()).start()
    with pytest.raises(Cancelled):
        turn(r, blocks, cancel)
    assert port.calls == []
    assert r.kinds() == ["User", "Assistant", "Usage", "Approval"]
    (a,) = approvals(r)
    assert (a.decision, a.by) == (ApprovalDecision.DENY, "cancel")
    assert turn(r).content == "next turn"
    placeholder = r.fake.requests[-1]["messages"][-3]  # then the question marked unanswered
    assert placeholder == {"role": "tool", "tool_call_id": placeholder["tool_call_id"],
                           "content": MISSING_RESULT}


def test_rules_decide_without_asking_deny_first(rig: Make, tmp_path: Path) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("git status"), run("git push --force"),
                                             ("call_tool", json.dumps(
                                                 {"name": "echo", "arguments": {"text": "x"}}))]),
                          answer("ok")], tmp_path,
                    allow=("run_command: git",), deny=("run_command: git push", "echo"))
    nobody = Person()
    turn(r, nobody)
    assert nobody.asked == []
    assert [c[3] for c in port.calls] == [{"command": "git status"}]  # echo was never sent
    assert [(a.decision, a.by, a.rule) for a in approvals(r)] == [
        (ApprovalDecision.ALLOW, "rule", "run_command: git"),
        (ApprovalDecision.DENY, "rule", "run_command: git push"),
        (ApprovalDecision.DENY, "rule", "echo")]
    assert results(r)[1] == ('The call was denied: the rule "run_command: git push" '
                             "(tools.deny or the rules file) forbids it")


def test_without_an_approver_a_call_is_denied_unless_a_rule_allows_it(
    rig: Make, tmp_path: Path
) -> None:
    r, port = setup(rig, [answer(tool_calls=[run("ls")]), answer("ok")], tmp_path)
    turn(r, None)
    assert results(r) == [f"The call was denied: {NO_APPROVER}"]
    assert port.calls == []


def test_a_turn_waiting_for_approval_holds_no_slot(tmp_path: Path) -> None:
    """docs/approval.md: while session A waits for the person, session B's turn gets the only slot
    and ends; A's call then runs and A ends too (one server slot, two sessions)."""
    from tests.inference.slots.slots_rig import Slots

    def script(body: dict[str, Any]) -> Any:
        messages = body["messages"]
        if messages[1]["content"] == "A" and messages[-1]["role"] == "user":
            return answer(tool_calls=[run("make deploy")])
        return answer(f"done {messages[1]['content']}.")

    slots = Slots(tmp_path, slots=1, script=script)
    port = ScriptedPort(lambda tool, args: wire.Result(content="deployed"), specs=(ECHO, RUN))
    runtime = Runtime(config=slots.config, inference=slots.inference, registry=Registry([port]))
    waiting, b_done = threading.Event(), threading.Event()
    seen_b_done: list[bool] = []

    def person(request: ApprovalRequested, cancel: CancelToken, deadline: float) -> Decision:
        waiting.set()
        seen_b_done.append(b_done.wait(30))  # B must finish while A waits here
        return Decision(Choice.ONCE)

    outcomes: dict[str, str] = {}
    a = threading.Thread(target=lambda: outcomes.__setitem__("A", run_turn(
        slots.log("a"), runtime, "A", lambda _e: None, None, person).content))
    try:
        a.start()
        assert waiting.wait(30), "A never asked"
        outcomes["B"] = run_turn(slots.log("b"), runtime, "B", lambda _e: None).content
        b_done.set()
        a.join(30)
    finally:
        b_done.set()
        a.join(30)
        slots.close()
    assert outcomes == {"A": "done A.", "B": "done B."}
    assert seen_b_done == [True]
    assert [c[2:] for c in port.calls] == [("run_command", {"command": "make deploy"})]
