"""One trace through the daemon: a client's span, the daemon's turn, its model requests and
its tool call, and the tool host's run of it, three processes, received by a real OTLP/HTTP
receiver (tests/support/otlp.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.base import telemetry
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.otlp import Receiver, Span, receiving
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

pytest.importorskip("opentelemetry.sdk.trace")


@pytest.fixture
def otlp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    """Tracing on here and in what starts after (the daemon, its hosts): the receiver's
    endpoint, batches sent at once."""
    with receiving(monkeypatch) as rx:
        yield rx


def _named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def test_a_turn_through_the_daemon_joins_the_clients_trace(
    tmp_path: Path, otlp: Receiver
) -> None:
    with short_dir() as d, FakeLlama(agent()) as fake:
        config = daemon_config(tmp_path, d / "run", fake.url)
        with Daemon(config) as daemon, daemon.client() as client:
            with telemetry.span("script asks", kind="client"):
                done = client.turn("traced", "t1 :: list_dir {}").run(lambda e: None)
            assert done.tool_calls == 1 and done.content == "done t1."
            assert telemetry.flush()
            spans = otlp.wait(lambda s: bool(
                _named(s, "script asks") and _named(s, "invoke_agent loopd")
                and len(_named(s, "chat llama-server")) == 2
                and _named(s, "execute_tool list_dir") and _named(s, "run_tool list_dir")))
    (asks,) = _named(spans, "script asks")
    (turn,) = _named(spans, "invoke_agent loopd")
    (tool,) = _named(spans, "execute_tool list_dir")
    (ran,) = _named(spans, "run_tool list_dir")
    chats = _named(spans, "chat llama-server")
    assert {s.trace_id for s in (asks, turn, tool, ran, *chats)} == {asks.trace_id}
    assert turn.parent_id == asks.span_id  # across the daemon protocol
    assert all(s.parent_id == turn.span_id for s in (tool, *chats))
    assert ran.parent_id == tool.span_id and ran.service == "loopd-toolhost"
    assert turn.attributes["gen_ai.conversation.id"] == "traced"
    assert tool.attributes["loopd.tool.host"] == "tools"
