"""The workspace root of the file tools, and a path walk that cannot be led outside it.

Every path is walked one name at a time from a descriptor of the root (``openat``-style:
``os.open(name, dir_fd=...)`` with ``O_NOFOLLOW``), so the kernel never follows a symlink
and a directory swapped for a symlink mid-walk is seen, not followed. A symlink met on the
way is read (``readlinkat``) and its target walked the same way, from where it stands; a
target that climbs above the root (``..``) or names an absolute path outside it is
:class:`OutsideWorkspace`. ``..`` steps back along the descriptors actually walked, so it
can never climb past the root either. Missing directories (``write_file``) are made inside
the walk, each one opened without following anything right after it is made.

Only regular files are opened, with ``O_NONBLOCK`` and checked again on the descriptor: a
FIFO, socket or device is :class:`NotRegular` and nothing blocks. A file with more than one
hard link is not opened for writing (:class:`MultiplyLinked`): its other names may be
outside the workspace. Reading one is allowed (see
docs/configuration.md#what-the-tools-can-and-cannot-do).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import os
import stat
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeAlias

from actors.base.errors import UsageError

__all__ = [
    "MAX_DEPTH",
    "SKIP_DIRS",
    "Entry",
    "Guard",
    "MultiplyLinked",
    "NotRegular",
    "Opened",
    "OutsideWorkspace",
    "Refused",
    "Workspace",
    "kind_of",
]

# Directories the search and the workspace map do not enter (a tool can still list or read
# them by name): version control's, caches, installed packages.
SKIP_DIRS = frozenset({".git", ".hg", ".svn", "__pycache__", "node_modules", ".venv",
                       ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox"})
_MAX_LINKS = 40  # symlinks followed in one walk, as the kernel's own limit
MAX_DEPTH = 128  # directory levels Workspace.files goes down (a descriptor is open per level)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_WRITE = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


_Leaf: TypeAlias = Callable[[int, str], int]  # opens the last name of a walk in a directory
# Told each directory a write is about to make (False) and the file it opens (True), by its
# path relative to the root, before either happens; raises to stop the write there.
Guard: TypeAlias = Callable[[str, bool], None]


class Refused(Exception):
    """A path the file tools will not touch; the message says why and what to do."""


class OutsideWorkspace(Refused):
    """A path that leads outside the workspace."""


class NotRegular(Refused):
    """A FIFO, socket, device (anything but a regular file) where a file was wanted."""


class MultiplyLinked(Refused):
    """A file with other hard links, which a write would change too."""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """A file (its size in bytes) or a directory (size None) of :meth:`Workspace.tree`."""

    path: str  # relative to the root
    size: int | None


class _Symlink(Exception):
    """The name at the end of the walk is a symlink: read it and walk on."""


def kind_of(mode: int) -> str:
    """What a file is, in words ("FIFO", "socket", ...), for messages and listings."""
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "regular file" if stat.S_ISREG(mode) else "special file"


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    """A descriptor the walk opened, and the path it names relative to the root."""

    fd: int
    rel: str

    def close(self) -> None:
        os.close(self.fd)


class Workspace:
    """The root directory every file tool and run_command works in."""

    def __init__(self, root: str | os.PathLike[str], hidden: Iterable[str] = ()) -> None:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise UsageError(
                f"workspace {path} is not a directory; create it or set tools.workspace"
            )
        self.root = Path(os.path.realpath(path))
        # loopd's own places inside the workspace (its logs, keys, rules file...): refused
        self._hidden = tuple(sorted({
            parts for h in hidden for form in (os.path.abspath(h), os.path.realpath(h))
            if (parts := _inside(self.root, form))}))

    # --- what the tools call -------------------------------------------------------------

    def open_dir(self, path: str) -> Opened:
        """A descriptor of a directory in the workspace (the root for "" or ".")."""
        return self._walk(path, leaf=None)

    def open_read(self, path: str) -> Opened:
        """A read-only, non-blocking descriptor of a regular file in the workspace."""
        return self._walk(path, leaf=_open_read)

    def open_write(self, path: str, guard: Guard | None = None) -> Opened:
        """A descriptor to write a regular file (created, or emptied once it passed every
        check), its missing directories made inside the walk; ``guard`` is asked before
        each directory is made and before the file is opened, on where they are."""
        if guard is None:
            return self._walk(path, leaf=_open_write, make_dirs=True)

        def leaf(dfd: int, name: str, rel: str) -> int:
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISLNK(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode):
                    raise _Symlink  # walked on: the guard sees where it leads
            guard(rel, True)
            return _open_write(dfd, name)  # a link made since: ELOOP, walked on, guarded

        return self._walk(path, leaf=_open_write, make_dirs=True, guard=guard, guarded=leaf)

    def landing(self, path: str) -> str:
        """Where a write of ``path`` would land, relative to the root ("." for the root):
        every symlink on the way followed as the write's walk follows it (one in a parent
        directory, a dangling one at the end), missing directories taken as they are named.
        Nothing is made or opened for writing. The write itself walks again: compare what it
        reaches (:meth:`open_write`'s ``guard``) when the two must agree."""
        parts = deque(self._parts(path))
        fds = [os.open(self.root, _DIR)]
        names: list[str] = []  # past len(fds) - 1: missing directories, taken as named
        links = 0
        try:
            while parts:
                name = parts.popleft()
                if name == "..":
                    if not names:
                        raise self._outside(path)
                    if len(names) == len(fds) - 1:
                        os.close(fds.pop())
                    names.pop()
                    continue
                if len(names) > len(fds) - 1:
                    names.append(name)
                    continue
                target = None
                if parts:
                    try:
                        fds.append(os.open(name, _DIR, dir_fd=fds[-1]))
                        names.append(name)
                        continue
                    except OSError as e:
                        if e.errno in (errno.ELOOP, errno.ENOTDIR):
                            target = _readlink(fds[-1], name)
                        elif e.errno != errno.ENOENT:
                            raise
                else:
                    with contextlib.suppress(FileNotFoundError):
                        target = _readlink(fds[-1], name)
                if target is None:
                    names.append(name)
                    continue
                links = self._follow(path, target, links, fds, names, parts)
            return "/".join(names) or "."
        finally:
            for fd in fds:
                os.close(fd)

    def is_hidden(self, rel: str) -> bool:
        """True when ``rel`` (relative to the root) is, or is inside, one of loopd's places."""
        parts = tuple(p for p in rel.split("/") if p not in ("", "."))
        return any(parts[: len(h)] == h for h in self._hidden)

    def _refuse_hidden(self, given: str, rel: str) -> None:
        if self._hidden and self.is_hidden(rel):
            raise Refused(f"{given!r} is loopd's own data (its logs, keys, sockets or rules), "
                          "which the tools do not reach")

    def files(self, top: Opened, skip: frozenset[str] = frozenset()) -> Iterator[Opened]:
        """Every regular file under ``top``, opened for reading, in name order; symlinks are
        not followed, directories named in ``skip`` or deeper than ``MAX_DEPTH`` not
        entered. Each descriptor is closed when the next one is asked for; one descriptor
        per level is open at a time."""
        stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []

        def enter(dfd: int, rel: str) -> None:
            try:
                with os.scandir(dfd) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError:
                os.close(dfd)
                return
            stack.append((dfd, rel, iter(entries)))

        enter(os.dup(top.fd), top.rel)
        try:
            while stack:
                dfd, rel, entries = stack[-1]
                e = next(entries, None)
                if e is None:
                    os.close(dfd)
                    stack.pop()
                    continue
                name = _join(rel, e.name)
                if self.is_hidden(name):
                    continue
                if e.is_dir(follow_symlinks=False):
                    if e.name not in skip and len(stack) < MAX_DEPTH:
                        with contextlib.suppress(OSError):  # gone, or swapped for a link
                            enter(os.open(e.name, _DIR, dir_fd=dfd), name)
                elif e.is_file(follow_symlinks=False):
                    try:
                        fd = _open_read(dfd, e.name)
                    except (OSError, Refused, _Symlink):
                        continue  # changed under us: not searched
                    try:
                        yield Opened(fd, name)
                    finally:
                        os.close(fd)
        finally:
            for dfd, _, _ in stack:
                os.close(dfd)

    def tree(self, limit: int, skip: frozenset[str] = SKIP_DIRS) -> tuple[list[Entry], bool]:
        """Up to ``limit`` entries under the root, breadth first (the top level first, each
        directory in name order), and whether more were left out. The rule is :meth:`files`'s:
        loopd's places, symlinks, special files and ``skip``'s directories are left out, so
        the entries are what the search reads. Each directory is opened by the tools' own
        walk when its turn comes, one descriptor at a time."""
        found: list[Entry] = []
        todo: deque[str] = deque(["."])
        while todo and len(found) <= limit:
            try:
                opened = self.open_dir(todo.popleft())
            except (OSError, Refused):  # gone since, or changed into something refused
                continue
            try:
                entries = _entries(opened.fd)
            finally:
                opened.close()
            for name, size in entries:
                if len(found) > limit:
                    break
                rel = _join(opened.rel, name)
                if self.is_hidden(rel) or (size is None and name in skip):
                    continue
                found.append(Entry(rel, size))
                if size is None:
                    todo.append(rel)
        return found[:limit], len(found) > limit

    # --- the walk ------------------------------------------------------------------------

    def _parts(self, path: str) -> list[str]:
        if "\0" in path:
            raise OutsideWorkspace(f"path {path!r} contains a NUL character")
        if not os.path.isabs(path):
            return [p for p in path.split("/") if p not in ("", ".")]
        norm = os.path.normpath(path)
        root = str(self.root)
        if norm != root and not norm.startswith(root.rstrip("/") + "/"):
            raise OutsideWorkspace(
                f"{path!r} is outside the workspace {self.root}; use a path inside the "
                "workspace (relative paths start there)"
            )
        return [p for p in norm[len(root) :].split("/") if p not in ("", ".")]

    def _walk(self, path: str, *, leaf: _Leaf | None, make_dirs: bool = False,
              guard: Guard | None = None,
              guarded: Callable[[int, str, str], int] | None = None) -> Opened:
        parts = deque(self._parts(path))
        fds = [os.open(self.root, _DIR)]
        names: list[str] = []
        links = 0
        try:
            while parts:
                name = parts.popleft()
                if name == "..":
                    if not names:
                        raise self._outside(path)
                    os.close(fds.pop())
                    names.pop()
                    continue
                self._refuse_hidden(path, _join("/".join(names), name))
                rel = _join("/".join(names), name)
                if leaf is not None and not parts:
                    try:
                        fd = leaf(fds[-1], name) if guarded is None else guarded(
                            fds[-1], name, rel)
                    except _Symlink:
                        pass
                    else:
                        return Opened(fd, rel)
                else:
                    try:
                        made = None if guard is None else functools.partial(guard, rel, False)
                        fds.append(_open_dir(fds[-1], name, make=make_dirs, before=made))
                        names.append(name)
                        continue
                    except OSError as e:
                        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
                            raise
                target = _readlink(fds[-1], name)
                if target is None:
                    raise NotADirectoryError(errno.ENOTDIR, "not a directory", name)
                links = self._follow(path, target, links, fds, names, parts)
            if leaf is not None:
                raise IsADirectoryError(errno.EISDIR, "is a directory", path)
            top = fds.pop()
            return Opened(top, "/".join(names) or ".")
        finally:
            for fd in fds:
                os.close(fd)

    def _follow(self, path: str, target: str, links: int, fds: list[int], names: list[str],
                parts: deque[str]) -> int:
        """Take one symlink on the way to ``path``: an absolute ``target`` restarts the walk
        at the root (refused when it leads outside), a relative one goes on from here; the
        count of links taken, refused past ``_MAX_LINKS`` (a loop)."""
        links += 1
        if links > _MAX_LINKS:
            raise Refused(f"{path!r}: more than {_MAX_LINKS} symlinks on the way")
        if os.path.isabs(target):
            try:
                inside = self._parts(target)
            except OutsideWorkspace:
                raise self._outside(path, target) from None
            for fd in fds[1:]:
                os.close(fd)
            del fds[1:], names[:]
            parts.extendleft(reversed(inside))
        else:
            parts.extendleft(reversed([p for p in target.split("/") if p not in ("", ".")]))
        return links

    def _outside(self, given: str, target: str = "") -> OutsideWorkspace:
        via = f" (through a symlink to {target})" if target else ""
        return OutsideWorkspace(
            f"{given!r} leads outside the workspace {self.root}{via}; use a path inside the "
            "workspace (relative paths start there)"
        )


def _inside(root: Path, path: str) -> tuple[str, ...]:
    """``path``'s parts below ``root``; () when it is not strictly inside."""
    with contextlib.suppress(ValueError):
        return Path(path).relative_to(root).parts
    return ()


def _join(rel: str, name: str) -> str:
    return name if rel in ("", ".") else f"{rel}/{name}"


def _entries(dfd: int) -> list[tuple[str, int | None]]:
    """The directories (size None) and regular files (their size) of a directory, by name;
    symlinks and special files left out."""
    out: list[tuple[str, int | None]] = []
    with os.scandir(dfd) as it:
        for e in sorted(it, key=lambda e: e.name):
            try:
                if e.is_dir(follow_symlinks=False):
                    out.append((e.name, None))
                elif e.is_file(follow_symlinks=False):
                    out.append((e.name, e.stat(follow_symlinks=False).st_size))
            except FileNotFoundError:  # removed while listed
                continue
    return out


def _open_dir(dfd: int, name: str, *, make: bool,
              before: Callable[[], None] | None = None) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dfd)
    except FileNotFoundError:
        if not make:
            raise
    if before is not None:
        before()
    with contextlib.suppress(FileExistsError):  # made meanwhile: opened (and checked) below
        os.mkdir(name, 0o777, dir_fd=dfd)
    return os.open(name, _DIR, dir_fd=dfd)


