"""The pids cgroup of one command (root only: the process bound where RLIMIT_NPROC does not
hold). Skipped where no cgroup can be made; tests/faults/test_sandbox.py bounds a real
command with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from actors.tools.providers import pidgroup
from actors.tools.providers.pidgroup import CommandGroup, PidGroup
from tests.support.watch import wait_until


@pytest.fixture(autouse=True)
def cgroups() -> None:
    if os.geteuid() != 0 or pidgroup.why_not():
        pytest.skip(f"no pids cgroup can be made here: {pidgroup.why_not() or 'not root'}")


def test_a_group_holds_its_limit_and_is_removed_after() -> None:
    group = PidGroup.make(3)
    try:
        assert (group.path / "pids.max").read_text().strip() == "3"
        proc = subprocess.Popen(["sleep", "30"])
        group.join(proc.pid)
        assert str(proc.pid) in (group.path / "cgroup.procs").read_text().split()
        proc.kill()
        proc.wait()
    finally:
        group.remove()
    assert not group.path.exists()


def test_the_groups_of_hosts_that_are_gone_are_swept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host SIGKILLed mid-command left its command's cgroup; the next host removes it."""
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid no process has now
    own = PidGroup.make(5)
    stale = own.path.with_name(f"loopd-cmd-{dead.pid}-1")
    alive = own.path.with_name(f"loopd-cmd-{os.getpid()}-999")
    stale.mkdir()
    alive.mkdir()
    try:
        monkeypatch.setattr(pidgroup, "_swept", set())  # a new host process
        PidGroup.make(5).remove()
        assert not stale.exists()
        assert alive.exists()  # this process lives: its groups are its own to remove
    finally:
        for path in (stale, alive):
            if path.exists():
                path.rmdir()
        own.remove()


def test_a_memory_group_bounds_every_process_of_it_together() -> None:
    """Two processes of 40 MiB under a 64 MiB group: the kernel kills one, and the group
    says so (what the command's result names)."""
    if pidgroup.why_not("memory"):
        pytest.skip(f"no memory cgroup can be made here: {pidgroup.why_not('memory')}")
    group = CommandGroup.make(memory=64 << 20)
    eat = "b = bytearray(40 << 20); b[::4096] = bytes(len(b[::4096])); import time; time.sleep(30)"
    procs = []
    try:
        limit = next(p for p in ("memory.max", "memory.limit_in_bytes")
                     if (group.path / p).exists())
        assert int((group.path / limit).read_text()) == 64 << 20
        for _ in range(2):
            procs.append(subprocess.Popen([sys.executable, "-c", f"import os, sys; "
                                           f"sys.stdin.read(1); {eat}"],
                                          stdin=subprocess.PIPE))
            group.join(procs[-1].pid)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write(b"x")
            proc.stdin.close()
        wait_until(lambda: any(p.poll() is not None for p in procs), what="one to be killed")
        assert -signal.SIGKILL in [p.poll() for p in procs]
        assert group.oom_kills() >= 1
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        group.remove()
    assert not group.path.exists()
