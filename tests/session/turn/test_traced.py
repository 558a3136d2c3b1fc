"""Traces of a real turn, received by a real OTLP/HTTP receiver: the exporter's protobuf
decoded on loopback (tests/support/otlp.py), the turn against the fake llama-server, its
tool call through a real tool host process, whose own span joins the turn's trace."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.base import telemetry
from actors.base.config import parse
from actors.session.fork import fork_session
from actors.tools.registry import Registry
from actors.tools.toolbox import Toolbox
from tests.support.fake_llama import answer, context_full
from tests.support.otlp import Receiver, Span, receiving, traced
from tests.support.turn_rig import ECHO, Rig, ScriptedPort

pytest.importorskip("opentelemetry.sdk.trace")

Make = Callable[..., Rig]
SERVER, CLIENT = 2, 3  # the protobuf's span kinds


def _call_tool(tool: str, **arguments: Any) -> tuple[str, str]:
    return ("call_tool", json.dumps({"name": tool, "arguments": arguments}))


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with receiving(monkeypatch) as rx:
        yield rx


@pytest.fixture
def toolbox(tmp_path: Path, otlp: Receiver) -> Iterator[Toolbox]:
    """A real tool host (read_file), started after tracing is on: it inherits the endpoint."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("The greenhouse needs water on Fridays.\n")
    config = parse({"tools": {"workspace": str(workspace), "timeout_s": 10}})
    box = Toolbox.start(config, run_dir=tmp_path / "run")
    try:
        yield box
    finally:
        box.close()


def _one(spans: list[Span], name: str) -> Span:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _whole_turn(spans: list[Span]) -> bool:
    names = [s.name for s in spans]
    return names.count("chat llama-server") == 2 and {
        "invoke_agent loopd", "execute_tool read_file", "run_tool read_file"} <= set(names)


