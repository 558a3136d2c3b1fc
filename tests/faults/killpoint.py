"""Kill a child at a named point of its work: the child (``python -m MODULE ROOT POINT``)
prints the point's name when it gets there and then waits; the test SIGKILLs it there.
:func:`run_to_moment` does the same for a child that stops at a numbered moment
(tests/faults/moment_child.py), or runs to its end."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.support.watch import HANG_S

__all__ = ["kill_at", "run_to_moment"]

ROOT = Path(__file__).resolve().parents[2]


def kill_at(module: str, root: Path, point: str) -> None:
    """Run ``module`` on ``root`` until it says it reached ``point``, then SIGKILL it."""
    proc = subprocess.Popen([sys.executable, "-m", module, str(root), point], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        assert ready, f"{module} never reached {point}"
        assert proc.stdout.readline().strip() == point
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=HANG_S) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_to_moment(module: str, root: Path, k: int, when: str,
                  started: list[psutil.Process] | None = None,
                  said: list[str] | None = None) -> str:
    """Run ``module ROOT K WHEN`` until it prints ``moment ...`` (then SIGKILL it) or
    ``finished ...`` (then let it end); the line. ``started`` gets what it had started
    (orphans once it is killed: the caller waits for them to go), ``said`` the lines
    before."""
    with open(root / "child.err", "w") as err:  # what it said, for a failure's message
        proc = subprocess.Popen([sys.executable, "-m", module, str(root), str(k), when],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        assert proc.stdout is not None
        while True:
            ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
            assert ready, (f"{module} neither reached moment {k} nor finished: "
                           f"{(root / 'child.err').read_text()[-3000:]}")
            line = proc.stdout.readline()
            assert line, (f"{module} ended (code {proc.wait()}) before moment {k}: "
                          f"{(root / 'child.err').read_text()[-3000:]}")
            line = line.strip()
            if line.startswith(("moment ", "finished ")):
                break
            if said is not None:
                said.append(line)
        if line.startswith("finished "):
            assert proc.wait(timeout=HANG_S) == 0
            return line
        try:
            children = psutil.Process(proc.pid).children(recursive=True)
        except psutil.Error:
            children = []
        if started is not None:
            started.extend(children)
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=HANG_S) == -signal.SIGKILL
        return line
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
