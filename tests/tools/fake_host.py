"""A scripted tool host in a thread on ``inproc://``, for actor-level tests of the port.

It owns its ROUTER in its own thread (as a real host does), answers Hello and Ping unless
told to go silent, records every message it receives, and hands each ToolRequest to the
test's handler, which returns a message, raw bytes (sent as they are), or None (no answer;
the test may answer later with :meth:`FakeHost.send`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import zmq

from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from tests.support.watch import HANG_S

__all__ = ["ECHO", "FakeHost"]

ECHO = ToolSpec(
    "echo",
    "Answer with the text.",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)

Handler = Callable[[wire.ToolRequest], "wire.Message | bytes | None"]


def echo(req: wire.ToolRequest) -> wire.Message:
    return wire.Result(req.id, str(req.arguments.get("text", "")))


class FakeHost:
    def __init__(
        self,
        ctx: zmq.Context[Any],
        endpoint: str,
        tools: tuple[ToolSpec, ...] = (ECHO,),
        handler: Handler = echo,
    ) -> None:
        self.ctx, self.endpoint, self.tools, self.handler = ctx, endpoint, tools, handler
        self.received: list[wire.Message] = []
        self.silent = threading.Event()
        self._outbox: collections.deque[tuple[bytes, bytes]] = collections.deque()
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._peer = b""
        self._peers: dict[int, bytes] = {}  # request id -> the socket that sent it
        self._thread = threading.Thread(target=self._run, name="fake-host", daemon=True)

    def __enter__(self) -> FakeHost:
        self._thread.start()
        if not self._bound.wait(HANG_S):
            raise RuntimeError("fake host did not bind")
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(HANG_S)

    def send(self, msg: wire.Message | bytes) -> None:
        """Send (from any thread) to the peer that sent request ``msg.id``, else the last peer.

        A port calls from each calling thread's own socket, so answers must be routed.
        """
        peer = self._peers.get(getattr(msg, "id", -1), b"")
        self._outbox.append((peer, msg if isinstance(msg, bytes) else wire.encode(msg)))

    def requests(self) -> list[wire.ToolRequest]:
        return [m for m in list(self.received) if isinstance(m, wire.ToolRequest)]

    def peer_of(self, request_id: int) -> bytes:
        """The routing id of the socket that sent request ``request_id``."""
        return self._peers[request_id]

    def cancels(self) -> list[int]:
        return [m.id for m in list(self.received) if isinstance(m, wire.Cancel)]

    def _run(self) -> None:
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.endpoint)
        self._bound.set()
        try:
            while not self._stop.is_set():
                if sock.poll(10):
                    peer, frame = sock.recv_multipart()
                    self._peer = peer
                    self._on(sock, peer, frame)
                while self._outbox:
                    peer, frame = self._outbox.popleft()
                    sock.send_multipart([peer or self._peer, frame])
        finally:
            sock.close(linger=0)

    def _on(self, sock: zmq.Socket[Any], peer: bytes, frame: bytes) -> None:
        msg = wire.decode(frame)
        self.received.append(msg)
        if isinstance(msg, wire.ToolRequest):
            self._peers[msg.id] = peer
        if self.silent.is_set():
            return
        out: wire.Message | bytes | None = None
        if isinstance(msg, wire.Hello):
            out = wire.Tools(self.tools)
        elif isinstance(msg, wire.Ping):
            out = wire.Pong()
        elif isinstance(msg, wire.ToolRequest):
            out = self.handler(msg)
        if out is not None:
            sock.send_multipart([peer, out if isinstance(out, bytes) else wire.encode(out)])
