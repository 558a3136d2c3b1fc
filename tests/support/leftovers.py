"""Processes a test started and may leave behind: the tool hosts of a killed parent, and a
block that kills whatever is left at its end."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import psutil

from actors.base.processes.trees import is_alive, kill_tree

__all__ = ["hosts_of", "leftovers_killed"]


def hosts_of(pid: int) -> list[psutil.Process]:
    """Living tool hosts started with ``--parent-pid pid`` (found even after a reparent)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "actors.tools.host" in cmd and "--parent-pid" in cmd and str(pid) in cmd:
            found.append(p)
    return [p for p in found if is_alive(p)]


@contextlib.contextmanager
def leftovers_killed() -> Iterator[None]:
    """Whatever this test started and left running is killed at the end, even on failure."""
    try:
        yield
    finally:
        for p in psutil.Process().children(recursive=True):
            cmd = " ".join(p.cmdline()) if is_alive(p) else ""
            if "crash_driver" in cmd or "actors.tools.host" in cmd:
                kill_tree(p.pid)
