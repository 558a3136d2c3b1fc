"""Kill a child at a named point of its work: the child (``python -m MODULE ROOT POINT``)
prints the point's name when it gets there and then waits; the test SIGKILLs it there."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.watch import HANG_S

__all__ = ["kill_at"]

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
