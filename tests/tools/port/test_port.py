"""Actor-level tests of the tool port against a scripted host on inproc://."""

from __future__ import annotations

import concurrent.futures
import itertools
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import zmq

from actors.base.cancel import CancelToken
from actors.tools.port import PortSettings, PortState, ToolPort, start_port
from actors.tools.protocol import wire
from tests.support.watch import HANG_S
from tests.tools.fake_host import ECHO, FakeHost
from tests.tools.hostkit import wait_until

_names = itertools.count()


@pytest.fixture
def ctx() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)


@pytest.fixture
def endpoint() -> str:
    return f"inproc://fake-host-{next(_names)}"


class Ports:
    """Starts ports and stops every one of them at the end of the test."""

    def __init__(self, ctx: zmq.Context[Any]) -> None:
        self.ctx = ctx
        self.started: list[ToolPort] = []

    def __call__(self, endpoint: str, **settings: Any) -> ToolPort:
        # hang guards by default: a healthy fake host starved for a second on a loaded
        # machine is not given up on; a test that wants a limit to pass sets its own
        merged = {"timeout_s": 60.0, "heartbeat_s": 2.0, **settings}
        port = start_port(PortSettings("fake", endpoint, **merged), context=self.ctx)
        self.started.append(port)
        return port


@pytest.fixture
def ports(ctx: zmq.Context[Any]) -> Iterator[Ports]:
    made = Ports(ctx)
    try:
        yield made
    finally:
        for port in made.started:
            port.stop()


def _call(port: ToolPort, text: str = "hi", cancel: CancelToken | None = None) -> wire.Answer:
    return port.call(session="s1", call=3, tool="echo", arguments={"text": text}, cancel=cancel)


def test_a_call_round_trips_with_its_session_call_and_arguments(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint) as host:
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        answer = _call(port, "hello")
        assert isinstance(answer, wire.Result)
        assert answer.content == "hello"
        [req] = host.requests()
        assert (req.id, req.session, req.call, req.tool, dict(req.arguments)) == (
            answer.id, "s1", 3, "echo", {"text": "hello"},
        )  # fmt: skip
        assert port.specs() == (ECHO,)
        assert port.status().state is PortState.READY


def test_answers_are_matched_to_calls_by_id_whatever_their_order(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint, handler=lambda req: None) as host:
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            futures = [pool.submit(_call, port, f"t{i}") for i in range(3)]
            wait_until(lambda: len(host.requests()) == 3, what="three requests")
            for req in reversed(host.requests()):
                host.send(wire.Result(req.id, f"answer to {req.arguments['text']}"))
            answers = [f.result(timeout=HANG_S) for f in futures]
    assert [a.content for a in answers if isinstance(a, wire.Result)] == [
        "answer to t0", "answer to t1", "answer to t2",
    ]  # fmt: skip


def test_a_call_past_its_timeout_fails_and_the_host_is_told_to_stop_it(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint, handler=lambda req: None) as host:
        port = ports(endpoint, timeout_s=0.1)
        assert port.wait_ready(HANG_S)
        answer = _call(port)
        assert isinstance(answer, wire.Failed)
        assert "did not answer echo within" in answer.message
        wait_until(lambda: host.cancels() == [answer.id], what="the Cancel")


