"""A calling thread's own DEALER to a tool host: a call with no thread hand-off.

ZeroMQ sockets are not thread-safe, so the port's I/O thread cannot lend its socket to
callers; handing each call to that thread and back costs two thread wake-ups, more than the
socket round trip itself. Instead each calling thread gets a DEALER of its own (made lazily
by that thread, used only by it), sends its request, and waits on that socket for the
answer in blocking receives of at most ``_CHECK_MS`` (cheaper than poll() over a second
descriptor), looking at its cancel token, its deadline and the port between them. The host
answers whichever routing id asked.

The I/O thread still owns liveness (heartbeats, the host's exit, the port's stop). When it
gives up on a connection it bumps :attr:`Link.generation`: a caller waiting on the dead host
fails within ``_CHECK_MS``, and a caller socket of an older generation is closed and
replaced before its next call, so nothing queued for a dead host reaches its successor.

Sockets are closed by their own thread, except those of threads that are idle or gone,
which the port closes under the lock when it stops (or a new caller arrives): the lock
gives the memory barrier libzmq asks for when a socket changes threads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

import zmq

from actors.cancel import CancelToken
from actors.errors import WireError
from actors.tools.protocol import wire
from actors.tools.protocol.wire import Answer, Cancel, Failed

if TYPE_CHECKING:
    from actors.tools.client.port import PortSettings

__all__ = ["Callers", "Link", "configure"]

log = logging.getLogger("loopd.toolport")

_CHECK_MS = 20  # how often a waiting call looks at its cancel token and the port's state


class Link(Protocol):
    """What the callers need to know of the port's connection (the I/O thread keeps it)."""

    @property
    def generation(self) -> int: ...  # bumped each time the host is given up on

    def why_ended(self, generation: int) -> str: ...  # e.g. "exited (exit code 1)"

    @property
    def stopped(self) -> bool: ...


