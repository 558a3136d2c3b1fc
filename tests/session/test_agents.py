"""The agent tool on a fake llama-server: children as sessions, at once, on one budget,
the person in charge, bad input as failure results (docs/agents.md)."""

from __future__ import annotations

import collections
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.errors import Cancelled, TurnLimit
from actors.base.events import (
    AgentDone,
    AgentEvent,
    AgentStarted,
    ApprovalRequested,
    Choice,
    Decision,
    Event,
    ToolCallStarted,
    to_json,
)
from actors.cli.main import main
from actors.inference.actor import Inference
from actors.inference.slots.keeper import KeeperSettings, ServerSpec
from actors.log.file import SessionLog, read_records
from actors.log.records import (
    AgentLink,
    CacheLoss,
    Record,
    SlotState,
    ToolResult,
    Usage,
    User,
)
from actors.log.sessiondir import list_sessions, session_path
from actors.session.agents import AGENT, agent_tool
from actors.session.limits import result_failed
from actors.session.turn import Runtime, TurnOutcome, run_turn
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.registry import META_TOOLS, Registry
from tests.cli.clikit import cli_env
from tests.support.fake_llama import FakeLlama, Reply, answer, hang, http_error
from tests.support.otlp import receiving
from tests.support.turn_rig import ECHO, ScriptedPort, baseline, make_config
from tests.support.watch import HANG_S

Script = Callable[[dict[str, Any]], Reply]


def agent_call(task: str, context: str | None = None) -> tuple[str, str]:
    args: dict[str, Any] = {"task": task}
    if context is not None:
        args["context"] = context
    return AGENT, json.dumps(args)


def last(body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = body["messages"][-1]
    return message


def asked(body: dict[str, Any]) -> str:
    """The task (or question) a request answers: its last user message."""
    users = [m for m in body["messages"] if m.get("role") == "user"]
    return str(users[-1]["content"]) if users else ""


class Meeting:
    """Requests that answer only once a request of every task is at the server at the same
    time: only children that overlap get past it (one alone, or its retry, waits out the
    guard and fails)."""

    def __init__(self, tasks: set[str]) -> None:
        self.tasks, self.here = tasks, collections.Counter[str]()
        self.cond = threading.Condition()
        self.met = False  # once all were here together (one may answer and go before the rest wake)

    def _all_here(self) -> bool:
        self.met = self.met or all(self.here[t] for t in self.tasks)
        return self.met

    def reply(self, task: str, then: Reply) -> Reply:
        def serve(conn: Any) -> None:
            with self.cond:
                self.here[task] += 1
                self.cond.notify_all()
                met = self.cond.wait_for(self._all_here, timeout=HANG_S)
            try:
                if met:
                    then.serve(conn)
                else:
                    http_error(500, "the other child never came").serve(conn)
            finally:
                with self.cond:
                    self.here[task] -= 1

        return Reply("meet", serve)


class AgentRig:
    """A parent session ``s`` offering the agent tool, a fake server with two slots."""

    def __init__(self, tmp_path: Path, script: Script, registry: Registry | None = None,
                 agents: dict[str, Any] | None = None, warm: bool = False, **loop: Any
                 ) -> None:
        """``warm``: the server saves and restores KV state (the keeper's warm start on)."""
        save = tmp_path / "save"
        save.mkdir(parents=True)
        self.fake = FakeLlama(script, props={"total_slots": 2},
                              save_dir=save if warm else None).start()
        config = make_config(tmp_path, self.fake.url, **loop)
        config = config.replace("agents", enabled=True, **(agents or {}))
        self.config: Config = config.replace("slots", save_dir=str(save) if warm else "")
        self.log, _ = SessionLog.open(session_path(self.config, "s"), fsync="never",
                                      baseline=baseline((*META_TOOLS, agent_tool())), name="s")
        keeper = KeeperSettings(log_dir=self.config.log_dir, meta_dir=tmp_path / "meta",
                                warm_start=True, save_after_turn=False)
        self.inference = Inference.start(
            self.config.inference, servers=[ServerSpec(self.fake.url, save if warm else None)],
            keeper=keeper)
        self.runtime = Runtime(config=self.config, inference=self.inference,
                               registry=registry or Registry([ScriptedPort()]))
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def sink(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)

    def turn(self, content: str = "Hi?", cancel: CancelToken | None = None,
             approver: Any = None) -> TurnOutcome:
        return run_turn(self.log, self.runtime, content, self.sink, cancel, approver)

    def child(self, name: str) -> tuple[Record, ...]:
        return read_records(session_path(self.config, name), name=name)

    def results(self) -> list[ToolResult]:
        return [r for r in self.log.records if isinstance(r, ToolResult)]

    def close(self) -> None:
        self.inference.stop()
        self.log.close()
        self.fake.close()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., AgentRig]]:
    made: list[AgentRig] = []

    def make(script: Script, **kw: Any) -> AgentRig:
        r = AgentRig(tmp_path / str(len(made)), script, **kw)
        made.append(r)
        return r

    yield make
    for r in made:
        r.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("agent-")], \
        "no child runs on after its parent's turn"


