"""The liveness of one tool host: a thread of its own that says Hello, pings, and gives up.

ZeroMQ sockets are not thread-safe, so this thread owns a DEALER used for nothing else: it
asks for the host's tool list (``Hello``), pings it every ``heartbeat_s`` and declares it
gone after three silent intervals, or at once when the supervisor reports the host
process's exit. Giving up bumps :attr:`Connection.generation` and reconnects on a fresh
socket: a call waiting on the old connection fails within a few milliseconds (see
:mod:`actors.tools.port.calls`), and nothing queued for a dead host reaches its successor.

Calls never go through this thread; it only knows whether the host is there.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable
from typing import Any

import zmq

from actors.base.errors import WireError
from actors.tools.port.settings import PortSettings, configure
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from actors.wire.loop import Heartbeat, Loop, Timer

__all__ = ["Connection", "PortState"]

log = logging.getLogger("loopd.toolport")

_HELLO_RETRY_S = 0.05  # while not connected: how often to try to say Hello
_ENDS_KEPT = 64  # why the last few connections ended (what a caller on one is told)


class PortState(enum.StrEnum):
    CONNECTING = "connecting"  # waiting for the host's tool list
    READY = "ready"
    DOWN = "down"  # the host died or stopped answering; reconnecting
    STOPPED = "stopped"  # the port was closed


_PING = wire.encode(wire.Ping())
_HELLO = wire.encode(wire.Hello())


class Connection:
    """The thread that knows whether a host is there, and what tools it offers."""

    def __init__(self, settings: PortSettings, context: zmq.Context[Any]) -> None:
        self.s = settings
        self.ctx = context
        self.state = PortState.CONNECTING
        self.reason = "starting"
        self.specs: tuple[ToolSpec, ...] = ()
        self.ready = threading.Event()
        # Set while READY, and for good once the supervisor gave the host up (exit code 2):
        # what start-up waits on, so it never waits the whole limit for a host that is done.
        self.settled = threading.Event()
        self.gave_up = False
        self.stopped = False
        self.generation = 0  # bumped each time the host is given up on
        # Called in this thread, with why, when a connected host stops answering or says it
        # is unhealthy (set by the supervisor, which kills a local host so it restarts).
        self.on_unresponsive: Callable[[str], None] = lambda _why: None
        self._ends: dict[int, str] = {}
        self._loop = Loop()
        self._thread = threading.Thread(
            target=self._run, name=f"toolport-{settings.name}", daemon=True
        )
        self._sock: zmq.Socket[Any] | None = None
        self._heartbeat: Heartbeat | None = None  # while READY
        self._hello: Timer | None = None  # while not READY: say Hello until the host answers

    # --- from other threads ----------------------------------------------------------------

    def why_ended(self, generation: int) -> str:
        """Why the connection of ``generation`` was given up (e.g. "exited (exit code 1)")."""
        return self._ends.get(generation, "was disconnected")

    def start(self) -> None:
        self._thread.start()

    def host_exited(self, reason: str, *, final: bool = False) -> None:
        """The supervisor saw the host process end: give up on it now, not after heartbeats.

        ``final``: it is not started again, so whoever waits for it stops waiting.
        """
        self._loop.post(self._exited, f"exited ({reason})", final)

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._loop.stop()
            self._thread.join(timeout)
        self.stopped = True

    # --- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        self._connect()
        try:
            self._loop.run()
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("tool port %s: connection thread failed", self.s.name)
        finally:
            self.stopped = True
            self._set_state(PortState.STOPPED, "the port was closed")
            self._disconnect()
            self._loop.close()

    def _connect(self) -> None:
        """A fresh socket to the host; Hello until it answers with its tools."""
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        configure(sock, self.s)
        sock.connect(self.s.endpoint)
        self._loop.add(sock, self._on_frames)
        self._sock = sock
        self._say_hello()

    def _disconnect(self) -> None:
        self._loop.cancel(self._hello)
        self._hello = None
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        if self._sock is not None:
            self._loop.remove(self._sock)
            self._sock.close(linger=0)
            self._sock = None

    def _say_hello(self) -> None:
        """Hello now; again in a moment while not connected, or a heartbeat after one went."""
        sent = self._send(_HELLO)
        self._hello = self._loop.call_later(
            self.s.heartbeat_s if sent else _HELLO_RETRY_S, self._say_hello
        )

    def _send(self, frame: bytes) -> bool:
        assert self._sock is not None
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected (IMMEDIATE) or the host stopped reading
            return False
        return True

    def _ping(self) -> None:
        self._send(_PING)

    def _on_frames(self, frames: list[bytes]) -> None:
        if self._heartbeat is not None:
            self._heartbeat.heard()
        for frame in frames:
            try:
                msg = wire.decode(frame, self.s.max_frame_bytes)
            except WireError as e:
                log.warning("tool host %s sent a bad frame: %s", self.s.name, e)
                continue
            self._on_message(msg)

    def _on_message(self, msg: wire.Message) -> None:
        if isinstance(msg, wire.Pong):
            return
        if isinstance(msg, wire.Unhealthy):
            if self.state is PortState.READY:
                self._unresponsive(msg.reason)
            return
        if isinstance(msg, wire.Tools):
            self.specs = msg.tools
            if self.state is not PortState.READY:
                self._loop.cancel(self._hello)
                self._hello = None
                self._heartbeat = Heartbeat(
                    self._loop, self.s.heartbeat_s, self._silent, ping=self._ping
                )
                self._set_state(PortState.READY, "")
        elif isinstance(msg, wire.Failed) and msg.id == 0:
            log.warning("tool host %s: %s", self.s.name, msg.message)
        else:  # no call is ever sent on this socket
            log.warning("tool host %s sent %s unasked", self.s.name, type(msg).__name__)

    def _silent(self, silence: float) -> None:
        self._unresponsive(f"stopped answering (nothing for {silence:.1f} s)")

    def _unresponsive(self, why: str) -> None:
        self._down(why)
        self.on_unresponsive(why)

    def _exited(self, why: str, final: bool) -> None:
        self.gave_up = self.gave_up or final
        self._down(why)  # settles, when final

    def _down(self, why: str) -> None:
        """The host is gone: end this generation and reconnect on a fresh socket."""
        self._ends[self.generation] = why
        self._ends.pop(self.generation - _ENDS_KEPT, None)
        self._disconnect()
        self._connect()
        self._set_state(PortState.DOWN, why)
        self.generation += 1  # callers waiting on their own sockets see it within a pulse

    def _set_state(self, state: PortState, reason: str) -> None:
        changed = state is not self.state or reason != self.reason
        self.state, self.reason = state, reason
        if state is PortState.READY:
            self.ready.set()
            self.settled.set()
        else:
            self.ready.clear()
            if self.gave_up:
                self.settled.set()
            else:
                self.settled.clear()
        if changed:
            log.info(
                "tool host %s: %s%s", self.s.name, state.value, f" ({reason})" if reason else ""
            )
