"""The tool port: what a session holds to call the tools of one tool host.

Four parts, each with one job:

- :class:`PortHandle` is what callers hold. ``call`` blocks the calling thread until the
  answer, the timeout (``tools.timeout_s`` plus a grace so the host's own timeout answer
  arrives first), or the cancel token, and never raises for a tool failure: everything
  becomes ``Failed`` with a message a model can read.
- Calls to a connected host go out on the **calling thread's own DEALER**
  (:mod:`actors.tools.client.calls`): no thread hand-off, answers correlated by id, cancel and
  timeout watched by the caller, which then tells the host to stop the call.
- The **I/O thread** (:class:`_IO`) owns its own DEALER (ZeroMQ sockets are not
  thread-safe). It says Hello, pings the host every ``heartbeat_s`` and declares it dead
  after three silent intervals (every call in flight then gets ``Failed``: "tool host X
  stopped answering"), and reconnects with a fresh socket (callers replace theirs too), so
  nothing queued for a dead host is delivered to its successor. Calls made while the host
  is not connected go through this thread: they wait for it up to three heartbeats, then
  fail without having been sent.
- :class:`ToolPortActor`, a pykka actor, supervises: it starts the I/O thread, and for a
  local host it also starts the host process, learns of its exit from a waiter thread
  (calls in flight fail at once, not after the heartbeat), kills what the host left
  running, and starts it again with exponential backoff (0.1 s doubling to 5 s; not at all
  after exit code 2, a usage error a restart cannot fix). A local host that is alive but
  stops answering pings is killed, and so restarted.

Calls never go through the actor's mailbox: the actor may be busy restarting a host, and a
call must never wait on that (see ``scripts/bench_tools.py`` for what a call costs against a
bare socket).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import itertools
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, cast

import pykka
import zmq

from actors.cancel import CancelToken
from actors.config import ToolsConfig
from actors.errors import WireError
from actors.tools.client.calls import Callers, configure
from actors.tools.procs import kill_session
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.wire import Answer, Cancel, Failed, Hello, Ping, Pong, ToolRequest, Tools

__all__ = [
    "PORT_GRACE_S",
    "CurveClient",
    "HostLauncher",
    "PortHandle",
    "PortSettings",
    "PortState",
    "PortStatus",
    "ToolPortActor",
    "start_port",
    "stop_ports",
]

log = logging.getLogger("loopd.toolport")

PORT_GRACE_S = 0.75  # past tools.timeout_s, so the host's own timeout answer arrives first
_CANCEL_CHECK_S = 0.05  # how often a waiting call looks at its cancel token
_HELLO_RETRY_S = 0.05  # while not connected: how often to try to say Hello
_BACKOFF_FIRST_S, _BACKOFF_MAX_S, _STABLE_S = 0.1, 5.0, 10.0
_USAGE_EXIT = 2  # the host refused its flags or set-up: restarting would not help


class PortState(enum.StrEnum):
    CONNECTING = "connecting"  # waiting for the host's tool list
    READY = "ready"
    DOWN = "down"  # the host died or stopped answering; reconnecting
    STOPPED = "stopped"  # the port was closed


@dataclasses.dataclass(frozen=True, slots=True)
class CurveClient:
    """Keys to reach a CURVE host: its public key, and our key pair (Z85 bytes)."""

    server_key: bytes
    public: bytes
    secret: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class PortSettings:
    name: str
    endpoint: str
    timeout_s: float = 60.0
    heartbeat_s: float = 2.0
    max_frame_bytes: int = wire.DEFAULT_MAX_FRAME
    curve: CurveClient | None = None

    def __post_init__(self) -> None:
        for key in ("timeout_s", "heartbeat_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"tool port {self.name}: {key} = {value!r} must be positive")

    @classmethod
    def from_config(
        cls, name: str, endpoint: str, tools: ToolsConfig, curve: CurveClient | None = None
    ) -> PortSettings:
        return cls(name, endpoint, tools.timeout_s, tools.heartbeat_s, tools.max_frame_bytes, curve)


@dataclasses.dataclass(frozen=True, slots=True)
class PortStatus:
    state: PortState
    reason: str  # why it is not ready ("" when ready)
    tools: tuple[str, ...]
    pid: int | None  # the local host process, if this port started one
    restarts: int


class _Pending:
    """One call waiting for its answer; the first answer wins (reply, timeout or cancel)."""

    __slots__ = ("answer", "event", "frame", "id", "lock", "queued_at", "tool")

    def __init__(self, id: int, tool: str, frame: bytes) -> None:
        self.id, self.tool, self.frame = id, tool, frame
        self.event = threading.Event()
        self.lock = threading.Lock()
        self.answer: Answer | None = None
        self.queued_at = 0.0

    def resolve(self, answer: Answer) -> bool:
        with self.lock:
            if self.answer is not None:
                return False
            self.answer = answer
        self.event.set()
        return True


# --- the I/O thread ---------------------------------------------------------------------------


class _IO:
    """Owns the DEALER socket; everything else talks to it through :meth:`_command`."""

    def __init__(self, settings: PortSettings, context: zmq.Context[Any]) -> None:
        self.s = settings
        self.ctx = context
        self.state = PortState.CONNECTING
        self.reason = "starting"
        self.specs: tuple[ToolSpec, ...] = ()
        self.ready = threading.Event()
        # Called in the I/O thread when a connected host stops answering (set by the actor).
        self.on_unresponsive: Callable[[], None] = lambda: None
        self.stopped = False
        self.generation = 0  # bumped each time the host is given up on (see caller.py)
        self._ends: dict[int, str] = {}  # generation -> why it ended (the last few)
        self.callers = Callers(settings.name, settings, context, self)
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._thread = threading.Thread(
            target=self._run, name=f"toolport-{settings.name}", daemon=True
        )
        self._sock: zmq.Socket[Any] | None = None
        self._inflight: dict[int, _Pending] = {}
        self._queued: collections.deque[_Pending] = collections.deque()
        self._last_rx = self._last_ping = self._last_hello = 0.0
        self._hello_sent = False

    # called from other threads
    def why_ended(self, generation: int) -> str:
        """Why the connection of ``generation`` was given up (what a caller on it is told)."""
        return self._ends.get(generation, "was disconnected")

    def start(self) -> None:
        self._thread.start()

    def _command(self, *cmd: Any) -> None:
        self._commands.append(cmd)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_w, b"!")

    def submit(self, p: _Pending) -> None:
        self._command("call", p)

    def forget(self, p: _Pending) -> None:
        """The caller gave up on ``p``: drop it, and tell the host to stop it."""
        self._command("forget", p)

    def host_exited(self, reason: str) -> None:
        self._command("exited", reason)

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread.is_alive():
            self._command("stop")
            self._thread.join(timeout)
        self.stopped = True
        self.callers.close()

    # the thread
    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._wake_r, zmq.POLLIN)
        self._sock = self._new_socket(poller)
        try:
            while self._loop_once(poller):
                pass
        except Exception:  # pragma: no cover - a bug here must not leave callers hanging
            log.exception("tool port %s: I/O thread failed", self.s.name)
        finally:
            self.stopped = True
            self.callers.close()
            self._set_state(PortState.STOPPED, "the port was closed")
            late = [c[1] for c in self._commands if c[0] == "call"]
            for p in [*self._inflight.values(), *self._queued, *late]:
                p.resolve(Failed(p.id, f"tool host {self.s.name}: the tool port was closed"))
            self._inflight.clear()
            self._queued.clear()
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
            cmd = self._commands.popleft()
            if cmd[0] == "stop":
                return False
            self._on_command(cmd, poller)
        assert self._sock is not None
        if self._sock in events:
            self._read()
        self._timers(poller)
        return True

    def _timeout_ms(self) -> int:
        hb = self.s.heartbeat_s
        if self.state is PortState.READY:
            wait = 0.01 if self._queued else min(hb, self._last_ping + hb - time.monotonic())
        else:
            wait = _HELLO_RETRY_S
        return max(0, int(wait * 1000) + 1)

    def _on_command(self, cmd: tuple[Any, ...], poller: zmq.Poller) -> None:
        kind = cmd[0]
        if kind == "call":
            p: _Pending = cmd[1]
            p.queued_at = time.monotonic()
            if self.state is PortState.READY and not self._queued:
                self._send_call(p)
            else:
                self._queued.append(p)
        elif kind == "forget":
            p = cmd[1]
            if self._inflight.pop(p.id, None) is not None:
                self._send(wire.encode(Cancel(p.id)))
            with contextlib.suppress(ValueError):
                self._queued.remove(p)
        elif kind == "exited":
            self._down(f"exited ({cmd[1]})", poller)

    def _send(self, frame: bytes) -> bool:
        assert self._sock is not None
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:  # not connected (IMMEDIATE) or the host stopped reading
            return False
        return True

    def _send_call(self, p: _Pending) -> None:
        if self._send(p.frame):
            self._inflight[p.id] = p
        else:
            self._queued.appendleft(p)

    def _flush(self) -> None:
        while self._queued:
            q = self._queued.popleft()
            self._send_call(q)
            if q.id not in self._inflight:  # still cannot send: try again on the next tick
                break

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
                p = self._inflight.pop(e.id, None) if e.id is not None else None
                if p is not None:
                    p.resolve(Failed(p.id, f"tool host {self.s.name} sent a malformed answer: {e}"))
                else:
                    log.warning("tool host %s sent a bad frame: %s", self.s.name, e)
                continue
            self._on_message(msg)

    def _on_message(self, msg: wire.Message) -> None:
        if isinstance(msg, Pong):
            return
        if isinstance(msg, wire.Result | Failed | wire.Denied | wire.PendingApproval):
            p = self._inflight.pop(msg.id, None)
            if p is not None:
                p.resolve(msg)
            elif isinstance(msg, Failed) and msg.id == 0:
                log.warning("tool host %s: %s", self.s.name, msg.message)
            else:
                log.debug(
                    "tool host %s: answer to call %d came after the caller left",
                    self.s.name,
                    msg.id,
                )
        elif isinstance(msg, Tools):
            self.specs = msg.tools
            if self.state is not PortState.READY:
                self._last_ping = self._last_rx
                self._set_state(PortState.READY, "")
                self._flush()
        else:
            log.warning(
                "tool host %s sent %s, which only a port sends", self.s.name, type(msg).__name__
            )

    def _timers(self, poller: zmq.Poller) -> None:
        now = time.monotonic()
        hb = self.s.heartbeat_s
        if self.state is PortState.READY:
            self._flush()  # calls that waited for the connection, or found the socket busy
            if now - self._last_rx >= 3 * hb:
                self._down(f"stopped answering (nothing for {now - self._last_rx:.1f} s)", poller)
                self.on_unresponsive()
            elif now - self._last_ping >= hb:
                self._send(_PING)
                self._last_ping = now
        else:
            interval = hb if self._hello_sent else _HELLO_RETRY_S
            if now - self._last_hello >= interval:
                self._last_hello = now
                self._hello_sent = self._send(_HELLO)
        while (
            self._queued
            and self.state is not PortState.READY
            and now - self._queued[0].queued_at >= 3 * hb
        ):
            q = self._queued.popleft()
            q.resolve(
                Failed(
                    q.id,
                    f"tool host {self.s.name} is not connected ({self.reason}); "
                    "the call was not sent",
                )
            )

    def _down(self, why: str, poller: zmq.Poller) -> None:
        """The host is gone: fail what is in flight, and reconnect on a fresh socket."""
        for p in self._inflight.values():
            p.resolve(
                Failed(
                    p.id,
                    f"tool host {self.s.name} {why} during the call; it may or may not have run",
                )
            )
        self._inflight.clear()
        self._ends[self.generation] = why
        self._ends.pop(self.generation - 64, None)
        self.generation += 1
        # callers waiting on their own sockets see the new generation within caller._CHECK_MS
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


_PING = wire.encode(Ping())
_HELLO = wire.encode(Hello())


# --- the host process (local hosts) ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class HostLauncher:
    """How to start a local host: its command line, environment and log file."""

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    log_path: Path | None = None

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the host as the leader of a new session (see :mod:`actors.tools.procs`)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            out = open(self.log_path, "ab")  # noqa: SIM115 - closed right after the fork
        try:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=dict(self.env) if self.env is not None else None,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop_process(proc: subprocess.Popen[bytes], wait_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL; then kill whatever is left in the host's session."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    kill_session(proc.pid, wait_s=0.5)


# --- the actor --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Exited:
    generation: int
    returncode: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Restart:
    generation: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Unresponsive:
    pass


class ToolPortActor(pykka.ThreadingActor):
    """Supervises one port: its I/O thread and, for a local host, the host process."""

    def __init__(self, settings: PortSettings, io: _IO, launcher: HostLauncher | None) -> None:
        super().__init__()
        self.settings = settings
        self._io = io
        self._launcher = launcher
        self._proc: subprocess.Popen[bytes] | None = None
        self._generation = 0
        self._started_at = 0.0
        self._backoff = _BACKOFF_FIRST_S
        self._restarts = 0
        self._timer: threading.Timer | None = None
        self._stopping = False

    def on_start(self) -> None:
        ref = self.actor_ref

        def unresponsive() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Unresponsive())

        self._io.on_unresponsive = unresponsive
        self._io.start()
        if self._launcher is not None:
            self._spawn()

    def _spawn(self) -> None:
        assert self._launcher is not None
        self._generation += 1
        generation = self._generation
        try:
            proc = self._launcher.spawn()
        except OSError as e:
            log.error("tool host %s could not start: %s", self.settings.name, e)
            self._schedule_restart(generation)
            return
        self._proc, self._started_at = proc, time.monotonic()
        ref = self.actor_ref

        def wait() -> None:
            code = proc.wait()
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Exited(generation, code))

        threading.Thread(
            target=wait, name=f"toolhost-wait-{self.settings.name}", daemon=True
        ).start()

    def _schedule_restart(self, generation: int) -> None:
        delay = self._backoff
        self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
        ref = self.actor_ref

        def fire() -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Restart(generation))

        self._timer = threading.Timer(delay, fire)
        self._timer.daemon = True
        self._timer.start()
        log.warning("tool host %s: restarting in %.1f s", self.settings.name, delay)

    def on_receive(self, message: Any) -> Any:
        if (
            isinstance(message, _Exited)
            and message.generation == self._generation
            and not self._stopping
        ):
            reason = _exit_reason(message.returncode)
            self._io.host_exited(reason)
            if self._proc is not None:
                kill_session(self._proc.pid, wait_s=0.5)  # its tools' processes, orphaned
            if message.returncode == _USAGE_EXIT:
                log.error(
                    "tool host %s exited with code 2: bad usage or set-up (see its log); "
                    "it is not restarted",
                    self.settings.name,
                )
                return None
            if time.monotonic() - self._started_at > _STABLE_S:
                self._backoff = _BACKOFF_FIRST_S
            self._schedule_restart(message.generation)
        elif (
            isinstance(message, _Restart)
            and message.generation == self._generation
            and not self._stopping
        ):
            self._restarts += 1
            self._spawn()
        elif isinstance(message, _Unresponsive) and self._running() and not self._stopping:
            # Alive but silent (hung, stopped, or starved): kill it; its exit restarts it.
            log.warning("tool host %s stopped answering; killing it", self.settings.name)
            assert self._proc is not None
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        return None

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def status(self) -> PortStatus:
        return PortStatus(
            state=self._io.state,
            reason=self._io.reason,
            tools=tuple(s.name for s in self._io.specs),
            pid=self._proc.pid if self._proc is not None and self._running() else None,
            restarts=self._restarts,
        )

    def on_stop(self) -> None:
        self._cleanup()

    def on_failure(self, *_exc: Any) -> None:
        self._cleanup()

    def _cleanup(self) -> None:
        self._stopping = True
        if self._timer is not None:
            self._timer.cancel()
        self._io.stop()
        if self._proc is not None:
            _stop_process(self._proc)


# --- the handle -----------------------------------------------------------------------------------


class PortHandle:
    """What a session holds per host: thin and blocking; tool failures come back as ``Failed``."""

    def __init__(self, settings: PortSettings, io: _IO, ref: pykka.ActorRef[ToolPortActor]) -> None:
        self.name = settings.name
        self.settings = settings
        self._io = io
        self._ref = ref
        self._ids = itertools.count(1)

    def call(
        self,
        *,
        session: str,
        call: int,
        tool: str,
        arguments: Mapping[str, Any],
        cancel: CancelToken | None = None,
    ) -> Answer:
        """Run ``tool`` on the host; the answer, or Failed on timeout, cancel, or a dead host."""
        cid = next(self._ids)
        if self._io.stopped:
            return Failed(cid, f"tool host {self.name}: the tool port is closed")
        try:
            frame = wire.encode(ToolRequest(cid, session, call, tool, arguments))
        except WireError as e:
            return Failed(cid, f"the arguments of {tool} cannot be sent to its host: {e}")
        if len(frame) > self.settings.max_frame_bytes:
            return Failed(
                cid,
                f"the arguments of {tool} are {len(frame)} bytes, over the limit of "
                f"{self.settings.max_frame_bytes} (tools.max_frame_bytes); send less",
            )
        limit = self.settings.timeout_s + PORT_GRACE_S
        if self._io.state is PortState.READY:  # the usual case: on this thread's own socket
            wait_connect = 3 * self.settings.heartbeat_s
            return self._io.callers.call(cid, tool, frame, cancel, limit, wait_connect)
        p = _Pending(cid, tool, frame)
        self._io.submit(p)
        if self._io.stopped:  # closed between the check and the submit
            p.resolve(Failed(cid, f"tool host {self.name}: the tool port is closed"))
        deadline = time.monotonic() + limit
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if cancel is None:
                if p.event.wait(remaining):
                    break
                continue
            if p.event.wait(min(remaining, _CANCEL_CHECK_S)):
                break
            if cancel.cancelled:
                if p.resolve(Failed(cid, "cancelled")):
                    self._io.forget(p)
                break
        if p.answer is None and p.resolve(
            Failed(cid, f"tool host {self.name} did not answer {tool} within {limit:g} s")
        ):
            self._io.forget(p)
        assert p.answer is not None
        return p.answer

    def specs(self) -> list[ToolSpec]:
        """The host's tools as it last announced them (empty until it first connects)."""
        return list(self._io.specs)

    @property
    def state(self) -> PortState:
        return self._io.state

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the host has answered with its tool list; False after ``timeout``."""
        return self._io.ready.wait(timeout)

    def status(self, timeout: float = 5.0) -> PortStatus:
        """State, reason, tools, pid and restarts (STOPPED once the port is closed)."""
        try:
            return self._ref.proxy().status().get(timeout=timeout)  # type: ignore[no-any-return]
        except pykka.ActorDeadError:
            return PortStatus(PortState.STOPPED, "the port was closed", (), None, 0)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the port and, for a local host, the host process (and what it left running)."""
        with contextlib.suppress(pykka.ActorDeadError):
            self._ref.stop(timeout=timeout)
        self._io.stop()


def start_port(
    settings: PortSettings,
    *,
    launcher: HostLauncher | None = None,
    context: zmq.Context[Any] | None = None,
) -> PortHandle:
    """Start the actor (and the host process, given a launcher) and return the handle."""
    io = _IO(settings, context if context is not None else zmq.Context.instance())
    ref = ToolPortActor.start(settings, io, launcher)
    return PortHandle(settings, io, ref)


def stop_ports(ports: Sequence[PortHandle], timeout: float = 10.0) -> None:
    """Stop several ports (their host processes stop in parallel)."""
    futures = []
    for port in ports:
        with contextlib.suppress(pykka.ActorDeadError):
            futures.append(port._ref.stop(block=False))
    for f in futures:
        with contextlib.suppress(pykka.Timeout, pykka.ActorDeadError):
            f.get(timeout=timeout)
    for port in ports:
        port._io.stop()
