"""A host's loop keeps to one CPU (cheap hand-offs), and what its tools start does not."""

from __future__ import annotations

import os

import psutil
import pytest

from actors.tools.protocol import wire
from tests.tools.hostkit import ask, raw_dealer, short_dir, spawn_host

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs at least two CPUs to pin to one",
)


def test_the_loop_keeps_to_one_cpu_and_a_command_it_runs_to_all() -> None:
    every = sorted(os.sched_getaffinity(0))
    with short_dir() as d:
        endpoint = f"ipc://{d}/h.sock"
        args = ("--tools", "run_command", "--allow", "run_command", "--workspace", str(d))
        with spawn_host(endpoint, *args, log=d / "host.log") as proc, raw_dealer(endpoint) as sock:
            assert isinstance(ask(sock, wire.Hello(), timeout=30), wire.Tools)
            loop_cpus = psutil.Process(proc.pid).cpu_affinity()  # the main thread's
            command = "grep Cpus_allowed_list /proc/self/status"
            answer = ask(sock, wire.ToolRequest(1, "s", 1, "run_command", {"command": command}))
    assert loop_cpus is not None and len(loop_cpus) == 1
    assert isinstance(answer, wire.Result), answer
    listed = answer.content.split("Cpus_allowed_list:")[1].split()[0]
    allowed: set[int] = set()
    for part in listed.split(","):
        low, _, high = part.partition("-")
        allowed.update(range(int(low), int(high or low) + 1))
    assert sorted(allowed) == every