def parent_then(calls: Sequence[Sequence[str]], children: Callable[[dict[str, Any]], Reply],
                final: str = "done") -> Script:
    """The parent asks for ``calls``, then answers ``final``; a child's request (its task as
    the last user message) is answered by ``children``."""

    def script(body: dict[str, Any]) -> Reply:
        if asked(body) != "Hi?":
            return children(body)
        if last(body).get("role") == "user":
            return answer(tool_calls=calls)
        return answer(final)

    return script


# --- children are sessions, at once -------------------------------------------------------


def test_two_children_run_at_once_and_both_answers_reach_the_parent(
        agents: Callable[..., AgentRig]) -> None:
    said = {"read a.txt": "a holds 1", "read b.txt": "b holds 2"}
    both = Meeting(set(said))
    r = agents(parent_then([agent_call("read a.txt"), agent_call("read b.txt")],
                           lambda body: both.reply(asked(body), answer(said[asked(body)]))))
    outcome = r.turn()
    assert outcome.content == "done"
    final = r.fake.requests[-1]["messages"]
    shown = [m["content"] for m in final if m.get("role") == "tool"]
    assert shown == ["a holds 1", "b holds 2"]  # each in its call's place
    assert list_sessions(r.config) == ["s", "s.a1", "s.a2"]
    for name, task in (("s.a1", "read a.txt"), ("s.a2", "read b.txt")):
        records = r.child(name)
        link = AgentLink(parent="s", child=name, task=task, context="fresh")
        assert [(x.parent, x.child, x.task) for x in records if isinstance(x, AgentLink)] == [
            (link.parent, link.child, link.task)]
        assert [x.content for x in records if isinstance(x, User)] == [task]
    links = [x for x in r.log.records if isinstance(x, AgentLink)]
    assert [x.child for x in links] == ["s.a1", "s.a2"]
    started = [e for e in r.events if isinstance(e, AgentStarted)]
    done = [e for e in r.events if isinstance(e, AgentDone)]
    assert sorted(e.agent for e in started) == sorted(e.agent for e in done) == ["s.a1", "s.a2"]
    assert all(e.ok for e in done)
    tagged = [e for e in r.events if isinstance(e, AgentEvent)]
    assert {e.agent for e in tagged} == {"s.a1", "s.a2"}
    assert to_json(tagged[0])["agent"] in ("s.a1", "s.a2")


