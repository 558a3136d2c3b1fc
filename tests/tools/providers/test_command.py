"""run_shell's own rules, on real processes: captured, capped, stopped, and nothing left.

Without a sandbox (plain ``/bin/sh -c``): what bubblewrap adds is in test_sandbox.py and
tests/faults/test_sandbox.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

from actors.tools.providers.command import run_shell
from tests.support.watch import living, wait_until

ENV = {"PATH": "/usr/bin:/bin", "ONLY": "this"}


def test_output_of_both_streams_the_exit_code_cwd_and_env(tmp_path: Path) -> None:
    out = run_shell(
        ["/bin/sh", "-c", "pwd; echo err >&2; env | sort | grep -v '^PWD='; exit 7"],
        cwd=tmp_path, env=ENV, timeout_s=20, max_output=1000,
    )  # fmt: skip
    assert out.exit_code == 7
    assert out.stopped == ""
    assert out.dropped == 0
    lines = out.output.decode().splitlines()
    assert lines[0] == str(tmp_path)
    assert lines[1] == "err"
    assert [v for v in lines[2:] if not v.startswith(("SHLVL=", "OLDPWD=", "_="))] == [
        "ONLY=this", "PATH=/usr/bin:/bin",
    ]  # fmt: skip  # exactly the environment given, nothing inherited


def test_output_past_the_cap_is_read_and_counted_not_kept(tmp_path: Path) -> None:
    out = run_shell(
        ["/bin/sh", "-c", "head -c 300000 /dev/zero | tr '\\0' y; echo end >&2"],
        cwd=tmp_path, env=ENV, timeout_s=20, max_output=1000,
    )  # fmt: skip
    assert out.exit_code == 0  # never blocked on a full pipe
    assert out.output == b"y" * 1000
    assert out.dropped == 300000 + 4 - 1000


def test_a_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    # The limit is the stimulus; it must pass after the tree started, which takes
    # milliseconds alone and can take a second or more on a loaded machine.
    out = run_shell(
        ["/bin/sh", "-c", "sleep 310.1 & (sleep 310.2 & wait) & echo started; wait"],
        cwd=tmp_path, env=ENV, timeout_s=5, max_output=1000,
    )  # fmt: skip
    assert (out.exit_code, out.stopped) == (None, "timeout")
    assert out.output == b"started\n"
    wait_until(lambda: not living(["sleep", "310.1"]) and not living(["sleep", "310.2"]))


def test_a_cancel_stops_it(tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    out = run_shell(
        ["/bin/sh", "-c", "sleep 311.1"], cwd=tmp_path, env=ENV, timeout_s=20,
        max_output=1000, cancel=cancel,
    )  # fmt: skip
    assert (out.exit_code, out.stopped) == (None, "cancelled")
    wait_until(lambda: not living(["sleep", "311.1"]))


def test_what_the_command_left_in_the_background_is_killed(tmp_path: Path) -> None:
    out = run_shell(
        ["/bin/sh", "-c", "(sleep 312.1 &) ; echo done"],
        cwd=tmp_path, env=ENV, timeout_s=20, max_output=1000,
    )  # fmt: skip
    assert (out.exit_code, out.output) == (0, b"done\n")
    wait_until(lambda: not living(["sleep", "312.1"]), what="the orphan to be killed")
