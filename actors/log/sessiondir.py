"""The session directory's one owner: ``log.dir/NAME/`` and what is in it.

Every module that needs a session's place asks here (the world, fork, the slot keeper, the
session service, ACP, the CLI), and none of it needs pykka, so a command the daemon runs
learns a path without loading the world::

    log.dir/
      NAME/             one session (NAME: check_name)
        log.bin         its log (actors.log.file), the truth
        workspace       the workspace it was made with (actors.session.workspace)
      .forks.lock       forks are one at a time, across processes (actors.session.fork)
      .fork-NEW-XXXX/   a fork being built, renamed into NAME/ when whole

The KV state saved for a session lives with the model server's files, not here
(actors.inference.slots.files); :func:`remove_session` is told how to forget it.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from actors.base.config import Config
from actors.base.durable import lock
from actors.base.errors import SessionError, SessionLocked, UsageError

__all__ = [
    "FORK_LOCK", "LOG", "WORKSPACE", "check_name", "fork_leftovers", "fork_tmp",
    "kept_workspace", "list_sessions", "log_file", "remove_session", "session_path",
]  # fmt: skip

LOG = "log.bin"
WORKSPACE = "workspace"
FORK_LOCK = ".forks.lock"
_FORK_TMP = ".fork-"  # hidden: a session's name starts with a letter or digit
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_name(name: str) -> str:
    """``name`` when it is a safe directory name for a session, else UsageError (bad usage:
    exit 2, refused before anything starts)."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise UsageError(
            f"session name {name!r} is not allowed: use 1 to 128 letters, digits, '.', '_' "
            f"or '-', starting with a letter or digit (it becomes a directory name)"
        )
    return name


def log_file(log_dir: Path, name: str) -> Path:
    """``log_dir/NAME/log.bin``, for a caller that knows the directory, not the config (the
    slot keeper); the name is not checked."""
    return log_dir / name / LOG


def session_path(config: Config, name: str) -> Path:
    """Where session ``name``'s log lives: ``log.dir/NAME/log.bin`` (the name checked)."""
    return log_file(config.log_dir, check_name(name))


def kept_workspace(config: Config, name: str) -> Path | None:
    """The workspace session ``name`` was made with; None when none is known (no such
    session yet, or one made before sessions kept theirs)."""
    try:
        text = (config.log_dir / name / WORKSPACE).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None
    return Path(text) if text else None


def list_sessions(config: Config) -> list[str]:
    """The names of the sessions under ``config.log_dir``, sorted."""
    root = config.log_dir
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if _NAME.fullmatch(p.name) and (p / LOG).is_file()
    )


def fork_tmp(config: Config, new: str) -> Path:
    """A hidden directory of its own to build session ``new`` in before it is renamed."""
    return config.log_dir / f"{_FORK_TMP}{new}-{uuid.uuid4().hex[:8]}"


def fork_leftovers(config: Config) -> Iterator[tuple[Path, str]]:
    """(directory, the session name it was for) of each fork killed half-way."""
    for leftover in config.log_dir.glob(f"{_FORK_TMP}*"):
        if leftover.is_dir() and not leftover.is_symlink():
            yield leftover, leftover.name[len(_FORK_TMP):].rpartition("-")[0]


def remove_session(config: Config, name: str, forget_state: Callable[[Path], None]) -> None:
    """Delete session ``name``: ``forget_state(its log's path)`` (its saved KV state), then
    its directory.

    Refused (SessionLocked) while the session is open in a process; SessionError when there
    is no such session.
    """
    path = session_path(config, name)
    if path.parent.is_symlink():  # rmtree would refuse it; through it, anything could go
        raise SessionError(
            f"session {name}: its directory {path.parent} is a symlink (to "
            f"{os.readlink(path.parent)}); loopd deletes nothing through a symlink: remove "
            "it, and what it points to if you mean to, yourself"
        )
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SessionError(f"session {name} does not exist ({path})") from None
    except OSError as e:  # ELOOP: log.bin is a symlink
        raise SessionError(f"session {name}: {path} cannot be opened: {e.strerror}") from None
    try:
        if not lock(fd, wait=False):
            raise SessionLocked(f"session {name} is open in another process: end it there first")
        forget_state(path)
        shutil.rmtree(path.parent)
    finally:
        os.close(fd)