def test_loopd_sessions_lists_children_under_their_parent_and_log_show_reads_them(
        agents: Callable[..., AgentRig], tmp_path: Path, capsys: Any) -> None:
    r = agents(parent_then([agent_call("a"), agent_call("b")], lambda body: answer("ok")))
    r.turn()
    (tmp_path / "other").mkdir()
    SessionLog.open(session_path(r.config, "r"), fsync="never", baseline=baseline(),
                    name="r")[0].close()
    config = tmp_path / "loopd.toml"
    config.write_text(f'[log]\ndir = "{r.config.log_dir}"\n')
    capsys.readouterr()
    assert main(["sessions", "--config", str(config)]) == 0
    names = [line.split("  ")[0] if not line.startswith(" ") else "  " + line.split()[0]
             for line in capsys.readouterr().out.splitlines()]
    assert names == ["r", "s", "  s.a1", "  s.a2"]
    assert main(["sessions", "--json", "--config", str(config)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row.get("parent", "") for row in rows] == ["", "", "s", "s"]
    assert main(["log", "show", "s.a1", "--config", str(config)]) == 0
    assert "agent: session s handed session s.a1 a task (fresh): a" in capsys.readouterr().out


def test_an_agent_call_made_through_call_tool_starts_a_child_too(
        agents: Callable[..., AgentRig]) -> None:
    wrapped = ("call_tool", json.dumps({"name": AGENT, "arguments": {"task": "count"}}))
    r = agents(parent_then([wrapped], lambda body: answer("3")))
    assert r.turn().content == "done"
    assert [x.content for x in r.results()] == ["3"]


def test_a_second_turn_names_its_children_after_the_first_ones(
        agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("count")], lambda body: answer("3")))
    r.turn()
    r.turn("Hi?")
    assert list_sessions(r.config) == ["s", "s.a1", "s.a2"]


def test_a_forked_child_sees_the_parent_conversation(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("go on", "fork")], lambda body: answer("went on")))
    assert r.turn().content == "done"
    child = next(b for b in r.fake.requests if asked(b) == "go on")
    users = [m["content"] for m in child["messages"] if m.get("role") == "user"]
    assert users == ["Hi?", "go on"]  # the parent's question, then its task
    assert r.results()[0].content == "went on"


def test_two_agent_calls_with_one_id_are_two_children(agents: Callable[..., AgentRig]) -> None:
    said = {"a": "1", "b": "2"}
    r = agents(parent_then([("same", AGENT, '{"task": "a"}'), ("same", AGENT, '{"task": "b"}')],
                           lambda body: answer(said[asked(body)])))
    r.turn()
    assert [x.content for x in r.results()] == ["1", "2"]


def test_max_parallel_one_runs_the_children_one_after_the_other(
        agents: Callable[..., AgentRig]) -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def child(body: dict[str, Any]) -> Reply:
        def serve(conn: Any) -> None:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            try:
                answer("ok").serve(conn)
            finally:
                with lock:
                    running[0] -= 1

        return Reply("counted", serve)

    r = agents(parent_then([agent_call("a"), agent_call("b"), agent_call("c")], child),
               agents={"max_parallel": 1})
    assert r.turn().content == "done"
    assert [x.content for x in r.results()] == ["ok", "ok", "ok"]
    assert most[0] == 1


# --- warm: a child's first request processes only its task ----------------------------------


def first_usage(records: tuple[Record, ...]) -> Usage:
    return next(r for r in records if isinstance(r, Usage))


def test_fresh_children_start_from_the_saved_baseline(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("read a.txt"), agent_call("read b.txt")],
                           lambda body: answer("read")), warm=True)
    r.turn()  # the first child of this baseline processes it once and saves it
    prefills = len(r.fake.prefills)
    r.turn()
    assert len(r.fake.prefills) == prefills  # no baseline processed again
    task = len("<|user|>read a.txt<|end|><|assistant|>") // 4 + 1  # the fake's tokens
    for name in ("s.a3", "s.a4"):
        usage = first_usage(r.child(name))
        assert usage.timings["prompt_n"] <= task, (name, usage.timings)
        assert usage.timings["cache_n"] > 0  # the baseline, restored or kept in its slot
        assert not [x for x in r.child(name) if isinstance(x, CacheLoss)]
    assert [x.content for x in r.results()] == ["read"] * 4


def test_a_forked_child_starts_from_the_parent_state(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("go on", "fork")], lambda body: answer("went on")),
               warm=True)
    r.turn()
    usage = first_usage([x for x in r.child("s.a1")][_after_link(r.child("s.a1")):])
    parent = first_usage(r.log.records)
    assert usage.slot is not None and usage.slot.state is SlotState.RESTORED
    # all the parent had processed is reused: only the pending call's result and the task not
    assert usage.timings["cache_n"] >= parent.prompt_tokens + parent.completion_tokens
    assert usage.timings["prompt_n"] < parent.prompt_tokens
    assert not [x for x in r.child("s.a1") if isinstance(x, CacheLoss)]


