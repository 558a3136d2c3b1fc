
"""The workspace root of the file tools, and the rule that nothing resolves outside it.

A path the model gives is taken relative to the root (an absolute path is taken as is) and
fully resolved, symlinks included; if the result is not the root or below it, the call is
denied. Resolving first and opening later leaves a window in which a directory could be
swapped for a symlink, so files are opened without following a final symlink, and the
opened descriptor's real path is checked again (``/proc/self/fd``) before it is used.
"""

from __future__ import annotations

import os
from pathlib import Path

from actors.errors import UsageError

__all__ = ["OutsideWorkspace", "Workspace"]


class OutsideWorkspace(Exception):
    """A path that resolves outside the workspace; the message says which and what to do."""


class Workspace:
    """The root directory every file tool and run_command works in."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise UsageError(
                f"workspace {path} is not a directory; create it or set tools.workspace"
            )
        self.root = Path(os.path.realpath(path))

    def resolve(self, path: str) -> Path:
        """The real path of ``path``; OutsideWorkspace if it is not in the workspace."""
        if "\0" in path:
            raise OutsideWorkspace(f"path {path!r} contains a NUL character")
        real = Path(os.path.realpath(self.root / path))
        self._check(path, real)
        return real

    def relative(self, real: Path) -> str:
        """How to name ``real`` to the model: relative to the root."""
        rel = os.path.relpath(real, self.root)
        return "." if rel == "." else rel

    def _check(self, given: str, real: Path) -> None:
        if real != self.root and not real.is_relative_to(self.root):
            raise OutsideWorkspace(
                f"{given!r} resolves to {real}, which is outside the workspace {self.root}; "
                "use a path inside the workspace (relative paths start there)"
            )

    def _check_fd(self, given: str, fd: int) -> None:
        link = f"/proc/self/fd/{fd}"
        if os.path.exists(link):  # no procfs (not Linux): the resolve check stands
            self._check(given, Path(os.readlink(link)))

    def open_read(self, path: str) -> int:
        """A read-only descriptor of a file in the workspace."""
        real = self.resolve(path)
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            self._check_fd(path, fd)
        except OutsideWorkspace:
            os.close(fd)
            raise
        return fd

    def open_write(self, path: str) -> int:
        """A descriptor to write (create or truncate) a file, its directories made as needed."""
        real = self.resolve(path)
        if real == self.root:
            raise IsADirectoryError(f"{path!r} is the workspace directory itself, not a file")
        real.parent.mkdir(parents=True, exist_ok=True)
        dfd = os.open(real.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._check_fd(path, dfd)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(real.name, flags, 0o644, dir_fd=dfd)
        finally:
            os.close(dfd)
