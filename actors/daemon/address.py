"""Where the daemon lives: its runtime directory, client socket and pid file.

The daemon and the CLI both read them from ``[daemon]``, so a ``loopd run`` finds the
``loopd serve`` of the same config without being told. The runtime directory is private
(mode 0700, owned by this user): whoever can reach the ipc:// socket can run turns.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from actors.base.config import Config
from actors.base.errors import ConfigError
from actors.base.private_places import runtime_dir

__all__ = [
    "IPC_MAX", "endpoint", "ensure_runtime_dir", "may_answer", "not_private", "pid_file",
    "runtime_dir",
]

IPC_MAX = 107  # bytes of an ipc:// path on Linux (sun_path)


def endpoint(config: Config) -> str:
    """The client socket: ``daemon.endpoint``, else ``ipc://RUNTIME_DIR/loopd.sock``."""
    if config.daemon.endpoint:
        given = config.daemon.endpoint
        if not given.startswith(("ipc://", "tcp://")):
            raise ConfigError(
                f"daemon.endpoint = {given!r}: use ipc:///path/loopd.sock or tcp://HOST:PORT"
            )
        return given
    path = runtime_dir(config) / "loopd.sock"
    if len(str(path).encode()) > IPC_MAX:
        raise ConfigError(
            f"daemon.runtime_dir: {path} is longer than an ipc:// socket path may be "
            f"({IPC_MAX} bytes); choose a shorter daemon.runtime_dir"
        )
    return f"ipc://{path}"


def may_answer(config: Config) -> bool:
    """Whether a daemon may answer at ``endpoint(config)``, known without connecting a
    client: not when nothing listens on its ipc:// socket, nor when the default socket is
    in a runtime directory others can reach (anybody's socket: not to be trusted). A command
    that finds none loads no daemon client (ZeroMQ's socket, the protocol's tables)."""
    where = endpoint(config)
    if not where.startswith("ipc://"):
        return True
    if not config.daemon.endpoint and not_private(runtime_dir(config)) is not None:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(where.removeprefix("ipc://"))
        except OSError:  # missing, or refused: a stale file left by a killed daemon
            return False
    return True


def pid_file(config: Config) -> Path:
    return runtime_dir(config) / "loopd.pid"


def not_private(path: Path) -> str | None:
    """Why directory ``path`` is not this user's own (0700), or None when it is."""
    try:
        info = path.stat()
    except OSError as e:
        return f"{path}: {e.strerror}"
    if info.st_uid != os.getuid():
        return f"{path} belongs to another user; choose a directory of your own"
    if stat.S_IMODE(info.st_mode) & 0o077:
        return (f"{path} can be reached by others (mode {stat.S_IMODE(info.st_mode):o}); "
                f"run: chmod 700 {path}")  # fmt: skip
    return None


def ensure_runtime_dir(config: Config) -> Path:
    """The runtime directory, created 0700; refused when others could reach it."""
    path = runtime_dir(config)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    problem = not_private(path)
    if problem is not None:
        raise ConfigError(f"daemon.runtime_dir: {problem}")
    return path