def test_a_child_with_no_state_to_start_from_says_why_and_still_runs(
        agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("go on", "fork")], lambda body: answer("went on")))
    assert r.turn().content == "done"
    losses = [x for x in r.child("s.a1") if isinstance(x, CacheLoss)]
    assert len(losses) == 1 and losses[0].cause
    assert r.results()[0].content == "went on"


def _after_link(records: tuple[Record, ...]) -> int:
    return max(i for i, x in enumerate(records) if isinstance(x, AgentLink)) + 1


# --- one budget ------------------------------------------------------------------------------


def looping(body: dict[str, Any]) -> Reply:
    """A child that calls echo again and again, each time with new text."""
    n = sum(1 for m in body["messages"] if m.get("role") == "tool")
    return answer(tool_calls=[("call_tool", json.dumps(
        {"name": "echo", "arguments": {"text": f"{asked(body)} {n}"}}))])


def test_the_tree_iterations_stop_looping_children(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("loop a"), agent_call("loop b")], looping),
               tool_iterations=6)
    with pytest.raises(TurnLimit, match="tool iterations") as caught:
        r.turn()
    assert caught.value.exit_code == 3
    results = r.results()
    assert len(results) == 2 and all(result_failed(x.content) for x in results)
    assert all("tool iterations" in x.content for x in results)
    for name in ("s.a1", "s.a2"):
        r.child(name)  # each log reads whole (a torn record would be refused)
    calls = sum(1 for name in ("s.a1", "s.a2") for x in r.child(name)
                if isinstance(x, ToolResult))
    assert calls <= 6  # the parent's one iteration and the children's, together


def test_the_tree_tokens_stop_the_children(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("loop a"), agent_call("loop b")], looping),
               turn_tokens=40, tool_iterations=1000)
    with pytest.raises(TurnLimit, match="turn tokens"):
        r.turn()
    assert all("turn tokens" in x.content for x in r.results())


@pytest.mark.parametrize("parallel", [0, 1])  # 1: the second waits for a place meanwhile
def test_the_tree_time_stops_hanging_children(agents: Callable[..., AgentRig],
                                              parallel: int) -> None:
    r = agents(parent_then([agent_call("wait a"), agent_call("wait b")], lambda body: hang()),
               turn_seconds=0.5, agents={"max_parallel": parallel})
    with pytest.raises(TurnLimit, match="turn time"):
        r.turn()
    results = r.results()
    assert len(results) == 2 and all("turn time" in x.content for x in results)
    done = [e for e in r.events if isinstance(e, AgentDone)]
    assert len(done) == 2 and not any(e.ok for e in done)


def test_a_child_s_own_limits_hold_and_end_only_that_child(
        agents: Callable[..., AgentRig]) -> None:
    same = ("call_tool", '{"name": "echo", "arguments": {"text": "again"}}')
    r = agents(parent_then([agent_call("repeat")], lambda body: answer(tool_calls=[same])))
    assert r.turn().content == "done"  # not the tree's budget: the parent goes on
    (result,) = r.results()
    assert result_failed(result.content) and "repeated call" in result.content


# --- the person in charge ----------------------------------------------------------------------


def test_cancel_stops_every_child(agents: Callable[..., AgentRig]) -> None:
    cancel = CancelToken()
    hung = threading.Barrier(3)

    def child(body: dict[str, Any]) -> Reply:
        def serve(conn: Any) -> None:
            hung.wait(timeout=HANG_S)
            hang().serve(conn)

        return Reply("hung", serve)

    r = agents(parent_then([agent_call("a"), agent_call("b")], child))
    waiter = threading.Thread(target=lambda: (hung.wait(timeout=HANG_S), cancel.cancel()))
    waiter.start()
    with pytest.raises(Cancelled):
        r.turn(cancel=cancel)
    waiter.join()
    for name in ("s.a1", "s.a2"):
        assert [type(x).__name__ for x in r.child(name)][-1] in ("AgentLink", "User")


