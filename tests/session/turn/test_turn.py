"""run_turn end to end: a fake llama-server over real HTTP, the inference actor, a real log.

Record sequences for each kind of turn, one test per limit (named for it), cancellation,
cache loss, and that every error that ends a turn leaves a session whose next turn works.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka
import pytest

from actors.base.cancel import CancelToken
from actors.base.config import parse
from actors.base.errors import Cancelled, SessionFull, TurnLimit
from actors.base.events import (
    NO_APPROVER,
    CacheLossEvent,
    Content,
    Progress,
    ThinkingCapped,
    ToolCallDelta,
    ToolCallStarted,
    ToolResultEvent,
    Waiting,
)
from actors.inference.types import InferError
from actors.log.file import read_records
from actors.log.records import Assistant, CacheLoss, Rewind, ToolResult, Usage
from actors.session.actor import open_session
from actors.session.limits import REPEAT_NOTICE
from actors.session.messages import MISSING_RESULT, UNANSWERED
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass
from actors.tools.registry import Registry
from actors.tools.toolbox import Toolbox
from tests.support.fake_llama import (
    after,
    answer,
    http_error,
    replay,
    trickle,
)
from tests.support.recordings import FIXTURES
from tests.support.turn_rig import Rig, ScriptedPort, baseline, make_config
from tests.support.watch import HANG_S

Make = Callable[..., Rig]


def call_tool(tool: str, **arguments: Any) -> tuple[str, str]:
    return ("call_tool", json.dumps({"name": tool, "arguments": arguments}))


def results(rig: Rig) -> list[ToolResult]:
    return [r for r in rig.records if isinstance(r, ToolResult)]


# --- record sequences --------------------------------------------------------------------


def test_a_turn_without_tools_appends_user_assistant_usage(rig: Make) -> None:
    r = rig(replay(FIXTURES / "text.http"))
    outcome = r.turn("Tell me about the log.")
    assert r.kinds() == ["User", "Assistant", "Usage"]
    assistant, usage = r.records[2], r.records[3]
    assert isinstance(assistant, Assistant) and isinstance(usage, Usage)
    assert outcome.content == assistant.content and assistant.content
    assert usage.timings["cache_n"] >= 0 and usage.prompt_tokens > 0
    assert usage.finish_reason == "stop" and outcome.usage == usage
    kinds = {type(e) for e in r.events}
    assert Progress in kinds and Content in kinds and ToolCallDelta not in kinds
    # the log on disk says the same as the log in memory
    assert tuple(read_records(r.path, name="s")) == r.records


def test_a_find_tool_turn(rig: Make) -> None:
    registry = Registry([ScriptedPort()])
    # the recording's prompt held 274 tokens: the next request reuses them all
    reused = {"cache_n": 300, "prompt_n": 12, "predicted_n": 3}
    r = rig([*replay(FIXTURES / "find_tool.http"), answer("Use echo.", timings=reused)], registry)
    outcome = r.turn("Which tool lists files?")
    assert r.kinds() == ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage"]
    (result,) = results(r)
    asked = r.records[2]
    assert isinstance(asked, Assistant) and asked.tool_calls[0].name == "find_tool"
    assert result.tool_call_id == asked.tool_calls[0].id == "zsPMDpJNSnqeWNP3hXePMRFjKYdUit7O"
    assert result.call == 1 and result.class_ is ResultClass.PUBLIC and not result.untrusted
    assert "echo" in result.content  # find_tool answers from the registry
    assert outcome.content == "Use echo." and outcome.tool_calls == 1 and outcome.iterations == 1
    # the second request carries the tool result after the assistant's call
    second = r.fake.requests[1]["messages"]
    assert second[-1] == {"role": "tool", "tool_call_id": result.tool_call_id,
                          "content": result.content}


@pytest.fixture
def toolbox(tmp_path: Path) -> Any:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("The greenhouse needs water on Fridays.\n")
    config = parse({"tools": {"workspace": str(workspace), "timeout_s": 10}})
    box = Toolbox.start(config, run_dir=tmp_path / "run")
    try:
        yield box
    finally:
        box.close()


def test_a_call_tool_turn_reaches_a_real_tool_host(rig: Make, toolbox: Any) -> None:
    r = rig([answer(tool_calls=[call_tool("read_file", path="notes.txt")]),
             answer("Water on Fridays.")], toolbox.registry)
    outcome = r.turn("What do my notes say?")
    assert r.kinds() == ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage"]
    (result,) = results(r)
    assert "greenhouse needs water" in result.content and not result.truncated
    assert outcome.content == "Water on Fridays."
    started = [e for e in r.events if isinstance(e, ToolCallStarted)]
    done = [e for e in r.events if isinstance(e, ToolResultEvent)]
    assert [e.name for e in started] == ["call_tool"] and done[0].outcome == "result"


def test_tool_calls_run_in_the_models_order_with_session_call_numbers(rig: Make) -> None:
    port = ScriptedPort()
    r = rig([answer(tool_calls=[call_tool("echo", text="a"), call_tool("echo", text="b")]),
             answer("done"),
             answer(tool_calls=[call_tool("echo", text="c")]), answer("done again")],
            Registry([port]))
    r.turn()
    r.turn()
    assert [(c[1], c[3]["text"]) for c in port.calls] == [(1, "a"), (2, "b"), (3, "c")]
    ids = [c.id for a in r.records if isinstance(a, Assistant) for c in a.tool_calls]
    assert [(t.call, t.tool_call_id, t.content) for t in results(r)] == [
        (1, ids[0], "a"), (2, ids[1], "b"), (3, ids[2], "c")]


@pytest.mark.parametrize(
    ("answer_", "expected"),
    [
        (wire.Failed(id=0, message="disk on fire"), "The tool failed: disk on fire"),
        (wire.Denied(id=0, reason="outside the workspace"),
         "The call was denied: outside the workspace"),
        (wire.PendingApproval(id=0, prompt="write notes.txt"),
         f"The call was denied: {NO_APPROVER}"),
    ],
)
def test_failed_denied_and_pending_calls_become_results_the_model_reads(
    rig: Make, answer_: Any, expected: str
) -> None:
    r = rig([answer(tool_calls=[call_tool("echo", text="x")]), answer("ok")],
            Registry([ScriptedPort(lambda tool, args: answer_)]))
    assert r.turn().content == "ok"
    assert [t.content for t in results(r)] == [expected]


def test_malformed_tool_arguments_are_answered_not_raised(rig: Make) -> None:
    port = ScriptedPort()
    r = rig([answer(tool_calls=[("call_tool", '{"name": "echo", "arguments": {"text": ')]),
             answer(tool_calls=[call_tool("echo", txt="wrong key")]),
             answer(tool_calls=[call_tool("no_such_tool")]), answer("giving up")],
            Registry([port]))
    assert r.turn().content == "giving up"
    texts = [t.content for t in results(r)]
    assert "not valid JSON" in texts[0] or "JSON" in texts[0]
    assert "not valid" in texts[1] and "text" in texts[1]
    assert "no tool named 'no_such_tool'" in texts[2]
    assert port.calls == []  # nothing invalid reached a host


# --- the five limits ----------------------------------------------------------------------


def test_limit_tool_iterations(rig: Make) -> None:
    script = [answer(tool_calls=[("find_tool", json.dumps({"query": f"q{i}"}))]) for i in range(4)]
    r = rig([*script, answer("next turn")], tool_iterations=3)
    with pytest.raises(TurnLimit) as caught:
        r.turn()
    assert caught.value.limit == "tool iterations" and "3" in str(caught.value)
    asked = [a for a in r.records if isinstance(a, Assistant)]
    assert len(asked) == 4 and len(results(r)) == 3  # exactly 3 iterations ran their tools
    _next_turn_works(r)


def test_limit_repeated_call(rig: Make) -> None:
    port = ScriptedPort()
    r = rig([answer(tool_calls=[call_tool("echo", text="A")]),
             answer(tool_calls=[call_tool("echo", text="A")]),      # first repeat: notice
             answer(tool_calls=[call_tool("echo", text="B")]),      # other arguments: runs
             answer(tool_calls=[call_tool("echo", text="A")]),      # second repeat: limit
             answer("next turn")],
            Registry([port]))
    with pytest.raises(TurnLimit) as caught:
        r.turn()
    assert caught.value.limit == "repeated call"
    assert [c[3]["text"] for c in port.calls] == ["A", "B"]
    texts = [t.content for t in results(r)]
    assert texts == ["A", REPEAT_NOTICE.format(name="call_tool"), "B"]
    _next_turn_works(r)


def test_limit_repeated_call_inside_one_model_response(rig: Make) -> None:
    port = ScriptedPort()
    same = call_tool("echo", text="twice")
    r = rig([answer(tool_calls=[same, same]), answer("ok")], Registry([port]))
    assert r.turn().content == "ok"
    assert len(port.calls) == 1
    assert [t.content for t in results(r)] == ["twice", REPEAT_NOTICE.format(name="call_tool")]


def test_repeat_detection_can_be_turned_off(rig: Make) -> None:
    port = ScriptedPort()
    same = call_tool("echo", text="x")
    r = rig([answer(tool_calls=[same, same, same]), answer("ok")], Registry([port]),
            repeat_detection=False)
    assert r.turn().content == "ok" and len(port.calls) == 3


def test_limit_thinking_cap(rig: Make) -> None:
    r = rig([answer(reasoning="r" * 40, content="The answer.", chunk=1)], thinking_cap=10)
    outcome = r.turn()
    usage = r.records[-1]
    assert isinstance(usage, Usage) and usage.thinking_capped
    assert usage.reasoning_tokens <= 10
    assert r.fake.requests[0]["reasoning_budget_tokens"] == 10
    assert outcome.content == "The answer."  # the turn still answers
    assert sum(isinstance(e, ThinkingCapped) for e in r.events) == 1


def test_limit_thinking_cap_counts_across_the_turns_requests(rig: Make) -> None:
    r = rig([answer(reasoning="r" * 6, tool_calls=[call_tool("echo", text="x")], chunk=1),
             answer(reasoning="r" * 30, content="done", chunk=1)], thinking_cap=10)
    assert r.turn().content == "done"
    assert [q.get("reasoning_budget_tokens") for q in r.fake.requests] == [10, 4]
    usages = [u for u in r.records if isinstance(u, Usage)]
    assert [u.reasoning_tokens for u in usages] == [6, 4]
    assert [u.thinking_capped for u in usages] == [False, True]


def test_limit_context_full(rig: Make) -> None:
    r = rig([*replay(FIXTURES / "context_full.http"), answer("fresh")])
    with pytest.raises(SessionFull) as caught:
        r.turn("a very long question")
    assert "full" in str(caught.value)
    (back,) = [x for x in r.records if isinstance(x, Rewind)]  # the turn taken back, saying why
    assert r.kinds() == ["User", "Rewind"] and back.to_turn == 0
    assert back.refused == caught.value.detail and "context holds" in back.refused
    _next_turn_works(r, expect=["User", "Rewind", "User", "Assistant", "Usage"])
    # the refused message is never sent again: the next request asks only the new one
    assert [m["content"] for m in r.fake.requests[-1]["messages"][1:]] == ["and now?"]


def test_limit_tool_result_size(rig: Make) -> None:
    big = "é" * 30 + "😀" * 200
    r = rig([answer(tool_calls=[call_tool("echo", text=big), call_tool("echo", text="small")]),
             answer("ok")], Registry([ScriptedPort()]), tool_result_cap=120)
    r.turn()
    cut, small = results(r)
    assert cut.truncated and len(cut.content) <= 120
    assert cut.content.startswith("é" * 30 + "😀") and "cut" in cut.content
    assert str(len(big)) in cut.content  # the note says how much there was
    assert not small.truncated and small.content == "small"
    # the cut text survives the log's encoding: whole characters only
    assert read_records(r.path, name="s")[-4] == cut
    assert any(isinstance(e, ToolResultEvent) and e.truncated for e in r.events)


def test_answer_cut_by_max_tokens_ends_the_turn_saying_so(rig: Make) -> None:
    port = ScriptedPort()
    r = rig([answer(content="a" * 50, tool_calls=[call_tool("echo", text="x")],
                    finish_reason="length")], Registry([port]))
    outcome = r.turn()
    assert outcome.cut and port.calls == []
    assert r.kinds() == ["User", "Assistant", "Usage"]
    assert r.fake.requests[0]["max_tokens"] == r.config.loop.max_tokens


# --- failures, cancellation, cache ---------------------------------------------------------


def test_a_failed_request_appends_nothing_and_the_session_goes_on(rig: Make) -> None:
    boom = http_error(500, {"error": {"code": 500, "message": "boom", "type": "server_error"}})
    r = rig([boom] * 3 + [answer("recovered")])
    with pytest.raises(InferError) as caught:
        r.turn()
    assert "boom" in str(caught.value)
    assert r.kinds() == ["User"]
    _next_turn_works(r, expect=["User", "User", "Assistant", "Usage"])


def test_cancel_mid_stream_writes_nothing_half(rig: Make) -> None:
    r = rig([trickle(0.02), answer("after the cancel")])
    cancel = CancelToken()
    threading.Timer(0.3, cancel.cancel).start()
    with pytest.raises(Cancelled):
        r.turn(cancel=cancel)
    assert r.kinds() == ["User"]
    _next_turn_works(r, expect=["User", "User", "Assistant", "Usage"])


def test_cancel_mid_tool_call_writes_nothing_half(rig: Make) -> None:
    cancel = CancelToken()

    def slow(tool: str, args: Any) -> wire.Answer:
        assert cancel.wait(HANG_S), "the test never cancelled"
        return wire.Failed(id=0, message="cancelled")

    port = ScriptedPort(slow)
    r = rig([answer(tool_calls=[call_tool("echo", text="slow")]), answer("next turn")],
            Registry([port]))
    threading.Thread(target=lambda: port.entered.wait(HANG_S) and cancel.cancel()).start()
    with pytest.raises(Cancelled):
        r.turn(cancel=cancel)
    assert r.kinds() == ["User", "Assistant", "Usage"]  # no ToolResult for the cancelled call
    _next_turn_works(r, expect=["User", "Assistant", "Usage", "User", "Assistant", "Usage"])
    # the call that never got a result is answered with the fixed placeholder
    placeholder, unanswered = r.fake.requests[-1]["messages"][-3:-1]
    assert placeholder["role"] == "tool" and placeholder["content"] == MISSING_RESULT
    assert unanswered == {"role": "assistant", "content": UNANSWERED}  # and its question


def test_cache_loss_is_detected_and_logged(rig: Make) -> None:
    r = rig(replay(FIXTURES / "cache_loss.http"))
    r.turn("first")
    assert not any(isinstance(x, CacheLoss) for x in r.records)
    r.turn("second")
    (loss,) = [x for x in r.records if isinstance(x, CacheLoss)]
    assert (loss.expected, loss.got) == (588 + 18, 3)  # the previous prompt: cache_n + prompt_n
    # the slot still held the session's state as far as the keeper knew: the server lost it
    assert loss.cause == "the server dropped the slot's cache"
    assert CacheLossEvent(expected=606, got=3, cause=loss.cause) in r.events


def test_no_cache_loss_when_each_request_extends_the_last(rig: Make) -> None:
    r = rig([answer(tool_calls=[call_tool("echo", text="x")]), answer("one"), answer("two")])
    r.turn()
    r.turn()
    assert not any(isinstance(x, CacheLoss) for x in r.records)
    assert len([u for u in r.records if isinstance(u, Usage)]) == 3


def _next_turn_works(r: Rig, expect: list[str] | None = None) -> None:
    """After an error that ends a turn the log is valid on disk and the next turn answers."""
    assert tuple(read_records(r.path, name="s")) == r.records
    before = len(r.records)
    assert r.turn("and now?").content
    if expect is not None:
        assert r.kinds() == expect
    assert len(r.records) > before
    assert tuple(read_records(r.path, name="s")) == r.records


# --- the session actor runs the turn -----------------------------------------------------------


def test_the_session_actor_runs_the_turn_and_events_arrive_while_it_waits(tmp_path: Path) -> None:
    from actors.inference.actor import Inference
    from actors.session.turn import Runtime
    from tests.support.fake_llama import FakeLlama

    gate = threading.Event()
    seen: list[Any] = []
    with FakeLlama([after(gate, answer("hello"))]) as fake:
        config = make_config(tmp_path, fake.url)
        inference = Inference.start(config.inference)
        try:
            session = open_session(config, "s", baseline=baseline())
            runtime = Runtime(config=config, inference=inference, registry=Registry([]))
            waiting = threading.Event()

            def sink(event: Any) -> None:
                seen.append(event)
                if isinstance(event, Waiting):
                    waiting.set()

            future = session.turn(runtime, "Hi?", sink)
            assert waiting.wait(HANG_S)  # an event reached us while the session actor waits
            with pytest.raises(pykka.Timeout):
                future.get(timeout=0.05)
            gate.set()
            assert future.get(timeout=HANG_S).content == "hello"
            kinds = [type(r).__name__ for r in session.records().get(timeout=HANG_S)]
            assert kinds == ["Baseline", "User", "Assistant", "Usage"]
            assert any(isinstance(e, Content) for e in seen)
        finally:
            inference.stop()
