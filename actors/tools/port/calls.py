"""One call to a tool host, on the calling thread's own DEALER: no thread hand-off.

ZeroMQ sockets are not thread-safe, so the connection thread cannot lend its socket to
callers, and handing each call to that thread and back costs two thread wake-ups, more than
the socket round trip itself. Instead each calling thread gets a DEALER of its own (made
lazily by that thread, used only by it), sends its request, and waits on that socket for the
answer in blocking receives of at most ``_PULSE_MS`` (cheaper than poll() over a second
descriptor), looking at its cancel token, its deadline and the connection between them. The
host answers whichever routing id asked.

A call to a host that is not connected waits for it (``PortSettings.connect_wait_s``), then
fails without having been sent. When the connection thread gives up on a host it bumps its
generation: a caller waiting on the dead host fails within a pulse, and a caller socket of
an older generation is closed and replaced before its next call.

Sockets are closed by their own thread, except those of threads that are idle or gone,
which :meth:`CallSockets.close` (or a new caller) closes under the lock: the lock gives the
memory barrier libzmq asks for when a socket changes threads.

Every way a call can fail is one of the functions in the "failures" section: the one set of
texts a model reads about a tool host.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

import zmq

from actors.base.cancel import CancelToken
from actors.base.errors import WireError
from actors.tools.port.connection import Connection, PortState
from actors.tools.port.settings import PortSettings, configure
from actors.tools.protocol import wire
from actors.tools.protocol.wire import Answer, Failed, Questions

__all__ = ["CallSockets", "Questions", "classify"]

log = logging.getLogger("loopd.toolport")

_PULSE_MS = 20  # how often a waiting call looks at its cancel token and the connection


# --- failures: what the model reads when a call did not get the host's answer -----------------


def closed(host: str) -> str:
    return f"tool host {host}: the tool port is closed"


def not_connected(host: str, why: str) -> str:
    return f"tool host {host} is not connected ({why}); the call was not sent"


def lost(host: str, why: str) -> str:
    return f"tool host {host} {why} during the call; it may or may not have run"


def timed_out(host: str, tool: str, limit: float) -> str:
    return f"tool host {host} did not answer {tool} within {limit:g} s"


def malformed(host: str, error: WireError) -> str:
    return f"tool host {host} sent a malformed answer: {error}"


def unsendable(tool: str, error: WireError) -> str:
    return f"the arguments of {tool} cannot be sent to its host: {error}"


def too_large(tool: str, size: int, limit: int) -> str:
    return (
        f"the arguments of {tool} are {size} bytes, over the limit of {limit} "
        "(tools.max_frame_bytes); send less"
    )


CANCELLED = "cancelled"


# --- the one classifier of what a host sends on a call's socket ------------------------------


def classify(
    host: str, frame: bytes, cid: int, max_bytes: int
) -> Answer | wire.Ask | wire.Progress | None:
    """The answer to call ``cid`` (or a question it asks) if ``frame`` is it; anything else
    is logged and None."""
    try:
        msg = wire.decode(frame, max_bytes)
    except WireError as e:
        if e.id == cid:
            return Failed(cid, malformed(host, e))
        log.warning("tool host %s sent a bad frame: %s", host, e)
        return None
    if isinstance(msg, wire.Result | Failed | wire.Denied | wire.PendingApproval | wire.Ask
                  | wire.Progress):
        if msg.id == cid:
            return msg
        if isinstance(msg, Failed) and msg.id == 0:
            log.warning("tool host %s: %s", host, msg.message)
        else:
            log.debug("tool host %s: answer to call %d came after the caller left", host, msg.id)
    else:
        log.warning("tool host %s sent %s, which only a port sends", host, type(msg).__name__)
    return None


# --- the sockets --------------------------------------------------------------------------


class _Socket:
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


class CallSockets:
    """The per-thread sockets of one port, and the call made on them."""

    def __init__(self, settings: PortSettings, ctx: zmq.Context[Any], conn: Connection) -> None:
        self.name = settings.name
        self.s = settings
        self.ctx = ctx
        self.conn = conn
        self._lock = threading.Lock()
        self._sockets: set[_Socket] = set()
        self._local = threading.local()
        self._closed = False

    def close(self) -> None:
        """The port stopped: close idle sockets now; busy ones close when their call ends."""
        with self._lock:
            self._closed = True
            for s in list(self._sockets):
                if not s.busy:
                    s.close()
                    self._sockets.discard(s)

    def open_count(self) -> int:
        """How many sockets are open (tests: none may outlive the port)."""
        with self._lock:
            return len(self._sockets)

    def call(
        self, cid: int, tool: str, frame: bytes, cancel: CancelToken | None, limit: float,
        questions: Questions | None = None,
    ) -> Answer:
        """Send ``frame`` and wait for answer ``cid``; Failed for every other ending. A
        question the call asks on the way goes to ``questions`` (else it is declined)."""
        start = time.monotonic()
        if self.conn.state is not PortState.READY:
            waited = self._await_ready(cid, cancel, start)
            if waited is not None:
                return waited
        generation = self.conn.generation
        sock = self._acquire(generation)
        if sock is None:
            return Failed(cid, closed(self.name))
        try:
            return self._exchange(sock, generation, cid, tool, frame, cancel, start, limit,
                                  questions)
        finally:
            self._release(sock)

    def _await_ready(self, cid: int, cancel: CancelToken | None, start: float) -> Failed | None:
        """Wait for a host that is not connected; None once it is, else why not."""
        while not self.conn.ready.wait(_PULSE_MS / 1000):
            if self.conn.stopped:
                return Failed(cid, closed(self.name))
            if cancel is not None and cancel.cancelled:
                return Failed(cid, CANCELLED)
            if time.monotonic() - start >= self.s.connect_wait_s:
                return Failed(cid, not_connected(self.name, self.conn.reason))
        return None

    def _acquire(self, generation: int) -> _Socket | None:
        """This thread's socket for ``generation``, marked busy; None once closed."""
        s: _Socket | None = getattr(self._local, "socket", None)
        with self._lock:
            if self._closed:
                return None
            if s is not None and (s.closed or s.generation != generation):
                s.close()  # an older generation's: whatever it queued must not be sent
                self._sockets.discard(s)
                s = None
            if s is None:
                for old in [o for o in self._sockets if o.thread() is None and not o.busy]:
                    old.close()  # its thread has ended
                    self._sockets.discard(old)
                sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
                configure(sock, self.s)
                sock.setsockopt(zmq.RCVTIMEO, _PULSE_MS)  # blocking calls, with a pulse
                sock.setsockopt(zmq.SNDTIMEO, _PULSE_MS)
                sock.connect(self.s.endpoint)
                s = _Socket(sock, generation)
                self._sockets.add(s)
                self._local.socket = s
            s.busy = True
        return s

    def _release(self, s: _Socket) -> None:
        with self._lock:
            s.busy = False
            if self._closed or s.generation != self.conn.generation:
                s.close()
                self._sockets.discard(s)

    def _exchange(
        self,
        s: _Socket,
        generation: int,
        cid: int,
        tool: str,
        frame: bytes,
        cancel: CancelToken | None,
        start: float,
        limit: float,
        questions: Questions | None,
    ) -> Answer:
        sock = s.sock
        deadline = start + limit
        sent = False
        while True:
            # Blocking send/recv, each at most a pulse: cheaper than poll() with a second fd.
            if not sent:
                try:
                    sock.send(frame)  # waits while a fresh socket connects (IMMEDIATE)
                    sent = True
                except zmq.Again:
                    pass
            else:
                try:
                    answer = classify(self.name, sock.recv(), cid, self.s.max_frame_bytes)
                except zmq.Again:
                    answer = None
                if isinstance(answer, wire.Progress):
                    if questions is not None and questions.progress is not None:
                        questions.progress(answer)
                    latest = start + wire.PROGRESS_MAX_TIMES * limit  # as the host does
                    deadline = max(deadline, min(time.monotonic() + limit, latest))
                elif isinstance(answer, wire.Ask):
                    asked = time.monotonic()
                    self._answer(sock, answer, questions, deadline)
                    deadline += time.monotonic() - asked  # the person's time is not the call's
                elif answer is not None:
                    return answer
            now = time.monotonic()
            if self.conn.stopped:
                return Failed(cid, closed(self.name))
            if self.conn.generation != generation:
                why = self.conn.why_ended(generation)  # the first end, not a later one
                return Failed(cid, lost(self.name, why) if sent else not_connected(self.name, why))
            if cancel is not None and cancel.cancelled:
                if sent:
                    self._cancel(sock, cid)
                return Failed(cid, CANCELLED)
            if not sent and now - start >= self.s.connect_wait_s:
                return Failed(cid, not_connected(self.name, "no connection within the wait"))
            if now >= deadline:
                if sent:
                    self._cancel(sock, cid)
                return Failed(cid, timed_out(self.name, tool, limit))

    def _answer(
        self, sock: zmq.Socket[Any], question: wire.Ask, questions: Questions | None,
        deadline: float,
    ) -> None:
        """Ask the person (in this, the calling thread) and send the reply."""
        action: str
        content: Mapping[str, Any]
        if questions is None or questions.ask is None:
            action, content = "decline", {}
        else:
            by = time.monotonic() + (questions.timeout_s or max(0.0, deadline - time.monotonic()))
            try:
                action, content = questions.ask(question, by)
            except Exception:  # the person's side failed: the call goes on, declined
                log.exception("tool host %s: asking the person failed", self.name)
                action, content = "decline", {}
        reply = wire.Reply(question.id, question.question, action,
                           dict(content) if action == "accept" else {})
        try:
            sock.send(wire.encode(reply))
        except (zmq.ZMQError, WireError) as e:
            log.warning("tool host %s: the reply to a question was not sent: %s", self.name, e)

    def _cancel(self, sock: zmq.Socket[Any], cid: int) -> None:
        with contextlib.suppress(zmq.ZMQError):  # best effort: the host may be gone
            sock.send(wire.encode(wire.Cancel(cid)), zmq.NOBLOCK)