def test_one_turn_is_one_trace_through_the_tool_host(
    rig: Make, toolbox: Toolbox, otlp: Receiver
) -> None:
    r = rig([answer(tool_calls=[_call_tool("read_file", path="notes.txt")],
                    timings={"cache_n": 7, "prompt_n": 30, "predicted_n": 5}),
             answer("Water on Fridays.")], toolbox.registry)
    assert r.turn("What do my notes say?").content == "Water on Fridays."
    assert telemetry.flush()
    spans = otlp.wait(_whole_turn)  # the host's span comes from its own process's exporter

    turn = _one(spans, "invoke_agent loopd")
    chats = [s for s in spans if s.name == "chat llama-server"]
    tool = _one(spans, "execute_tool read_file")
    ran = _one(spans, "run_tool read_file")
    assert {s.trace_id for s in (turn, *chats, tool, ran)} == {turn.trace_id}
    assert turn.parent_id == "" and turn.service == "loopd"
    assert all(s.parent_id == turn.span_id for s in (*chats, tool))
    assert ran.parent_id == tool.span_id and ran.kind == SERVER
    assert ran.service == "loopd-toolhost"  # another process: its own resource

    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.name"] == "loopd"
    assert turn.attributes["gen_ai.conversation.id"] == "s"
    assert turn.attributes["loopd.turn.tool_calls"] == 1

    first = chats[0].attributes
    assert chats[0].kind == CLIENT and first["gen_ai.operation.name"] == "chat"
    assert first["gen_ai.request.model"] == "llama-server"
    assert first["server.address"] == "127.0.0.1" and isinstance(first["server.port"], int)
    assert first["gen_ai.usage.cache_read.input_tokens"] == 7
    assert first["gen_ai.usage.input_tokens"] > 0 and first["gen_ai.usage.output_tokens"] > 0
    assert first["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert first["loopd.time_to_first_token_ms"] >= 0
    assert "gen_ai.first_token" in [name for name, _ in chats[0].events]
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ["stop"]
    assert "gen_ai.input.messages" not in first  # content only when the setting says so

    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "read_file"
    assert tool.attributes["loopd.tool.called_as"] == "call_tool"
    assert tool.attributes["gen_ai.tool.call.id"]
    assert tool.attributes["loopd.tool.host"] == "files"  # the standard host of read_file
    assert tool.attributes["loopd.tool.outcome"] == "result"
    assert ran.attributes["loopd.tool.outcome"] == "result"

    # the GenAI metrics: two requests' duration and tokens (input and output)
    points = otlp.wait_points(lambda p: {x.metric for x in p} >= {
        "gen_ai.client.operation.duration", "gen_ai.client.token.usage"})
    duration = [p for p in points if p.metric == "gen_ai.client.operation.duration"]
    assert duration[-1].count == 2 and duration[-1].unit == "s"
    assert duration[-1].attributes["gen_ai.operation.name"] == "chat"
    tokens = {p.attributes["gen_ai.token.type"]: p for p in points
              if p.metric == "gen_ai.client.token.usage"}
    assert tokens["input"].count == 2 and tokens["input"].sum > 0
    assert tokens["output"].sum > 0


def test_a_denial_and_its_approval_wait_are_on_the_tool_span(
    rig: Make, otlp: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(telemetry.CAPTURE, "true")
    asks = dataclasses.replace(ECHO, needs_approval=True)  # no approver here: denied
    r = rig([answer(tool_calls=[_call_tool("echo", text="secret?")]), answer("Denied.")],
            Registry([ScriptedPort(specs=[asks])]))
    r.turn("Echo it")
    assert telemetry.flush()
    spans = otlp.wait(lambda s: "invoke_agent loopd" in {x.name for x in s})
    tool = _one(spans, "execute_tool call_tool")  # the double is no port: named as called
    assert tool.attributes["loopd.tool.outcome"] == "denied" and tool.status == 2
    ((event, waited),) = tool.events
    assert event == "loopd.approval_wait" and waited["loopd.approval.choice"] == "deny"
    assert waited["loopd.approval.wait_ms"] >= 0
    assert json.loads(tool.attributes["gen_ai.tool.call.arguments"])["arguments"] == {
        "text": "secret?"}
    turn = _one(spans, "invoke_agent loopd")
    said = json.loads(turn.attributes["gen_ai.input.messages"])
    assert said[0]["parts"][0]["content"] == "Echo it"


def _refusing() -> str:
    """An endpoint nothing listens on (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("kind", ["refuses", "hangs"])
def test_an_endpoint_that_refuses_or_hangs_never_fails_a_turn(
    rig: Make, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    hanging = socket.socket()  # accepts (the kernel's backlog) and never answers
    hanging.bind(("127.0.0.1", 0))
    hanging.listen(8)
    endpoint = _refusing() if kind == "refuses" else f"http://127.0.0.1:{hanging.getsockname()[1]}"
    traced(monkeypatch, endpoint, OTEL_EXPORTER_OTLP_TIMEOUT="0.3")
    try:
        with caplog.at_level(logging.WARNING, logger="loopd.telemetry"):
            r = rig([answer("One."), answer("Two."), answer("Three.")])
            assert [r.turn().content for _ in range(2)] == ["One.", "Two."]
            telemetry.flush(10)  # the first failure said, with the export bounded
            assert r.turn().content == "Three."
            telemetry.flush(10)
        said = [m for m in caplog.messages if "did not take" in m]
        assert len(said) == 1, caplog.messages  # once, not once per batch
        assert endpoint.rsplit(":", 1)[1] in said[0]
    finally:
        telemetry.reset()
        hanging.close()


def test_tracing_on_in_the_config_reaches_the_tool_hosts_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(telemetry.CHILD, "0")  # put back as it was after the test
    telemetry.configure(True)
    try:
        import os

        assert os.environ[telemetry.CHILD] == "1"
        assert telemetry.wanted(dict(os.environ))
    finally:
        telemetry.reset()


def test_loopds_own_spans_a_compaction_in_its_turn_and_a_fork(rig: Make, otlp: Receiver) -> None:
    r = rig([answer("one"), answer("two"), context_full(9000, 8192), answer("three")])
    r.config = r.config.replace("session", compaction="elide")  # no summary request
    r.runtime = dataclasses.replace(r.runtime, config=r.config)
    r.turn("first question")
    r.turn("second question")
    assert r.turn("third question").content == "three"  # compacted, asked again
    report = fork_session(r.config, "s", "s2")
    assert telemetry.flush()
    spans = otlp.wait(lambda s: {"loopd.compaction", "loopd.fork"} <= {x.name for x in s}
                      and len([x for x in s if x.name == "invoke_agent loopd"]) == 3)
    compaction = _one(spans, "loopd.compaction")
    (third,) = [s for s in spans if s.name == "invoke_agent loopd"
                and s.trace_id == compaction.trace_id]
    assert compaction.parent_id == third.span_id
    done = compaction.attributes
    assert done["loopd.compaction.why"] and done["gen_ai.conversation.id"] == "s"
    assert done["loopd.compaction.tokens_after"] < done["loopd.compaction.tokens_before"]
    chats = [s for s in spans if s.name.startswith("chat ") and s.trace_id == third.trace_id]
    full = [s for s in chats if s.status == 2]
    assert len(chats) == 2 and len(full) == 1  # the request the context refused, failed
    assert full[0].attributes["error.type"] == "InferError"
    fork = _one(spans, "loopd.fork").attributes
    assert fork["loopd.fork.source"] == "s" and fork["gen_ai.conversation.id"] == "s2"
    assert fork["loopd.fork.at"] == 3 and fork["loopd.fork.records"] == report.records
