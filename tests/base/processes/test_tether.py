"""tether: a child started through ``tethered`` dies with the process that started it, even
when that process is SIGKILLed (it cannot clean up), and ``exec`` leaves no extra process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from actors.base.processes.tether import SCRIPT, tethered

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PDEATHSIG")]

_SLEEPER = "import time; print('up', flush=True); time.sleep(120)"
_PARENT = textwrap.dedent(f"""
    import subprocess, sys, time
    SLEEPER = {_SLEEPER!r}
    from actors.base.processes.tether import tethered
    child = subprocess.Popen(tethered([sys.executable, "-c", SLEEPER]))
    print(child.pid, flush=True)
    time.sleep(120)
""")


def test_the_command_line_names_this_process() -> None:
    argv = tethered(["llama-server", "-m", "x"])
    assert argv[:5] == [sys.executable, "-I", "-S", SCRIPT, str(os.getpid())]
    assert argv[5:] == ["llama-server", "-m", "x"]


def test_a_tethered_child_dies_with_its_sigkilled_parent() -> None:
    root = str(Path(__file__).resolve().parents[3])
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE,
                              cwd=root, env={**os.environ, "PYTHONPATH": root})
    child: psutil.Process | None = None
    try:
        assert parent.stdout is not None
        child = psutil.Process(int(parent.stdout.readline()))
        assert parent.stdout.readline() == b"up\n"  # the command runs
        assert child.ppid() == parent.pid
        # exec'd in place: the tether process became the command itself
        assert child.cmdline()[1:3] == ["-c", _SLEEPER]
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        child.wait(30)  # psutil.TimeoutExpired here: the child outlived its parent
    finally:
        parent.kill()
        parent.wait(30)
        if child is not None and child.is_running():
            child.kill()
