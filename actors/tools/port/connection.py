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

import collections
import contextlib
import dataclasses
import enum
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any, cast

import zmq

from actors.base.errors import WireError
from actors.tools.port.settings import PortSettings, configure
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec

__all__ = ["Connection", "PortState"]

log = logging.getLogger("loopd.toolport")

_HELLO_RETRY_S = 0.05  # while not connected: how often to try to say Hello
_ENDS_KEPT = 64  # why the last few connections ended (what a caller on one is told)


class PortState(enum.StrEnum):
    CONNECTING = "connecting"  # waiting for the host's tool list
    READY = "ready"
    DOWN = "down"  # the host died or stopped answering; reconnecting
    STOPPED = "stopped"  # the port was closed


@dataclasses.dataclass(frozen=True, slots=True)
class _HostExited:
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Stop:
    pass


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
        self.stopped = False
        self.generation = 0  # bumped each time the host is given up on
        # Called in this thread, with why, when a connected host stops answering or says it
        # is unhealthy (set by the supervisor, which kills a local host so it restarts).
        self.on_unresponsive: Callable[[str], None] = lambda _why: None
        self._ends: dict[int, str] = {}
        self._commands: collections.deque[_HostExited | _Stop] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(
            target=self._run, name=f"toolport-{settings.name}", daemon=True
        )
        self._sock: zmq.Socket[Any] | None = None
        self._poller: zmq.Poller | None = None
        self._last_rx = self._last_ping = self._last_hello = 0.0
        self._hello_sent = False

    # --- from other threads ----------------------------------------------------------------

    def why_ended(self, generation: int) -> str:
        """Why the connection of ``generation`` was given up (e.g. "exited (exit code 1)")."""
        return self._ends.get(generation, "was disconnected")

    def start(self) -> None:
        self._thread.start()

    def host_exited(self, reason: str) -> None:
        """The supervisor saw the host process end: give up on it now, not after heartbeats."""
        self._command(_HostExited(reason))

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._command(_Stop())
            self._thread.join(timeout)
        self.stopped = True

    def _command(self, command: _HostExited | _Stop) -> None:
        self._commands.append(command)
        with contextlib.suppress(BlockingIOError):  # a full pipe already wakes the thread
            os.write(self._wake_w, b"!")

    # --- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        self._poller = poller
        self._sock = self._new_socket(poller)
        try:
            while self._loop_once(poller):
                pass
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("tool port %s: connection thread failed", self.s.name)
        finally:
            self.stopped = True
            self._set_state(PortState.STOPPED, "the port was closed")
            poller.unregister(self._sock)
            self._sock.close(linger=0)
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _new_socket(self, poller: zmq.Poller) -> zmq.Socket[Any]:
        sock: zmq.Socket[Any] = self.ctx.socket(zmq.DEALER)
        configure(sock, self.s)
        sock.connect(self.s.endpoint)
        poller.register(sock, zmq.POLLIN)
        self._hello_sent = False
        self._last_hello = 0.0
        return sock

    def _loop_once(self, poller: zmq.Poller) -> bool:
        events = dict(poller.poll(self._timeout_ms()))
        if self._wake_r in events:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
        while self._commands:
            command = self._commands.popleft()
            if isinstance(command, _Stop):
                return False
            self._down(f"exited ({command.reason})", poller)
        assert self._sock is not None
        if self._sock in events:
            self._read()
        self._timers(poller)
        return True

    def _timeout_ms(self) -> int:
        hb = self.s.heartbeat_s
        if self.state is PortState.READY:
            wait = min(hb, self._last_ping + hb - time.monotonic())
        else:
            wait = _HELLO_RETRY_S
        return max(0, int(wait * 1000) + 1)

    def _send(self, frame: bytes) -> bool:
        assert self._sock is not None
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected (IMMEDIATE) or the host stopped reading
            return False
        return True

    def _read(self) -> None:
        assert self._sock is not None
        for _ in range(256):
            if not cast(int, self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:  # not Again
                return
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_rx = time.monotonic()
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
            if self.state is PortState.READY and self._poller is not None:
                self._down(msg.reason, self._poller)
                self.on_unresponsive(msg.reason)
            return
        if isinstance(msg, wire.Tools):
            self.specs = msg.tools
            if self.state is not PortState.READY:
                self._last_ping = self._last_rx
                self._set_state(PortState.READY, "")
        elif isinstance(msg, wire.Failed) and msg.id == 0:
            log.warning("tool host %s: %s", self.s.name, msg.message)
        else:  # no call is ever sent on this socket
            log.warning("tool host %s sent %s unasked", self.s.name, type(msg).__name__)

    def _timers(self, poller: zmq.Poller) -> None:
        now = time.monotonic()
        hb = self.s.heartbeat_s
        if self.state is PortState.READY:
            if now - self._last_rx >= 3 * hb:
                why = f"stopped answering (nothing for {now - self._last_rx:.1f} s)"
                self._down(why, poller)
                self.on_unresponsive(why)
            elif now - self._last_ping >= hb:
                self._send(_PING)
                self._last_ping = now
        else:
            interval = hb if self._hello_sent else _HELLO_RETRY_S
            if now - self._last_hello >= interval:
                self._last_hello = now
                self._hello_sent = self._send(_HELLO)

    def _down(self, why: str, poller: zmq.Poller) -> None:
        """The host is gone: end this generation and reconnect on a fresh socket."""
        self._ends[self.generation] = why
        self._ends.pop(self.generation - _ENDS_KEPT, None)
        self.generation += 1  # callers waiting on their own sockets see it within a pulse
        assert self._sock is not None
        poller.unregister(self._sock)
        self._sock.close(linger=0)
        self._sock = self._new_socket(poller)
        self._set_state(PortState.DOWN, why)

    def _set_state(self, state: PortState, reason: str) -> None:
        changed = state is not self.state or reason != self.reason
        self.state, self.reason = state, reason
        if state is PortState.READY:
            self.ready.set()
        else:
            self.ready.clear()
        if changed:
            log.info(
                "tool host %s: %s%s", self.s.name, state.value, f" ({reason})" if reason else ""
            )