def configure(sock: zmq.Socket[Any], settings: PortSettings) -> None:
    """Options every DEALER to a host gets (the I/O thread's and the callers')."""
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a host that is not there
    sock.setsockopt(zmq.MAXMSGSIZE, settings.max_frame_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    if settings.curve is not None:
        sock.curve_serverkey = settings.curve.server_key
        sock.curve_publickey = settings.curve.public
        sock.curve_secretkey = settings.curve.secret


class _Conn:
    """One thread's socket; ``busy`` and ``closed`` change under the lock."""

    __slots__ = ("busy", "closed", "generation", "sock", "thread")

    def __init__(self, sock: zmq.Socket[Any], generation: int) -> None:
        self.sock = sock
        self.generation = generation
        self.thread = weakref.ref(threading.current_thread())
        self.busy = False
        self.closed = False

    def close(self) -> None:
        """Close the socket (the caller holds the lock)."""
        if not self.closed:
            self.closed = True
            self.sock.close(linger=0)


class Callers:
    """The per-thread sockets of one port, and the call made on them."""

    def __init__(
        self, name: str, settings: PortSettings, ctx: zmq.Context[Any], link: Link
    ) -> None:
        self.name = name
        self.s = settings
        self.ctx = ctx
        self.link = link
        self._lock = threading.Lock()
        self._conns: set[_Conn] = set()
        self._local = threading.local()
        self._closed = False

    # --- from whoever stops the port -----------------------------------------------------

    def close(self) -> None:
        """The port stopped: close idle sockets now; busy ones close when their call ends."""
        with self._lock:
            self._closed = True
            for conn in list(self._conns):
                if not conn.busy:
                    conn.close()
                    self._conns.discard(conn)

    # --- from the calling thread ------------------------------------------------------------

    def _acquire(self, generation: int) -> _Conn | None:
        """This thread's socket for ``generation``, marked busy; None once the port is closed."""
        conn: _Conn | None = getattr(self._local, "conn", None)
        with self._lock:
            if self._closed:
                return None
            if conn is not None and (conn.closed or conn.generation != generation):
                conn.close()  # an older generation's: whatever it queued must not be sent
                self._conns.discard(conn)
                conn = None
            if conn is None:
                for old in [c for c in self._conns if c.thread() is None and not c.busy]:
                    old.close()  # its thread has ended
                    self._conns.discard(old)
                sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
                configure(sock, self.s)
                sock.setsockopt(zmq.RCVTIMEO, _CHECK_MS)  # blocking calls, with a pulse
                sock.setsockopt(zmq.SNDTIMEO, _CHECK_MS)
                sock.connect(self.s.endpoint)
                conn = _Conn(sock, generation)
                self._conns.add(conn)
                self._local.conn = conn
            conn.busy = True
        return conn

    def _release(self, conn: _Conn) -> None:
        with self._lock:
            conn.busy = False
            if self._closed or conn.generation != self.link.generation:
                conn.close()
                self._conns.discard(conn)

    def call(
        self,
        cid: int,
        tool: str,
        frame: bytes,
        cancel: CancelToken | None,
        limit: float,
        wait_connect: float,
    ) -> Answer:
        """Send ``frame`` on this thread's socket and wait for answer ``cid``; Failed otherwise."""
        generation = self.link.generation
        conn = self._acquire(generation)
        if conn is None:
            return Failed(cid, f"tool host {self.name}: the tool port is closed")
        try:
            return self._exchange(conn, generation, cid, tool, frame, cancel, limit, wait_connect)
        finally:
            self._release(conn)

    def _exchange(
        self,
        conn: _Conn,
        generation: int,
        cid: int,
        tool: str,
        frame: bytes,
        cancel: CancelToken | None,
        limit: float,
        wait_connect: float,
    ) -> Answer:
        sock = conn.sock
        start = time.monotonic()
        deadline = start + limit
        sent = False
        while True:
            # Blocking send/recv, each at most _CHECK_MS: cheaper than poll() with a second fd.
            if not sent:
                try:
                    sock.send(frame)  # waits while a fresh socket connects (IMMEDIATE)
                    sent = True
                except zmq.Again:
                    pass
            else:
                try:
                    answer = self._answer(sock.recv(), cid)
                except zmq.Again:
                    answer = None
                if answer is not None:
                    return answer
            now = time.monotonic()
            if self.link.stopped:
                return Failed(cid, f"tool host {self.name}: the tool port was closed")
            if self.link.generation != generation:
                why = self.link.why_ended(generation)  # the first end, not a later one
                if not sent:
                    return Failed(
                        cid,
                        f"tool host {self.name} is not connected ({why}); the call was not sent",
                    )
                return Failed(
                    cid,
                    f"tool host {self.name} {why} during the call; it may or may not have run",
                )
            if cancel is not None and cancel.cancelled:
                if sent:
                    self._cancel(sock, cid)
                return Failed(cid, "cancelled")
            if not sent and now - start >= wait_connect:
                return Failed(cid, f"tool host {self.name} is not connected; the call was not sent")
            if now >= deadline:
                if sent:
                    self._cancel(sock, cid)
                return Failed(
                    cid, f"tool host {self.name} did not answer {tool} within {limit:g} s"
                )

    def _answer(self, frame: bytes, cid: int) -> Answer | None:
        """The answer to ``cid`` if ``frame`` is it; anything else is logged and dropped."""
        try:
            msg = wire.decode(frame, self.s.max_frame_bytes)
        except WireError as e:
            if e.id == cid:
                return Failed(cid, f"tool host {self.name} sent a malformed answer: {e}")
            log.warning("tool host %s sent a bad frame: %s", self.name, e)
            return None
        if isinstance(msg, wire.Result | Failed | wire.Denied | wire.PendingApproval):
            if msg.id == cid:
                return msg
            if isinstance(msg, Failed) and msg.id == 0:
                log.warning("tool host %s: %s", self.name, msg.message)
            else:
                log.debug(
                    "tool host %s: answer to call %d came after the caller left", self.name, msg.id
                )
        else:
            log.warning(
                "tool host %s sent %s, which only a port sends", self.name, type(msg).__name__
            )
        return None

    def _cancel(self, sock: zmq.Socket[Any], cid: int) -> None:
        with contextlib.suppress(zmq.ZMQError):
            sock.send(_cancel_frame(cid), zmq.NOBLOCK)  # best effort: the host may be gone


def _cancel_frame(cid: int) -> bytes:
    return wire.encode(Cancel(cid))
