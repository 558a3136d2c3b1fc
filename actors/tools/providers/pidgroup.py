"""A pids cgroup per command: the process bound where ``RLIMIT_NPROC`` does not hold.

The kernel never applies ``RLIMIT_NPROC`` to root's processes (``fork`` checks the limit
only for a user other than root), and a sandbox started by root runs, seen from outside,
as root whatever uid it has inside. So when loopd runs as root, the bound on a command's
processes is a cgroup of its own with ``pids.max`` (cgroup v1's ``pids`` hierarchy, or v2
where the ``pids`` controller can be enabled below the host's cgroup), made for the
command and removed after it. Where no cgroup can be made (a container whose
``/sys/fs/cgroup`` is read-only), :func:`why_not` says so and the bound is not enforced
for root (said once at start). A host killed mid-command (SIGKILL) cannot remove its
command's cgroup; the next one to make a cgroup there removes those of hosts that are gone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from pathlib import Path

__all__ = ["PidGroup", "why_not"]

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


class PidGroup:
    """One command's pids cgroup (``make`` it, ``join`` the sandbox's first process to it,
    ``remove`` it once every process of the command is gone)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @staticmethod
    def make(limit: int) -> PidGroup:
        """A new cgroup holding at most ``limit`` tasks; OSError says why it could not be."""
        found = _own("pids")
        if found is None:
            raise OSError("no cgroup hierarchy with the pids controller is mounted")
        parent, v2 = found
        _sweep(parent)
        path = parent / f"loopd-cmd-{os.getpid()}-{next(_numbers)}"
        if v2 and "pids" not in (parent / "cgroup.subtree_control").read_text().split():
            (parent / "cgroup.subtree_control").write_text("+pids")
        path.mkdir()
        group = PidGroup(path)
        try:
            (path / "pids.max").write_text(str(limit))
        except OSError:
            group.remove()
            raise
        return group

    def join(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove the cgroup (retried briefly while its last processes are reaped)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.path.rmdir()


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


def why_not() -> str:
    """"" when a pids cgroup can be made here; else why not."""
    try:
        PidGroup.make(1).remove()
    except OSError as e:
        return str(e)
    return ""
