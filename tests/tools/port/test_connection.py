"""actors/tools/port/connection.py on its own: Hello, heartbeats, giving up, reconnecting.

The host is a ROUTER on inproc:// that the test plays by hand (so it can answer, stay
silent or send nonsense exactly when it wants); the Connection's own thread is the real one.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from actors.tools.port.connection import Connection, PortState
from actors.tools.port.settings import PortSettings
from actors.tools.protocol import wire
from tests.support.watch import HANG_S
from tests.tools.fake_host import ECHO
from tests.tools.hostkit import HandHost, wait_until

_names = itertools.count()


class World:
    def __init__(self, ctx: zmq.Context[Any], heartbeat_s: float) -> None:
        endpoint = f"inproc://connection-{next(_names)}"
        self.host = HandHost(ctx, endpoint)
        self.conn = Connection(PortSettings("fake", endpoint, heartbeat_s=heartbeat_s), ctx)
        self.unresponsive: list[str] = []  # what the supervisor was told, in order
        self.conn.on_unresponsive = self.unresponsive.append
        self.conn.start()

    def connect(self) -> bytes:
        """Answer the port's Hello with the tool list; the port's routing id."""
        peer = self.host.expect(wire.Hello)
        self.host.send(peer, wire.Tools((ECHO,)))
        assert self.conn.ready.wait(HANG_S)
        return peer


@pytest.fixture
def world(request: pytest.FixtureRequest) -> Iterator[World]:
    """Heartbeats of 1 s (a host is given up on after 3 s of silence, far more than any test
    step takes) unless a test asks for others with ``parametrize("world", [s], indirect=True)``."""
    ctx: zmq.Context[Any] = zmq.Context()
    made = World(ctx, getattr(request, "param", 1.0))
    try:
        yield made
    finally:
        made.conn.stop()
        made.host.close()
        ctx.destroy(linger=0)


def test_it_says_hello_and_is_ready_with_the_tools_the_host_lists(world: World) -> None:
    assert world.conn.state is PortState.CONNECTING
    assert world.conn.specs == ()
    world.connect()
    assert world.conn.state is PortState.READY
    assert world.conn.reason == ""
    assert world.conn.specs == (ECHO,)


def test_hello_is_said_again_until_the_host_answers(world: World) -> None:
    first = world.host.expect(wire.Hello)
    again = world.host.expect(wire.Hello)  # no answer yet: asked once more, same socket
    assert first == again
    assert world.conn.state is PortState.CONNECTING


def test_a_host_that_answers_its_pings_stays_ready(world: World) -> None:
    peer = world.connect()
    # four heartbeats (1 s) answered, each well within three even when this thread is slow
    # to run on a busy machine: never given up on
    for _ in range(4):
        assert world.host.expect(wire.Ping) == peer
        world.host.send(peer, wire.Pong())
    assert world.conn.state is PortState.READY
    assert (world.conn.generation, world.unresponsive) == (0, [])


@pytest.mark.parametrize("world", [0.05], indirect=True)
def test_a_silent_host_is_given_up_on_and_a_fresh_socket_says_hello(world: World) -> None:
    peer = world.connect()
    wait_until(lambda: world.conn.generation == 1, what="the port to give up on the host")
    assert world.conn.state is PortState.DOWN
    assert world.conn.reason.startswith("stopped answering (nothing for ")
    assert world.conn.why_ended(0) == world.conn.reason
    assert world.unresponsive == [world.conn.reason]  # the supervisor, to restart the host
    fresh = world.host.expect(wire.Hello, not_from=peer)  # a new socket, a new routing id:
    # nothing the old connection queued reaches the next host
    world.host.send(fresh, wire.Tools(()))
    wait_until(lambda: world.conn.state is PortState.READY, what="the reconnection")
    assert world.conn.specs == ()


def test_the_host_process_exit_ends_the_connection_at_once(world: World) -> None:
    world.connect()
    world.conn.host_exited("exit code 1")
    wait_until(lambda: world.conn.generation == 1, what="the exit to be taken")
    assert world.conn.state is PortState.DOWN
    assert world.conn.why_ended(0) == "exited (exit code 1)"
    assert world.unresponsive == []  # the supervisor already knows


def test_a_host_that_says_it_is_unhealthy_is_given_up_on_with_its_reason(world: World) -> None:
    peer = world.connect()
    world.host.send(peer, wire.Unhealthy("worker 2 did not stop 5 s after its cancel"))
    wait_until(lambda: world.unresponsive, what="the port to give up on the host")  # its last act
    assert world.conn.generation == 1
    assert world.conn.why_ended(0) == "worker 2 did not stop 5 s after its cancel"
    assert world.unresponsive == ["worker 2 did not stop 5 s after its cancel"]
    world.host.expect(wire.Hello, not_from=peer)  # and it reconnects on a new socket


def test_each_generation_keeps_its_own_reason(world: World) -> None:
    world.connect()
    for n in range(3):
        world.conn.host_exited(f"exit code {n}")
        wait_until(lambda n=n: world.conn.generation == n + 1, what="the exit to be taken")
    assert [world.conn.why_ended(g) for g in range(3)] == [
        "exited (exit code 0)", "exited (exit code 1)", "exited (exit code 2)",
    ]
    assert world.conn.why_ended(3) == "was disconnected"  # the current one has not ended


def test_a_new_tool_list_while_ready_replaces_the_old(world: World) -> None:
    peer = world.connect()
    world.host.send(peer, wire.Tools(()))
    wait_until(lambda: world.conn.specs == (), what="the new list")
    assert world.conn.state is PortState.READY


def test_nonsense_from_the_host_is_logged_and_the_connection_goes_on(
    world: World, caplog: pytest.LogCaptureFixture
) -> None:
    peer = world.connect()
    with caplog.at_level(logging.WARNING, "loopd.toolport"):
        world.host.send(peer, b"\xc1 not msgpack")
        world.host.send(peer, wire.Result(3, "an answer on the wrong socket"))
        world.host.send(peer, wire.Failed(0, "the host is shutting down"))
        world.host.send(peer, wire.Tools(()))  # processed after the three above
        wait_until(lambda: world.conn.specs == (), what="the host's next message")
    assert "tool host fake sent a bad frame" in caplog.text
    assert "tool host fake sent Result unasked" in caplog.text
    assert "tool host fake: the host is shutting down" in caplog.text
    assert world.conn.state is PortState.READY


def test_stop_ends_the_thread_and_leaves_the_connection_stopped(world: World) -> None:
    world.connect()
    world.conn.stop()
    assert world.conn.stopped
    assert world.conn.state is PortState.STOPPED
    assert not world.conn.ready.is_set()
    world.conn.stop()  # twice is fine
