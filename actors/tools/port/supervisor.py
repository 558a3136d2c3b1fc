"""The supervisor of one tool host: starts a local host process, restarts it, stops it.

:class:`HostSupervisor`, a pykka actor, starts the connection thread and, for a local host,
the host process (a session leader of its own, so everything it starts can be killed with
it). A waiter thread tells it when the process exits: the connection gives up at once (calls
in flight fail now, not after the heartbeat), what the host left running is killed, and the
host is started again with exponential backoff (0.1 s doubling to 5 s; not at all after exit
code 2, a usage error a restart cannot fix). A local host that is alive but stops answering
pings, or answers that it is unhealthy (a worker that did not come back), is killed, and so
restarted.

Calls never go through this actor's mailbox: it may be busy restarting a host, and a call
must never wait on that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

import pykka

from actors.base.processes.trees import kill_session
from actors.tools.port.connection import Connection, PortState
from actors.tools.port.settings import PortSettings

__all__ = ["HostLauncher", "HostSupervisor", "PortStatus", "stop_process"]

log = logging.getLogger("loopd.toolport")

_BACKOFF_FIRST_S, _BACKOFF_MAX_S, _STABLE_S = 0.1, 5.0, 10.0
_USAGE_EXIT = 2  # the host refused its flags or set-up: restarting would not help


@dataclasses.dataclass(frozen=True, slots=True)
class PortStatus:
    state: PortState
    reason: str  # why it is not ready ("" when ready)
    tools: tuple[str, ...]
    pid: int | None  # the local host process, if this port started one
    restarts: int


@dataclasses.dataclass(frozen=True, slots=True)
class HostLauncher:
    """How to start a local host: its command line, environment and log file.

    ``on_line``: each line the host writes to stderr, as it comes (a thread copies them to
    the log too): how a host that needs the person (an MCP server's authorization URL)
    reaches them while start-up waits.
    """

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    log_path: Path | None = None
    on_line: Callable[[str], None] | None = None

    def spawn(self) -> subprocess.Popen[bytes]:
        """Start the host as the leader of a new session (:mod:`actors.base.processes.trees`)."""
        out: IO[bytes] | int = subprocess.DEVNULL
        if self.log_path is not None:
            out = open(self.log_path, "ab")  # noqa: SIM115 - closed right after the fork
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out if self.on_line is None else subprocess.PIPE,
                env=dict(self.env) if self.env is not None else None,
                start_new_session=True,
            )
        finally:
            if not isinstance(out, int):
                out.close()
        if self.on_line is not None and proc.stderr is not None:
            threading.Thread(target=_copy_lines, args=(proc.stderr, self.log_path, self.on_line),
                             name="toolhost-stderr", daemon=True).start()
        return proc


def _copy_lines(pipe: IO[bytes], log_path: Path | None, on_line: Callable[[str], None]) -> None:
    """Until the host's stderr closes: each line to the log, and to ``on_line``."""
    log_file = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115
    try:
        for raw in pipe:
            if log_file is not None:
                log_file.write(raw)
                log_file.flush()
            try:
                on_line(raw.decode("utf-8", "replace").rstrip("\n"))
            except Exception:  # a watcher's bug must not stop the copy (the host would block)
                log.exception("tool host stderr watcher failed")
    finally:
        pipe.close()
        if log_file is not None:
            log_file.close()


def _exit_reason(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


def stop_process(proc: subprocess.Popen[bytes], wait_s: float = 2.0) -> None:
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
    why: str


class HostSupervisor(pykka.ThreadingActor):
    """Supervises one port: its connection thread and, for a local host, the host process."""

    def __init__(
        self, settings: PortSettings, conn: Connection, launcher: HostLauncher | None
    ) -> None:
        super().__init__()
        self.settings = settings
        self._conn = conn
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

        def unresponsive(why: str) -> None:
            with contextlib.suppress(pykka.ActorDeadError):
                ref.tell(_Unresponsive(why))

        self._conn.on_unresponsive = unresponsive
        self._conn.start()
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
            self._conn.host_exited(reason, final=message.returncode == _USAGE_EXIT)
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
            # Alive but silent (hung, stopped, starved) or stuck: kill it; its exit restarts it.
            log.warning("tool host %s: %s; killing it", self.settings.name, message.why)
            assert self._proc is not None
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
        return None

    def _running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def status(self) -> PortStatus:
        return PortStatus(
            state=self._conn.state,
            reason=self._conn.reason,
            tools=tuple(s.name for s in self._conn.specs),
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
        self._conn.stop()
        if self._proc is not None:
            stop_process(self._proc)