def test_a_cancelled_call_returns_at_once_and_the_host_is_told(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    token = CancelToken()
    with FakeHost(ctx, endpoint, handler=lambda req: None) as host:
        port = ports(endpoint, timeout_s=60)
        assert port.wait_ready(HANG_S)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(_call, port, "x", token)
            wait_until(lambda: len(host.requests()) == 1, what="the request")
            token.cancel()
            answer = future.result(timeout=HANG_S)
        assert answer == wire.Failed(host.requests()[0].id, "cancelled")
        wait_until(lambda: host.cancels() == [answer.id], what="the Cancel")


def test_a_host_that_stops_answering_fails_the_calls_in_flight(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    def go_silent(req: wire.ToolRequest) -> wire.Message | None:
        if len(host.requests()) == 1:
            host.silent.set()  # no answer, and no more pongs
            return None
        return wire.Result(req.id, "back")

    with FakeHost(ctx, endpoint, handler=go_silent) as host:
        port = ports(endpoint, timeout_s=60, heartbeat_s=0.5)  # silent for 1.5 s: gone
        assert port.wait_ready(HANG_S)
        answer = _call(port)  # only the heartbeat can end this call before 60 s
        assert isinstance(answer, wire.Failed)
        assert "tool host fake stopped answering" in answer.message
        assert port.state is not PortState.READY
        host.silent.clear()  # it comes back: the port reconnects on a fresh socket
        assert port.wait_ready(HANG_S)
        assert _call(port, "again") == wire.Result(host.requests()[-1].id, "back")


def test_a_malformed_answer_fails_its_call(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    def garbage(req: wire.ToolRequest) -> bytes:
        bad = {
            "v": 1,
            "kind": "result",
            "id": req.id,
            "content": 5,
            "class": "public",
            "untrusted": False,
        }
        return bytes(msgpack.packb(bad))

    with FakeHost(ctx, endpoint, handler=garbage):
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        answer = _call(port)
        assert isinstance(answer, wire.Failed)
        assert "sent a malformed answer" in answer.message
        assert "result.content: expected str" in answer.message


def test_garbage_without_an_id_is_dropped_and_the_port_goes_on(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    def garbage_then_answer(req: wire.ToolRequest) -> bytes:
        host.send(wire.ToolRequest(1, "s", 1, "x", {}))  # a kind only a port sends: ignored
        host.send(wire.Result(req.id, "real"))
        return b"\xc1 not msgpack"

    with FakeHost(ctx, endpoint, handler=garbage_then_answer) as host:
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        answer = _call(port)
        assert answer == wire.Result(answer.id, "real")
        assert port.state is PortState.READY


def _exits_during_a_call(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports, *reasons: str
) -> wire.Answer:
    """A call the host never answers; the supervisor reports the host's exit(s) mid-call."""
    with FakeHost(ctx, endpoint, handler=lambda req: None) as host:
        port = ports(endpoint, timeout_s=60)
        assert port.wait_ready(HANG_S)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            future = pool.submit(_call, port)
            wait_until(lambda: len(host.requests()) == 1, what="the request")
            for reason in reasons:  # what the supervising actor reports
                port.conn.host_exited(reason)
            return future.result(timeout=HANG_S)


def test_a_host_exit_fails_calls_in_flight_at_once(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    answer = _exits_during_a_call(ctx, endpoint, ports, "killed by SIGKILL")
    assert isinstance(answer, wire.Failed)
    assert "tool host fake exited (killed by SIGKILL) during the call" in answer.message


def test_a_call_made_before_the_host_is_up_is_sent_when_it_comes(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    port = ports(endpoint, heartbeat_s=10.0)  # waits up to 3 heartbeats for the host
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(_call, port, "early")
        with FakeHost(ctx, endpoint):
            answer = future.result(timeout=HANG_S)
    assert isinstance(answer, wire.Result)
    assert answer.content == "early"


def test_a_call_to_a_host_that_is_not_there_fails_without_being_sent(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    port = ports(endpoint, timeout_s=60, heartbeat_s=0.05)
    answer = _call(port)
    assert isinstance(answer, wire.Failed)
    assert "tool host fake is not connected (starting); the call was not sent" in answer.message
    assert port.specs() == ()


def test_arguments_over_the_frame_limit_are_refused_before_sending(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint) as host:
        port = ports(endpoint, max_frame_bytes=1024)
        assert port.wait_ready(HANG_S)
        answer = _call(port, "x" * 2000)
        assert isinstance(answer, wire.Failed)
        assert "over the limit of 1024 (tools.max_frame_bytes)" in answer.message
        assert host.requests() == []


def test_a_closed_port_answers_failed(ctx: zmq.Context[Any], endpoint: str, ports: Ports) -> None:
    with FakeHost(ctx, endpoint):
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        port.stop()
        answer = _call(port)
    assert isinstance(answer, wire.Failed)
    assert "the tool port is closed" in answer.message
    status = port.status()
    assert (status.state, status.reason) == (PortState.STOPPED, "the port was closed")


@pytest.mark.parametrize(
    ("arguments", "why"),
    [({"text": "\ud800"}, "surrogates not allowed"),  # JSON may carry a lone surrogate
     ({"n": 2**70}, "Integer value out of range")],
)  # fmt: skip
def test_arguments_that_cannot_be_encoded_fail_without_being_sent(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports, arguments: dict[str, Any], why: str
) -> None:
    with FakeHost(ctx, endpoint) as host:
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        answer = port.call(session="s1", call=1, tool="echo", arguments=arguments)
        assert isinstance(answer, wire.Failed)
        assert answer.message.startswith("the arguments of echo cannot be sent to its host: ")
        assert why in answer.message
        assert _call(port, "next") == wire.Result(answer.id + 1, "next")  # the port goes on
        assert [r.arguments["text"] for r in host.requests()] == ["next"]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -1.0])
def test_settings_refuse_a_timeout_or_heartbeat_that_is_not_a_positive_number(bad: float) -> None:
    with pytest.raises(ValueError, match=r"timeout_s = .* must be positive"):
        PortSettings("x", "inproc://x", timeout_s=bad)
    with pytest.raises(ValueError, match=r"heartbeat_s = .* must be positive"):
        PortSettings("x", "inproc://x", heartbeat_s=bad)


def test_each_calling_thread_calls_on_a_socket_of_its_own_that_the_stop_closes(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint) as host:
        port = ports(endpoint)
        assert port.wait_ready(HANG_S)
        here = [_call(port, "a"), _call(port, "b")]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            there = pool.submit(_call, port, "c").result(timeout=HANG_S)
        peers = [host.peer_of(a.id) for a in [*here, there]]
        assert peers[0] == peers[1]  # one thread keeps its socket
        assert peers[2] != peers[0]  # another thread has its own
        assert port.sockets.open_count() == 2
        port.stop()
        assert port.sockets.open_count() == 0


def test_after_the_host_comes_back_a_caller_gets_a_fresh_socket(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    with FakeHost(ctx, endpoint) as host:
        port = ports(endpoint, timeout_s=60)
        assert port.wait_ready(HANG_S)
        first = _call(port)
        port.conn.host_exited("killed by SIGKILL")  # the I/O thread gives up on the connection
        wait_until(lambda: port.conn.generation == 1, what="the port to give up on it")
        assert port.wait_ready(HANG_S)
        second = _call(port)
        assert isinstance(second, wire.Result)
        assert host.peer_of(second.id) != host.peer_of(first.id)


def test_a_caller_is_told_why_its_own_connection_ended_not_a_later_one(
    ctx: zmq.Context[Any], endpoint: str, ports: Ports
) -> None:
    answer = _exits_during_a_call(ctx, endpoint, ports, "the first end", "a later end")
    assert isinstance(answer, wire.Failed)
    assert "tool host fake exited (the first end) during the call" in answer.message
