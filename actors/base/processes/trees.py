"""Killing process trees, so that no tool and no tool host outlives what started it.

Two kinds of grouping are used, and each has a killer here:

- a tool's subprocess runs in a **process group** of its own (``process_group=0``): on a
  timeout the host kills the whole group, plus every descendant psutil can still see (one
  that moved to another group while its parent lived);
- a tool host is started as the leader of a **session** of its own (``start_new_session``),
  and its tools' groups stay in that session. When the host dies, even by SIGKILL, the
  supervisor kills every process still in that session (the orphans psutil can no longer
  find from the dead host). Only a process that calls ``setsid`` itself escapes both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

import actors

__all__ = ["is_alive", "kill_group", "kill_session", "kill_tree", "loopd_env"]


def _kill_all(procs: list[psutil.Process], wait_s: float) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + wait_s
    while procs and time.monotonic() < deadline:
        procs = [p for p in procs if is_alive(p)]
        if procs:
            time.sleep(0.01)


def is_alive(p: psutil.Process) -> bool:
    """True while ``p`` runs; a zombie (dead, not yet reaped by its parent) is not alive."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_tree(pid: int, *, wait_s: float = 1.0) -> None:
    """SIGKILL ``pid`` and all its descendants (children first seen, then the parent)."""
    try:
        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except psutil.Error:
        return
    _kill_all(procs, wait_s)


def kill_group(pgid: int, *, also: int | None = None, wait_s: float = 1.0) -> None:
    """SIGKILL process group ``pgid`` and the descendants of ``also`` (a pid in it)."""
    procs: list[psutil.Process] = []
    if also is not None:
        with contextlib.suppress(psutil.Error):
            procs = psutil.Process(also).children(recursive=True)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _kill_all(procs, wait_s)


def kill_session(sid: int, *, wait_s: float = 1.0) -> int:
    """SIGKILL every process of session ``sid`` except this one; returns how many."""
    me = os.getpid()
    found: list[psutil.Process] = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if os.getsid(p.pid) == sid:
                found.append(p)
        except (ProcessLookupError, PermissionError):
            continue
    _kill_all(found, wait_s)
    return len(found)


def loopd_env() -> dict[str, str]:
    """This process's environment for a loopd child (a tool host, a detached daemon), with
    this loopd importable even when it is not installed."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(actors.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env
