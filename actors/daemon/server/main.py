"""``loopd serve``: one process with the World (model server, slot keeper, tool hosts) and the
client socket, until ``loopd stop`` or SIGTERM/SIGINT.

Start-up: the runtime directory (0700), then the pid file, locked for the daemon's life
(``flock``; the kernel lets go of it when the process dies, even by SIGKILL, so a stale pid
file never blocks a new daemon and two daemons never share one socket), then the World,
then the socket. Stop: the loop cancels the turns in flight and closes the sessions, the
World stops (the slot keeper saves every session's changed KV state, the hosts and the
embedded server stop), the socket and pid file go. Nothing is left running: a stop that
outlasts ``daemon.stop_grace_s`` kills what the daemon started and exits with code 1
(:mod:`actors.base.processes.stop_deadline`).

``--detach`` starts the same command in a new session, its output in
``RUNTIME_DIR/loopd.log``, and returns once its socket answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq

from actors.base import startup
from actors.base.config import Config
from actors.base.durable import lock
from actors.base.errors import DaemonError, UsageError
from actors.base.processes.stop_deadline import StopDeadline
from actors.base.processes.trees import loopd_env
from actors.daemon.address import endpoint, ensure_runtime_dir, pid_file
from actors.daemon.server.listening import BACKLOG
from actors.daemon.server.loop import SEND_QUEUE, Server
from actors.wire.curve import curve_server
from actors.wire.loop import SignalWake
from actors.wire.peer_guard import raise_fd_limit, seed_router_ids

__all__ = ["detach", "serve"]

log = logging.getLogger("loopd.daemon")


@contextlib.contextmanager
def _pid_lock(config: Config) -> Iterator[Path]:
    path = pid_file(config)
    try:  # never through a symlink: it would truncate whatever it points to
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK,
                     0o600)
    except OSError as e:
        raise UsageError(
            f"the pid file {path} cannot be opened ({e.strerror}"
            f"{': it is a symlink' if path.is_symlink() else ''}); remove it and start again"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UsageError(f"the pid file {path} is not a regular file; remove it and start again")
    try:
        if not lock(fd, wait=False):
            other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise UsageError(
                f"a loopd daemon is already running (pid {other}, {endpoint(config)}); "
                "`loopd stop` ends it"
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        os.close(fd)


def _bind(ctx: zmq.Context[Any], config: Config, where: str) -> tuple[zmq.Socket[Any], Any]:
    d = config.daemon
    if where.startswith("tcp://") and not (d.curve_secret and d.allow_keys):
        raise UsageError(
            f"daemon.endpoint = {where!r}: a tcp:// socket needs CURVE keys, daemon.curve_secret "
            "(make a pair with `loopd keys NAME`) and daemon.allow_keys (a directory of the "
            "clients' .key files); or leave daemon.endpoint empty for the private ipc:// socket"
        )
    seed_router_ids()  # before the ROUTER: the ids it gives peers are nobody's guess
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.BACKLOG, BACKLOG)
    sock.setsockopt(zmq.MAXMSGSIZE, d.max_frame_bytes)
    sock.setsockopt(zmq.SNDHWM, SEND_QUEUE)
    sock.setsockopt(zmq.LINGER, 0)
    auth = None
    try:
        if where.startswith("tcp://"):
            auth = curve_server(ctx, sock, d.curve_secret, d.allow_keys)
        elif where.startswith("ipc://"):
            with contextlib.suppress(FileNotFoundError):  # stale: we hold the pid lock
                os.unlink(where.removeprefix("ipc://"))
        sock.bind(where)
    except BaseException as e:
        sock.close(linger=0)
        if auth is not None:
            auth.stop()
        if isinstance(e, zmq.ZMQError):
            raise UsageError(f"daemon.endpoint: cannot bind {where}: {e}") from None
        raise
    return sock, auth


def serve(config: Config, say: Callable[[str], None]) -> int:
    """Run the daemon in this process until stopped; 0 after a clean stop."""
    from actors.session.world import start_world

    ensure_runtime_dir(config)
    fd_limit = raise_fd_limit()
    where = endpoint(config)
    stop = threading.Event()
    server: list[Server] = []

    def leave_no_trace() -> None:  # what the deadline's exit skips otherwise
        if where.startswith("ipc://"):
            with contextlib.suppress(OSError):
                os.unlink(where.removeprefix("ipc://"))
        with contextlib.suppress(OSError):
            pid_file(config).unlink()

    deadline = StopDeadline(config.daemon.stop_grace_s, leave_no_trace)

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        if server:
            server[0].request_stop()
        else:  # still starting: end the start-up the way Ctrl-C does
            raise KeyboardInterrupt

    with _pid_lock(config):
        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            with start_world(config, say, deadline=deadline) as world:
                ctx: zmq.Context[Any] = zmq.Context()
                sock, auth = _bind(ctx, config, where)
                try:
                    server.append(Server(
                        world, sock, endpoint=where, heartbeat_s=config.daemon.heartbeat_s,
                        max_frame_bytes=config.daemon.max_frame_bytes,
                        max_clients=config.daemon.max_clients,
                        max_sessions_per_client=config.daemon.max_sessions_per_client,
                        max_requests_per_client=config.daemon.max_requests_per_client,
                        max_requests=config.daemon.max_requests,
                        max_client_bytes=config.daemon.max_client_bytes,
                        fd_limit=fd_limit, on_stopping=deadline.arm,
                    ))  # fmt: skip
                    if stop.is_set():
                        server[0].request_stop()
                    say(f"loopd daemon pid {os.getpid()} serving on {where}")
                    startup.settled()
                    with SignalWake(server[0].loop):  # a SIGTERM taken by another thread
                        server[0].serve()
                finally:
                    sock.close(linger=0)
                    if auth is not None:
                        auth.stop()
                    ctx.term()
                    if where.startswith("ipc://"):
                        with contextlib.suppress(OSError):
                            os.unlink(where.removeprefix("ipc://"))
                say("stopping: saving KV state, stopping the tool hosts")
        except KeyboardInterrupt:
            say("stopped during start-up")
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    say("loopd daemon stopped")
    return 0


def detach(argv: list[str], config: Config, answers: Callable[[], bool]) -> int:
    """Start ``loopd serve`` (``argv`` without ``--detach``) in the background; its pid."""
    directory = ensure_runtime_dir(config)
    log_path = directory / "loopd.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "actors.cli", "serve", *argv], stdin=subprocess.DEVNULL,
            stdout=out, stderr=out, start_new_session=True, env=loopd_env(),
        )  # fmt: skip
    deadline = time.monotonic() + config.embedded.startup_timeout_s + 60
    while time.monotonic() < deadline:
        if answers():
            return proc.pid
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
            raise DaemonError(
                f"loopd serve exited with code {proc.returncode}; its log ({log_path}) ends:\n"
                + "\n".join(tail)
            )
        time.sleep(0.05)
    raise DaemonError(f"loopd serve did not answer within the start-up time; see {log_path}")
