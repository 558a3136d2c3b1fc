"""Crash consistency: a loopd daemon SIGKILLed at random moments, many times, loses nothing.

A child process (:mod:`tests.support.crash_driver`: ``start_world``, its own tool host, fsync
"always") runs numbered turns on one session against the fake llama-server in this process,
and is killed with SIGKILL at a seeded random moment: most often a random time after its
first turn of this life (so mid-turn, mid-stream, mid-tool-call or mid-append), sometimes
during start-up (imports, opening and recovering the log, starting the tool host).

After every kill:

- no process the child started outlives it for long (its tool host watches its parent);
- the session opens again (a torn tail is cut), and a reader sees the same records;
- every record that was there before this life is still there, unchanged (times included);
- every turn's records are a prefix of what a clean run writes for that turn (kinds and
  contents, see :mod:`tests.faults.crash`), and only a killed life leaves a turn unfinished;
- the next life runs a whole turn before it can be killed: the next turn works.

``LOOPD_CRASH_SEED`` and ``LOOPD_CRASH_KILLS`` (default 25) choose the run; the summary line
(printed, see ``-s``) says how many kills were survived and where they landed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType

import psutil

from actors.base.processes.trees import kill_tree
from actors.log.file import read_records
from actors.log.records import Assistant, ToolResult, Usage, User
from tests.faults.crash import FULL_TURN, Checker, shape, split_turns, uncompacted, wait_gone
from tests.support.crash_driver import SESSION, config, drive
from tests.support.fake_llama import FakeLlama
from tests.support.leftovers import hosts_of, leftovers_killed
from tests.support.scripted_llama import agent
from tests.support.watch import HANG_S

ROOT = Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("LOOPD_CRASH_SEED", "20261202"))
KILLS = int(os.environ.get("LOOPD_CRASH_KILLS", "25"))
EARLY = 0.2  # share of lives killed during start-up
HOST_EXIT_BOUND_S = HANG_S  # a hang guard, not a timing: hosts check their parent every 0.25 s


class Child:
    """The crash driver in its own process; its output lines arrive on a queue."""

    def __init__(self, url: str, log_dir: Path, workspace: Path, turns: int = 100_000) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.crash_driver", "--url", url,
             "--log-dir", str(log_dir), "--workspace", str(workspace), "--turns", str(turns)],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.pid = self.proc.pid
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, prefix: str, timeout: float = 60.0) -> str:
        """The next line starting with ``prefix``; fails on EOF or after ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} from the driver in {timeout} s") from None
            if line is None:
                raise AssertionError(f"the crash driver ended (code {self.proc.wait()}) before "
                                     f"{prefix!r}")
            if line.startswith(prefix):
                return line

    def kill(self) -> list[psutil.Process]:
        """SIGKILL the driver alone; returns what it had started (now orphans)."""
        try:
            started = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            started = []
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(30)
        return started

    def __enter__(self) -> Child:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc.poll() is None:
            kill_tree(self.pid)
        self.proc.wait(30)
        self._reader.join(HANG_S)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def reference_turns(url: str, log_dir: Path, workspace: Path) -> list[list[str]]:
    """A clean run's turns 1-3 (one of each kind the driver cycles through), as shapes."""
    drive(config(url, str(log_dir), str(workspace)), 3, lambda _line: None)
    turns = split_turns(read_records(log_dir / SESSION / "log.bin"))
    assert [n for n, _ in turns] == [1, 2, 3]
    for _, records in turns:
        assert [type(r).__name__ for r in records] == FULL_TURN
    return [[shape(r) for r in records] for _, records in turns]


def test_sigkill_at_random_moments_loses_nothing_and_the_next_turn_works(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("hello from the workspace\n")
    log_dir = tmp_path / "sessions"
    host_exit = 0.0
    with leftovers_killed(), FakeLlama(agent()) as fake:
        reference = reference_turns(fake.url, tmp_path / "reference", workspace)
        checker = Checker(log_dir / SESSION / "log.bin", reference, SESSION)
        for life in range(KILLS):
            early = life > 0 and rng.random() < EARLY
            with Child(fake.url, log_dir, workspace) as child:
                if early:
                    time.sleep(rng.uniform(0.0, 0.7))
                else:
                    child.expect("ready")
                    child.expect("done")  # the next turn works
                    time.sleep(rng.uniform(0.0, 0.3))
                orphans = child.kill()
            host_exit = max(host_exit, wait_gone(orphans + hosts_of(child.pid), HOST_EXIT_BOUND_S))
            before = len(checker.previous)
            turns = checker.check(kills=life + 1)
            if early:
                checker.stats["killed during start-up"] += 1
            else:
                checker.landed(before, turns)
        # One last life, not killed: it finishes the turns it is given, cleanly.
        end = len(split_turns(checker.previous)) + 2
        with Child(fake.url, log_dir, workspace, turns=end) as child:
            child.expect("finished")
            assert child.proc.wait(30) == 0
        turns = checker.check(kills=KILLS)
    assert len(turns) == end
    for _, records in turns[-2:]:
        assert [type(r).__name__ for r in uncompacted(records)] == FULL_TURN
    last = uncompacted(turns[-1][1])
    assert isinstance(last[3], ToolResult) and isinstance(last[4], Assistant)
    assert isinstance(last[0], User) and isinstance(last[-1], Usage)
    stats = ", ".join(f"{k}: {v}" for k, v in sorted(checker.stats.items()))
    print(f"\ncrash test (seed {SEED}): {KILLS} SIGKILLs survived; {stats}; "
          f"tool hosts gone at most {host_exit:.2f} s after their daemon")