def _readlink(dfd: int, name: str) -> str | None:
    """The target of symlink ``name`` in ``dfd``; None if it is not a symlink."""
    try:
        return os.readlink(name, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return None
        raise


def _check_regular(st: os.stat_result, name: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise _Symlink
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", name)
    if not stat.S_ISREG(st.st_mode):
        raise NotRegular(
            f"{name} is a {kind_of(st.st_mode)}, not a regular file; the file tools read and "
            "write regular files only"
        )


def _reopened(fd: int, before: os.stat_result | None, name: str) -> os.stat_result:
    """The descriptor's own stat, checked again: it is what will be read or written."""
    try:
        st = os.fstat(fd)
        _check_regular(st, name)
        if before is not None and (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise Refused(f"{name} changed while it was being opened; try again")
    except BaseException:
        os.close(fd)
        raise
    return st


def _open_read(dfd: int, name: str) -> int:
    before = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    _check_regular(before, name)  # nothing is opened that is not a regular file
    try:
        fd = os.open(name, _READ, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:  # swapped for a symlink since: walk it
            raise _Symlink from None
        raise
    _reopened(fd, before, name)
    return fd


def _open_write(dfd: int, name: str) -> int:
    try:
        before: os.stat_result | None = os.stat(name, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        before = None
    if before is not None:
        _check_regular(before, name)
        _check_links(before, name)
    try:
        fd = os.open(name, _WRITE, 0o644, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _Symlink from None
        if e.errno == errno.ENXIO:  # a FIFO with no reader, or a socket, made since
            raise NotRegular(
                f"{name} is not a regular file; the file tools write regular files only"
            ) from None
        raise
    st = _reopened(fd, before, name)
    try:
        _check_links(st, name)
        os.ftruncate(fd, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_links(st: os.stat_result, name: str) -> None:
    if st.st_nlink > 1:
        raise MultiplyLinked(
            f"{name} has {st.st_nlink} hard links; writing it would change the file under its "
            "other names too (which may be outside the workspace), so write_file refuses. "
            "Write a new file, or remove the other links first"
        )
