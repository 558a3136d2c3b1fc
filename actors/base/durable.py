"""Durable writes, written once: every byte of a buffer, and a directory entry made durable."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_dir", "write_all"]


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``; OSError if the system accepts nothing (no endless loop)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError("write wrote nothing")
        view = view[written:]


def fsync_dir(path: Path) -> None:
    """Make a new directory entry in ``path`` durable (the fsync of a file does not)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
