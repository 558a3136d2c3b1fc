"""Durable writes and file locks, written once: every byte of a buffer, a file replaced
whole or not at all, a directory entry made durable, an exclusive ``flock`` (the kernel lets
go of it when its process dies, even by SIGKILL, so a lock is never stale)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fsync_dir", "lock", "locked", "named", "replace_file", "write_all"]


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; OSError if the system accepts nothing (no endless loop)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError("write wrote nothing")
        view = view[written:]


def lock(fd: int, *, wait: bool = True) -> bool:
    """Take the exclusive ``flock`` of ``fd``'s file, held until the fd is closed. With
    ``wait`` False: False at once when another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the exclusive lock of the file ``path`` (made when missing) for the block,
    waiting for whoever holds it: one writer at a time across processes."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        lock(fd)
        yield
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a new directory entry in ``path`` durable (the fsync of a file does not)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """``data`` in ``path``, whole or not at all, durably: written to a temporary file of
    this process beside it (mode 0600; never through a link someone left in its place),
    then renamed over ``path``. An OSError names ``path``; the temporary file is gone then."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # a crash's leftover
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as e:  # a full disk: the old file stays whole, the half new one goes
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise named(e, path) from None
    fsync_dir(path.parent)


def named(error: OSError, path: Path) -> OSError:
    """``error`` naming ``path`` (a failed ``write`` or ``fsync`` names no file)."""
    if error.filename is not None:
        return error
    return OSError(error.errno, error.strerror or str(error), str(path))