def test_an_approval_of_a_child_names_the_child_and_its_task(
        agents: Callable[..., AgentRig]) -> None:
    gated = ToolSpec(name="wipe", description="Wipe.", needs_approval=True,
                     parameters={"type": "object", "properties": {}})
    port = ScriptedPort(specs=(ECHO, gated))
    seen: list[ApprovalRequested] = []

    def approver(request: ApprovalRequested, cancel: CancelToken, deadline: float
                 ) -> Decision:
        seen.append(request)
        return Decision(Choice.DENY, "not now")

    def child(body: dict[str, Any]) -> Reply:
        if last(body).get("role") == "tool":
            return answer("could not")
        return answer(tool_calls=[("call_tool", '{"name": "wipe", "arguments": {}}')])

    r = agents(parent_then([agent_call("wipe the disk")], child), registry=Registry([port]))
    assert r.turn(approver=approver).content == "done"
    assert len(seen) == 1
    assert seen[0].prompt.startswith("[agent s.a1, task: wipe the disk]")
    nested = agents(parent_then([agent_call("nest")], lambda body: child(body) if asked(body)
                                == "wipe the disk" else answer("ok") if last(body).get("role")
                                == "tool" else answer(tool_calls=[agent_call("wipe the disk")])),
                    registry=Registry([port]), agents={"max_depth": 2})
    assert nested.turn(approver=approver).content == "done"  # asked through two wrappers
    assert seen[1].prompt == ("[agent s.a1, task: nest] [agent s.a1.a1, task: wipe the disk] "
                              "Allow wipe?")  # its lineage, the parent's child first
    asked_events = [e for e in r.events if isinstance(e, AgentEvent)
                    and isinstance(e.event, ApprovalRequested)]
    assert [e.agent for e in asked_events] == ["s.a1"]
    assert port.calls == []  # denied: it did not run


def test_a_child_that_read_untrusted_content_marks_its_result(
        agents: Callable[..., AgentRig]) -> None:
    port = ScriptedPort(answer=lambda tool, args: wire.Result(
        id=0, content="from the web", class_=ResultClass.PUBLIC, untrusted=True))

    def child(body: dict[str, Any]) -> Reply:
        if last(body).get("role") == "tool":
            return answer("the page says hi")
        return answer(tool_calls=[("call_tool", '{"name": "echo", "arguments": {"text": "x"}}')])

    r = agents(parent_then([agent_call("fetch it"), agent_call("say hi")],
                           lambda body: child(body) if asked(body) == "fetch it"
                           else answer("hi")), registry=Registry([port]))
    r.turn()
    assert [(x.content, x.untrusted) for x in r.results()] == [
        ("the page says hi", True), ("hi", False)]


# --- bad input: a failure result, never a dead turn -------------------------------------------


@pytest.mark.parametrize(("arguments", "says"), [
    ('{"task": ""}', 'needs "task"'),
    ('{"task": "' + "x" * 50 + '"}', "agents.max_task_chars = 40"),
    ('{"task": "go", "context": "all"}', "unknown context 'all'"),
    ('{"context": "fresh"}', 'needs "task"'),
    ('["go"]', "must be an object"),
    ('{"task": ', "not JSON"),
])  # fmt: skip
def test_bad_agent_calls_are_failure_results(agents: Callable[..., AgentRig], arguments: str,
                                             says: str) -> None:
    r = agents(parent_then([(AGENT, arguments)], lambda body: answer("never")),
               agents={"max_task_chars": 40})
    assert r.turn().content == "done"
    (result,) = r.results()
    assert result_failed(result.content) and says in result.content
    assert list_sessions(r.config) == ["s"]


def test_children_past_the_cap_are_refused(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("a"), agent_call("b"), agent_call("c")],
                           lambda body: answer("ok")), agents={"max_children": 2})
    assert r.turn().content == "done"
    assert [result_failed(x.content) for x in r.results()] == [False, False, True]
    assert "agents.max_children = 2" in r.results()[2].content


def test_a_child_has_no_agent_tool_and_its_agent_call_is_refused(
        agents: Callable[..., AgentRig]) -> None:
    def child(body: dict[str, Any]) -> Reply:
        if last(body).get("role") == "tool":
            return answer(str(last(body)["content"]))
        return answer(tool_calls=[agent_call("deeper")])

    r = agents(parent_then([agent_call("nest")], child))
    r.turn()
    first = next(b for b in r.fake.requests if asked(b) == "nest")
    assert AGENT not in [t["function"]["name"] for t in first["tools"]]
    assert "agents.max_depth = 1" in r.results()[0].content
    assert list_sessions(r.config) == ["s", "s.a1"]


