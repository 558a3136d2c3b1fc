"""actors/tools/port/calls.py on its own: the classifier, the failure texts, and the
per-thread sockets of one call.

The host is a real ROUTER on inproc://, played by the test; the connection is a stand-in
whose state, generation and reasons the test sets (the real one is tested in test_port.py
and test_connection.py), so each way a call ends can be made to happen exactly when wanted.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
from collections.abc import Iterator
from typing import Any, cast

import msgpack
import pytest
import zmq

from actors.base.cancel import CancelToken
from actors.base.errors import WireError
from actors.tools.port import calls
from actors.tools.port.calls import CallSockets, classify
from actors.tools.port.connection import Connection, PortState
from actors.tools.port.settings import PortSettings
from actors.tools.protocol import wire
from tests.support.watch import HANG_S
from tests.tools.hostkit import HandHost, wait_until

MAX = wire.DEFAULT_MAX_FRAME
_names = itertools.count()


# --- the classifier ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [wire.Result(7, "out"), wire.Failed(7, "no"), wire.Denied(7, "outside"),
     wire.PendingApproval(7, "ok?")],
)  # fmt: skip
def test_each_kind_of_answer_to_this_call_is_returned_as_it_came(answer: wire.Answer) -> None:
    assert classify("h", wire.encode(answer), 7, MAX) == answer


def test_an_answer_to_another_call_is_left_for_nobody(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, "loopd.toolport"):
        assert classify("h", wire.encode(wire.Result(6, "late")), 7, MAX) is None
    assert "answer to call 6 came after the caller left" in caplog.text


def test_a_host_wide_failure_is_logged_not_taken_as_the_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "loopd.toolport"):
        assert classify("h", wire.encode(wire.Failed(0, "out of memory")), 7, MAX) is None
    assert "tool host h: out of memory" in caplog.text


@pytest.mark.parametrize("msg", [wire.Hello(), wire.Ping(), wire.Cancel(7),
                                 wire.ToolRequest(7, "s", 1, "echo", {})])
def test_a_message_only_a_port_sends_is_logged_and_dropped(
    msg: wire.Message, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "loopd.toolport"):
        assert classify("h", wire.encode(msg), 7, MAX) is None
    assert f"tool host h sent {type(msg).__name__}, which only a port sends" in caplog.text


def _bad_result(cid: int) -> bytes:
    """A result frame for ``cid`` whose content is not text."""
    fields = msgpack.unpackb(wire.encode(wire.Result(cid, "x")))
    return cast(bytes, msgpack.packb({**fields, "content": 3}))


def test_a_malformed_answer_that_names_this_call_fails_it_with_the_reason() -> None:
    answer = classify("h", _bad_result(7), 7, MAX)
    assert isinstance(answer, wire.Failed)
    assert answer.id == 7
    assert answer.message == (
        "tool host h sent a malformed answer: result.content: expected str, got int"
    )


@pytest.mark.parametrize("frame", [_bad_result(6), b"\xc1 not msgpack", b"x" * 2048])
def test_a_malformed_frame_for_another_call_or_none_is_logged_and_dropped(
    frame: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, "loopd.toolport"):
        assert classify("h", frame, 7, 1024) is None
    assert "tool host h sent a bad frame" in caplog.text


# --- the failure texts ---------------------------------------------------------------------


def test_every_failure_text_names_the_host_or_tool_and_says_whether_it_ran() -> None:
    error = WireError("result.id: bad")
    assert calls.closed("fs") == "tool host fs: the tool port is closed"
    assert calls.not_connected("fs", "starting") == (
        "tool host fs is not connected (starting); the call was not sent"
    )
    assert calls.lost("fs", "exited (exit code 1)") == (
        "tool host fs exited (exit code 1) during the call; it may or may not have run"
    )
    assert calls.timed_out("fs", "read_file", 60.75) == (
        "tool host fs did not answer read_file within 60.75 s"
    )
    assert calls.timed_out("fs", "read_file", 60.0).endswith("within 60 s")
    assert calls.malformed("fs", error) == "tool host fs sent a malformed answer: result.id: bad"
    assert calls.unsendable("write_file", error) == (
        "the arguments of write_file cannot be sent to its host: result.id: bad"
    )
    assert calls.too_large("write_file", 5000, 4096) == (
        "the arguments of write_file are 5000 bytes, over the limit of 4096 "
        "(tools.max_frame_bytes); send less"
    )


# --- the sockets of one call ---------------------------------------------------------------


class StandInConnection:
    """What CallSockets reads of a Connection; the test moves it between states."""

    def __init__(self) -> None:
        self.state = PortState.CONNECTING
        self.reason = "starting"
        self.ready = threading.Event()
        self.stopped = False
        self.generation = 0
        self.ends: dict[int, str] = {}

    def why_ended(self, generation: int) -> str:
        return self.ends.get(generation, "was disconnected")

    def up(self) -> None:
        self.state = PortState.READY
        self.ready.set()

    def end(self, why: str) -> None:
        """The host was given up on: the generation moves on, as Connection._down does."""
        self.ends[self.generation] = why
        self.generation += 1


class World:
    def __init__(self, ctx: zmq.Context[Any], heartbeat_s: float) -> None:
        endpoint = f"inproc://calls-{next(_names)}"
        self.settings = PortSettings("fake", endpoint, timeout_s=5.0, heartbeat_s=heartbeat_s)
        self.conn = StandInConnection()
        self.host = HandHost(ctx, endpoint)
        self.sockets = CallSockets(self.settings, ctx, cast(Connection, self.conn))
        self.pool = concurrent.futures.ThreadPoolExecutor(2)

    def call(self, cid: int, *, limit: float = 30.0, cancel: CancelToken | None = None,
             tool: str = "echo") -> wire.Answer:
        frame = wire.encode(wire.ToolRequest(cid, "s", 1, tool, {"text": "hi"}))
        return self.sockets.call(cid, tool, frame, cancel, limit)

    def call_later(self, cid: int, **kw: Any) -> concurrent.futures.Future[wire.Answer]:
        return self.pool.submit(self.call, cid, **kw)


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """A call waits 3 heartbeats for a host that is not connected: 0.15 s unless the test
    asks for more with ``@pytest.mark.parametrize("world", [seconds], indirect=True)``."""
    ctx: zmq.Context[Any] = zmq.Context()
    made = World(ctx, getattr(request, "param", 0.05))
    try:
        yield made
    finally:
        made.conn.stopped = True  # any call still waiting ends within a pulse
        made.pool.shutdown(wait=True)
        made.sockets.close()
        made.host.close()
        ctx.destroy(linger=0)


def test_a_call_is_sent_and_its_answer_returned_past_answers_to_others(world: World) -> None:
    world.conn.up()
    future = world.call_later(5)
    peer, request = world.host.receive()
    assert isinstance(request, wire.ToolRequest) and request.id == 5
    world.host.send(peer, wire.Result(4, "an earlier call's"))
    world.host.send(peer, b"\xc1 garbage")
    world.host.send(peer, wire.Result(5, "mine"))
    assert future.result(timeout=HANG_S) == wire.Result(5, "mine")


@pytest.mark.parametrize("world", [10.0], indirect=True)  # a 30 s wait: never reached
def test_a_call_waits_for_a_host_that_is_connecting_then_is_sent(world: World) -> None:
    future = world.call_later(1)
    assert not future.done()
    world.conn.up()
    peer, _ = world.host.receive()
    world.host.send(peer, wire.Result(1, "ok"))
    assert future.result(timeout=HANG_S) == wire.Result(1, "ok")


def test_a_host_that_never_connects_fails_the_call_unsent_with_the_reason(
    world: World,
) -> None:
    world.conn.reason = "the host process failed to start"
    answer = world.call(1)
    assert answer == wire.Failed(1, calls.not_connected("fake", "the host process failed to start"))
    assert world.sockets.open_count() == 0  # never sent: no socket was made


def test_a_stopped_or_cancelled_wait_for_the_host_ends_at_once(world: World) -> None:
    token = CancelToken()
    token.cancel()
    assert world.call(1, cancel=token) == wire.Failed(1, calls.CANCELLED)
    world.conn.stopped = True
    assert world.call(2) == wire.Failed(2, calls.closed("fake"))


def test_a_cancelled_call_fails_and_the_host_is_told_to_stop_it(world: World) -> None:
    world.conn.up()
    token = CancelToken()
    future = world.call_later(3, cancel=token)
    peer, _ = world.host.receive()
    token.cancel()
    assert future.result(timeout=HANG_S) == wire.Failed(3, calls.CANCELLED)
    assert world.host.receive() == (peer, wire.Cancel(3))


def test_a_call_past_its_limit_times_out_and_the_host_is_told(world: World) -> None:
    world.conn.up()
    future = world.call_later(4, limit=0.2, tool="slow")
    peer, _ = world.host.receive()
    assert future.result(timeout=HANG_S) == wire.Failed(4, calls.timed_out("fake", "slow", 0.2))
    assert world.host.receive() == (peer, wire.Cancel(4))


def test_a_host_given_up_on_during_the_call_fails_it_with_why(world: World) -> None:
    world.conn.up()
    future = world.call_later(6)
    world.host.receive()
    world.conn.end("exited (killed by SIGKILL)")
    world.conn.end("stopped answering (nothing for 6.0 s)")  # a later end is not this call's
    answer = future.result(timeout=HANG_S)
    assert answer == wire.Failed(6, calls.lost("fake", "exited (killed by SIGKILL)"))


def test_a_port_stopped_during_the_call_fails_it(world: World) -> None:
    world.conn.up()
    future = world.call_later(7)
    world.host.receive()
    world.conn.stopped = True
    assert future.result(timeout=HANG_S) == wire.Failed(7, calls.closed("fake"))


def _answered(world: World, cid: int) -> tuple[wire.Answer, bytes]:
    """A call on this thread, answered by a helper thread; the answer and the caller's id."""
    peers: list[bytes] = []

    def answer() -> None:
        peer, _ = world.host.receive()
        peers.append(peer)
        world.host.send(peer, wire.Result(cid, "ok"))

    helper = threading.Thread(target=answer)
    helper.start()
    try:
        return world.call(cid), peers[0] if peers else b""
    finally:
        helper.join()


