"""A turn's messages reach the client in the order the turn made them; to a client that
asked (``turn.batch``), those made while the daemon's loop was busy leave together, as one
multipart message of at most BATCH_PARTS parts, each part one message.

The real loop (actors/daemon/server/loop.py) on a real ROUTER socket, in this process; the
session service's turn is a stand-in that holds the loop (a job posted to it waits on an
event) while it makes its events, so what is waiting when the loop sends is decided by the
test, not by timing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from actors.base.config import Config
from actors.base.events import Content
from actors.daemon import protocol as p
from actors.daemon.server.loop import BATCH_PARTS, SEND_QUEUE, Server
from actors.log.records import Usage
from actors.service.local import LocalService
from actors.service.types import TurnOutcome
from tests.support.watch import HANG_S

pytestmark = pytest.mark.timeout(120)
EVENTS = BATCH_PARTS + 36  # more than one multipart message holds


class _World:
    def __init__(self, config: Config) -> None:
        self.config = config

    def describe(self) -> str:
        return "stand-in"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Server, zmq.Context[Any], str]]:
    config = Config().replace("log", dir=str(tmp_path / "sessions"), fsync="never")
    ctx: zmq.Context[Any] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"inproc://loopd-batches-{id(tmp_path)}"
    sock.bind(endpoint)
    srv = Server(_World(config), sock, endpoint=endpoint, heartbeat_s=60,  # type: ignore[arg-type]
                 max_frame_bytes=4 * 1024 * 1024)
    thread = threading.Thread(target=srv.serve, daemon=True)

    def held_turn(self: LocalService, name: str, text: str, sink: Any, approver: Any,
                  cancel: Any = None, approve: tuple[str, ...] = ()) -> TurnOutcome:
        go = threading.Event()
        srv.loop.post(go.wait, HANG_S)  # the loop is busy until every event is made
        for n in range(EVENTS):
            sink(Content(f"w{n}"))
        go.set()
        usage = Usage({}, 0, False, 1, EVENTS, "stop")
        return TurnOutcome("answer", usage, 0, 0, False)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LocalService, "turn", held_turn)
        thread.start()
        yield srv, ctx, endpoint
        srv.request_stop()
        thread.join(HANG_S)
    ctx.destroy(linger=0)


def _turn(server: tuple[Server, zmq.Context[Any], str], batch: bool) -> list[list[p.Message]]:
    """The turn's answers as received: one list per ZeroMQ message, up to ``done``."""
    _, ctx, endpoint = server
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    sock.send(p.encode(p.Turn(7, "s", "hi", batch=batch)))
    received: list[list[p.Message]] = []
    while not received or not isinstance(received[-1][-1], p.Done | p.Error):
        assert sock.poll(HANG_S * 1000), f"{sum(map(len, received))} messages so far"
        received.append([p.decode(f, 1 << 30) for f in sock.recv_multipart()])
    sock.close()
    return received


@pytest.mark.parametrize("batch", [True, False])
def test_a_turns_messages_come_in_order_together_only_when_asked(
    server: tuple[Server, zmq.Context[Any], str], batch: bool
) -> None:
    received = _turn(server, batch)
    flat = [m for message in received for m in message]
    assert [m.data["text"] for m in flat[:-1]] == [f"w{n}" for n in range(EVENTS)]
    assert all(isinstance(m, p.EventMessage) and m.id == 7 for m in flat[:-1])
    assert isinstance(flat[-1], p.Done) and flat[-1].content == "answer"
    if batch:  # made while the loop was held: they left together, BATCH_PARTS at most
        assert len(received[0]) == BATCH_PARTS
        assert len(received[1]) >= EVENTS - BATCH_PARTS
    else:
        assert all(len(message) == 1 for message in received)