def test_a_child_may_start_agents_under_max_depth_two_on_one_place(
        agents: Callable[..., AgentRig]) -> None:
    def child(body: dict[str, Any]) -> Reply:
        if asked(body) == "deeper":
            return answer("deep")
        if last(body).get("role") == "tool":
            return answer(f"got {last(body)['content']}")
        return answer(tool_calls=[agent_call("deeper")])

    r = agents(parent_then([agent_call("nest")], child),
               agents={"max_depth": 2, "max_parallel": 1}, turn_seconds=60)
    assert r.turn().content == "done"  # the child gave its place to its own child
    assert [x.content for x in r.results()] == ["got deep"]
    assert list_sessions(r.config) == ["s", "s.a1", "s.a1.a1"]
    deepest = next(b for b in r.fake.requests if asked(b) == "deeper")
    assert AGENT not in [t["function"]["name"] for t in deepest["tools"]]


def test_a_child_whose_server_fails_is_a_failure_result(
        agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("a")], lambda body: http_error(500, "gone")))
    assert r.turn().content == "done"
    (result,) = r.results()
    assert result_failed(result.content) and "model server failed" in result.content
    done = [e for e in r.events if isinstance(e, AgentDone)]
    assert [e.ok for e in done] == [False] and "model server" in done[0].reason


def test_a_child_s_turn_is_a_span_under_its_parent_s_turn(
        agents: Callable[..., AgentRig], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.sdk.trace")
    with receiving(monkeypatch) as otlp:
        r = agents(parent_then([agent_call("a")], lambda body: answer("1")))
        r.turn()
        assert telemetry.flush()
        spans = otlp.wait(lambda got: [s.name for s in got].count("invoke_agent loopd") == 2)
    turns = {s.attributes["gen_ai.conversation.id"]: s for s in spans
             if s.name == "invoke_agent loopd"}
    assert turns["s.a1"].parent_id == turns["s"].span_id
    assert turns["s.a1"].trace_id == turns["s"].trace_id


def test_events_of_a_child_carry_its_name(agents: Callable[..., AgentRig]) -> None:
    r = agents(parent_then([agent_call("echo it")], lambda body: answer("echoed")))
    r.turn()
    calls = [e for e in r.events if isinstance(e, ToolCallStarted)]
    assert [e.name for e in calls] == [AGENT]  # the parent's own, untagged
    lines = [to_json(e) for e in r.events if isinstance(e, AgentEvent)]
    assert lines and all(line["agent"] == "s.a1" for line in lines)
    assert {line["event"] for line in lines} >= {"content", "used"}


# --- the command: loopd run, live and --json --------------------------------------------------


@pytest.mark.parametrize("json_view", [False, True])
def test_loopd_run_shows_children_live_and_as_json(tmp_path: Path, capsys: Any,
                                                   json_view: bool) -> None:
    env = cli_env(tmp_path, standard=False)
    with open(env["config"], "a") as f:  # [inference] is the file's last section
        f.write("[agents]\nenabled = true\n")
    script = parent_then([agent_call("count the notes")], lambda body: answer("one note"))
    with FakeLlama(script) as fake:
        args = ["run", "Hi?", "--config", env["config"], "--url", fake.url, "--local"]
        assert main([*args, "--json"] if json_view else args) == 0
    out, err = capsys.readouterr()
    if json_view:
        lines = [json.loads(line) for line in out.splitlines()]
        started = [e["agent"] for e in lines if e["event"] == "agent_started"]
        assert len(started) == 1 and started[0].endswith(".a1")  # PARENT.a1
        child = [e for e in lines if e.get("agent", "").endswith(".a1")
                 and e["event"] == "content"]
        assert "".join(e["text"] for e in child) == "one note"
        assert lines[-1]["event"] == "answer" and lines[-1]["content"] == "done"
    else:
        assert out.strip() == "done"  # a child's text is not the answer
        assert "⇉ agent" in err and "count the notes" in err and "⇇ agent" in err