def test_one_thread_reuses_its_socket_until_the_generation_moves_on(world: World) -> None:
    world.conn.up()
    first, peer1 = _answered(world, 1)
    second, peer2 = _answered(world, 2)
    assert (first, second) == (wire.Result(1, "ok"), wire.Result(2, "ok"))
    assert peer1 == peer2  # the same socket: the same routing id at the host
    assert world.sockets.open_count() == 1
    world.conn.end("exited (exit code 1)")  # a new connection: the old socket must not be used
    third, peer3 = _answered(world, 3)
    assert third == wire.Result(3, "ok")
    assert peer3 != peer1
    assert world.sockets.open_count() == 1  # the old one was closed, not kept beside it


def test_close_shuts_idle_sockets_now_and_a_busy_one_when_its_call_ends(world: World) -> None:
    world.conn.up()
    future = world.call_later(8)
    peer, _ = world.host.receive()  # busy: waiting for its answer
    world.sockets.close()
    assert world.sockets.open_count() == 1
    world.host.send(peer, wire.Result(8, "after close"))
    assert future.result(timeout=HANG_S) == wire.Result(8, "after close")
    wait_until(lambda: world.sockets.open_count() == 0, what="the busy socket to close")
    assert world.call(9) == wire.Failed(9, calls.closed("fake"))


def test_a_socket_whose_thread_ended_is_closed_when_the_next_caller_comes(world: World) -> None:
    world.conn.up()
    answers: list[wire.Answer] = []
    for cid in range(1, 4):  # each on a thread of its own that ends after its call
        caller = threading.Thread(target=lambda c=cid: answers.append(_answered(world, c)[0]))
        caller.start()
        caller.join()
    assert answers == [wire.Result(c, "ok") for c in range(1, 4)]
    assert world.sockets.open_count() == 1  # the last thread's; the earlier ones were closed
