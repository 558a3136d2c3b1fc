"""A hostile model's response: too many calls, too large, nested too deep, never ending.

Found by the attack review: one response with 10,000 distinct calls ran them
all; 70 MB of tool-call arguments escaped as RecordError; arguments nested 100,000 deep
escaped as RecursionError. Now: ``loop.max_calls_per_response`` ends the turn before any
call runs; a response longer than a log record can hold is stopped as it streams (a clean
InferError); deep arguments go back to the model as a text error and the turn goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Any

import pytest

from actors.base.errors import TurnLimit
from actors.base.events import Reasoning
from actors.inference.llama import CONTROL_GRACE
from actors.inference.sse import MAX_RESPONSE_CHARS
from actors.inference.types import InferError, InferErrorKind
from actors.log.records import ToolResult
from tests.support.fake_llama import Conn, FakeLlama, Reply, answer
from tests.support.fault_rig import MakeRig, TurnRig

DEFAULT_CAP = 32  # loop.max_calls_per_response's default


def _find_calls(n: int) -> list[tuple[str, str]]:
    return [("find_tool", json.dumps({"query": f"query number {i}"})) for i in range(n)]


def test_one_call_more_than_the_cap_ends_the_turn_before_any_runs(turn_rig: MakeRig) -> None:
    with FakeLlama([answer(tool_calls=_find_calls(DEFAULT_CAP + 1)), answer("next")]) as fake:
        rig = turn_rig(fake.url)
        with pytest.raises(TurnLimit) as caught:
            rig.turn("Hi?")
        assert caught.value.limit == "calls per response"
        assert f"asked for {DEFAULT_CAP + 1} tool calls in one response" in str(caught.value)
        assert f"loop.max_calls_per_response = {DEFAULT_CAP}" in str(caught.value)
        assert rig.kinds() == ["User"]  # no call ran, the response was not kept
        assert not any(isinstance(e, ToolResult) for e in rig.records)
        assert rig.turn("And now?").content == "next"
        assert rig.on_disk() == rig.records


def test_thousands_of_calls_run_none(turn_rig: MakeRig) -> None:
    """(The fake stops at loop.max_tokens = 2048 events: 1,024 of the 10,000 calls.)"""
    with FakeLlama([answer(tool_calls=_find_calls(10_000), chunk=4096)]) as fake:
        rig = turn_rig(fake.url)
        with pytest.raises(TurnLimit, match=r"asked for \d{4,} tool calls"):
            rig.turn("Hi?")
        assert rig.kinds() == ["User"]


def test_calls_up_to_the_cap_all_run(turn_rig: MakeRig) -> None:
    with FakeLlama([answer(tool_calls=_find_calls(DEFAULT_CAP)), answer("done")]) as fake:
        rig = turn_rig(fake.url)
        outcome = rig.turn("Hi?")
        assert outcome.content == "done" and outcome.tool_calls == DEFAULT_CAP


def test_a_response_longer_than_a_record_holds_is_a_clean_infer_error(turn_rig: MakeRig) -> None:
    huge = json.dumps({"query": "x" * MAX_RESPONSE_CHARS})
    with FakeLlama([answer(tool_calls=[("find_tool", huge)], chunk=1 << 20),
                    answer("next")]) as fake:
        rig = turn_rig(fake.url)
        with pytest.raises(InferError) as caught:
            rig.turn("Hi?")
        assert caught.value.kind is InferErrorKind.PROTOCOL
        assert "more than a session log record holds" in str(caught.value)
        assert len(fake.requests) == 1  # not retried: the same request would do it again
        assert rig.kinds() == ["User"]
        assert rig.turn("And now?").content == "next"
        assert rig.on_disk() == rig.records


DEEP = 100_000


@pytest.mark.parametrize(
    "call",
    [
        ("find_tool", "[" * DEEP + "]" * DEEP),
        ("find_tool", '{"query": ' + "[" * DEEP + "]" * DEEP + "}"),
        ("call_tool", '{"name": "read_file", "arguments": ' + "[" * DEEP + "]" * DEEP + "}"),
        ("call_tool", json.dumps({"name": "read_file", "arguments": "[" * DEEP + "]" * DEEP})),
    ],
    ids=["bare array", "in find_tool's query", "call_tool's arguments", "as a JSON string"],
)
def test_arguments_nested_100000_deep_go_back_to_the_model_as_text(
    turn_rig: MakeRig, call: tuple[str, str]
) -> None:
    with FakeLlama([answer(tool_calls=[call], chunk=1 << 20), answer("Sorry.")]) as fake:
        rig = turn_rig(fake.url)
        outcome = rig.turn("Hi?")
        assert outcome.content == "Sorry."
        results = [r for r in rig.records if isinstance(r, ToolResult)]
        assert len(results) == 1
        assert results[0].content.startswith("The arguments of ")
        assert "not valid JSON" in results[0].content
        assert rig.on_disk() == rig.records


# --- endless streams end by a limit, not the timeout ----------------------------------------

LONG = "".join(f"step {i}. " for i in range(200))


def endless(field: str) -> Reply:
    """A 200 stream of ``field`` deltas (reasoning_content, content) that never ends."""

    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        base = {"id": "chatcmpl-endless", "object": "chat.completion.chunk"}
        with contextlib.suppress(OSError):
            while not conn.stopping and not conn.client_gone():
                conn.event({**base, "choices": [{"index": 0, "delta": {field: "more "}}]})
        conn.abort()

    return Reply(f"endless {field}", serve)


def _capped_rig(turn_rig: MakeRig, url: str, **loop: Any) -> TurnRig:
    rig = turn_rig(url, timeout_s=60.0)  # a stream that ran to the timeout would fail the test
    config = rig.config.replace("loop", **loop)
    rig.runtime = dataclasses.replace(rig.runtime, config=config)
    return rig


def test_the_thinking_off_reask_that_goes_on_thinking_is_stopped(turn_rig: MakeRig) -> None:
    capped = answer("never", reasoning=LONG, honor_budget=False, control="ignore")
    with FakeLlama([capped, endless("reasoning_content"), answer("next")]) as fake:
        rig = _capped_rig(turn_rig, fake.url, thinking_cap=5)
        with pytest.raises(InferError) as caught:
            rig.turn("Hi?")
        assert caught.value.kind is InferErrorKind.PROTOCOL
        assert "went on thinking" in str(caught.value)
        assert fake.requests[1]["chat_template_kwargs"] == {"enable_thinking": False}
        assert len(fake.requests) == 2  # not retried
        shown = [e for e in rig.events if isinstance(e, Reasoning)]
        assert len(shown) <= 6 + CONTROL_GRACE + CONTROL_GRACE + 1  # both streams, bounded
        assert rig.kinds() == ["User"]
        assert rig.turn("And now?").content == "next"


@pytest.mark.parametrize("reask", [False, True], ids=["first request", "thinking-off re-ask"])
def test_an_endless_answer_is_cut_at_max_tokens(turn_rig: MakeRig, reask: bool) -> None:
    first = [answer("never", reasoning=LONG, honor_budget=False, control="ignore")] if reask else []
    with FakeLlama([*first, endless("content"), answer("next")]) as fake:
        rig = _capped_rig(turn_rig, fake.url, thinking_cap=5, max_tokens=50)
        outcome = rig.turn("Hi?")
        assert outcome.cut  # "answer cut at loop.max_tokens", as for a server that honours it
        assert outcome.content == "more " * (50 + CONTROL_GRACE + 1)
        assert rig.kinds() == ["User", "Assistant", "Usage"]
        assert rig.turn("And now?").content == "next"


def test_a_flood_of_tiny_tool_calls_counts_each_calls_own_fields(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Many one-letter calls are little text but a large record: each call's own fields are
    counted, so what the assembler lets through always fits (scaled down from 16 Mi)."""
    from actors.inference import sse
    from actors.log.file import frame
    from actors.log.records import Assistant

    limit = 20_000
    monkeypatch.setattr(sse, "MAX_RESPONSE_CHARS", limit)

    def chunk(first: int, n: int) -> str:
        calls = [{"index": i, "function": {"name": "f"}} for i in range(first, first + n)]
        return json.dumps({"choices": [{"index": 0, "delta": {"tool_calls": calls}}]})

    fits = limit // 17 - 10  # 16 per call and its one-letter name
    asm = sse.StreamAssembler()
    asm.feed(chunk(0, fits))
    record = Assistant(content=None, reasoning=None, tool_calls=asm.completion().tool_calls)
    assert len(frame(record)) <= 4 * limit  # the bound the real limit relies on
    with pytest.raises(InferError, match="more than a session log record holds"):
        asm.feed(chunk(fits, 20))
