"""Cgroups per command: its processes and its memory bounded as a whole.

**Memory.** ``RLIMIT_DATA`` bounds one process's heap and private maps, not a shared
anonymous ``mmap``, a ``memfd`` or the sum of many processes. So a command's memory is
bounded by a memory cgroup of its own (``memory.max``, or v1's ``memory.limit_in_bytes``,
swap included), made for it and removed after it, wherever one can be made (root, or a
delegated cgroup); a process past it is killed by the kernel and :meth:`CommandGroup.oom_kills`
says so. Where none can be made, the sandbox falls back to an address-space limit per process
(:mod:`actors.tools.providers.sandbox`).

**Processes.** The kernel never applies ``RLIMIT_NPROC`` to root's processes (``fork``
checks the limit only for a user other than root), and a sandbox started by root runs,
seen from outside, as root whatever uid it has inside. So when loopd runs as root, the
bound on a command's processes is a cgroup of its own with ``pids.max`` (cgroup v1's
``pids`` hierarchy, or v2 where the ``pids`` controller can be enabled below the host's
cgroup), made for the command and removed after it. Where no cgroup can be made (a
container whose ``/sys/fs/cgroup`` is read-only), :func:`why_not` says so and the bound
is not enforced for root (said once at start). A host killed mid-command (SIGKILL) cannot
remove its command's cgroup; the next one to make a cgroup there removes those of hosts
that are gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

__all__ = ["CommandGroup", "PidGroup", "why_not"]

_ROOT = Path("/sys/fs/cgroup")
_numbers = itertools.count(1)


def _own(controller: str) -> tuple[Path, bool] | None:
    """Where this process's cgroup is for ``controller`` (v1), or its v2 cgroup; and v2?"""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            base = _ROOT / controller
            if base.is_dir():
                return base / path.lstrip("/"), False
    for line in lines:
        if line.startswith("0::") and (_ROOT / "cgroup.controllers").exists():
            return _ROOT / line[3:].lstrip("/"), True
    return None


class CommandGroup:
    """One command's cgroups: a pids one (``pids``: tasks at most) and a memory one
    (``memory``: bytes at most, swap included, for all its processes together), in each
    hierarchy that holds the controller (cgroup v1), or one group with both (v2, where a
    process is in one cgroup only). ``make`` them, ``join`` the sandbox's first process,
    read ``oom_kills`` when the command ended, ``remove`` them after."""

    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths

    @property
    def path(self) -> Path:
        return self.paths[0]

    @staticmethod
    def make(*, pids: int = 0, memory: int = 0) -> CommandGroup:
        """New cgroups holding what is asked (0: not asked); OSError says why they could
        not be made (nothing is left behind then)."""
        wanted: dict[Path, tuple[bool, list[tuple[str, int]]]] = {}
        for controller, limit in (("pids", pids), ("memory", memory)):
            if not limit:
                continue
            found = _own(controller)
            if found is None:
                raise OSError(f"no cgroup hierarchy with the {controller} controller is mounted")
            parent, v2 = found
            wanted.setdefault(parent, (v2, []))[1].append((controller, limit))
        group = CommandGroup([])
        name = f"loopd-cmd-{os.getpid()}-{next(_numbers)}"
        try:
            for parent, (v2, limits) in wanted.items():
                _sweep(parent)
                if v2:
                    control = parent / "cgroup.subtree_control"
                    on = control.read_text().split()
                    for controller, _ in limits:
                        if controller not in on:
                            control.write_text(f"+{controller}")
                path = parent / name
                path.mkdir()
                group.paths.append(path)
                for controller, limit in limits:
                    _limit(path, controller, limit, v2)
        except OSError:
            group.remove()
            raise
        return group

    def join(self, pid: int) -> None:
        for path in self.paths:
            (path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        """How many of its processes the kernel killed at the memory bound (v1:
        ``memory.oom_control``, v2: ``memory.events``)."""
        kills = 0
        for path in self.paths:
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError, ValueError):
                    for line in (path / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            kills += int(value)
        return kills

    def remove(self) -> None:
        """Remove the cgroups (each retried briefly while its last processes are reaped)."""
        for path in self.paths:
            _rmdir(path)


class PidGroup(CommandGroup):
    """A command's pids cgroup alone."""

    @staticmethod
    def make(limit: int = 0, *, pids: int = 0, memory: int = 0) -> CommandGroup:
        return CommandGroup.make(pids=limit or pids, memory=memory)


def _limit(path: Path, controller: str, limit: int, v2: bool) -> None:
    if controller == "pids":
        (path / "pids.max").write_text(str(limit))
        return
    first, swap = (("memory.max", "memory.swap.max") if v2
                   else ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"))
    (path / first).write_text(str(limit))
    if (path / swap).exists():  # no swapping out past the bound either
        (path / swap).write_text("0" if v2 else str(limit))


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)
    with contextlib.suppress(OSError):
        path.rmdir()


_swept: set[Path] = set()


def _sweep(parent: Path) -> None:
    """Once per process: remove the empty cgroups of tool hosts that are gone (one killed
    mid-command, even by SIGKILL, could not remove its own)."""
    if parent in _swept:
        return
    _swept.add(parent)
    with contextlib.suppress(OSError):
        for child in parent.glob("loopd-cmd-*-*"):
            pid = child.name.split("-")[2]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):  # still busy, or raced: left
                    child.rmdir()


def why_not(controller: str = "pids") -> str:
    """"" when a cgroup of ``controller`` ("pids" or "memory") can be made here; else why
    not."""
    try:
        if controller == "pids":
            CommandGroup.make(pids=1).remove()
        else:
            CommandGroup.make(memory=1 << 30).remove()
    except OSError as e:
        return str(e)
    return ""
