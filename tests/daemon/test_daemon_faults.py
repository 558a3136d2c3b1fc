"""The daemon when things go wrong: a client killed mid-turn, the daemon itself SIGTERMed or
SIGKILLed at seeded random moments of tool turns, many times.

For the daemon's deaths, two clients (threads of this process, real sockets) drive numbered
turns (:func:`tests.support.crash_driver.message`: one tool call and an answer) on two
sessions at once. Each life of the daemon ends with SIGTERM or SIGKILL (seeded): three in
four a random time after both sessions finished a turn in this life (so mid-turn,
mid-stream, mid-tool-call or mid-append), one in four at a random moment of start-up.
After every death:

- nothing the daemon started outlives it (its tool host, the commands its tools ran);
- every session opens again, a reader sees the same records, every record of an earlier
  life is still there unchanged, and every turn is a prefix of a clean run's
  (:class:`tests.faults.crash.Checker`, the same check as the in-process crash test);
- after SIGTERM: the daemon exited 0, its pid file and socket are gone, and the slot keeper
  saved the KV state of both sessions (the fake server's save files are newer);
- the next life runs whole turns on both sessions again.

``LOOPD_DAEMON_SEED`` and ``LOOPD_DAEMON_KILLS`` (default 12) choose the run.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import platform
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from actors.base import config as cfg
from actors.base.errors import LoopdError
from actors.base.processes.trees import kill_tree
from actors.daemon.client import Client
from actors.log.file import read_records
from actors.log.records import Assistant, ToolResult, Usage, User
from tests.daemon.daemonkit import ROOT, Daemon, daemon_config, env
from tests.faults.crash import FULL_TURN, Checker, shape, split_turns, uncompacted, wait_gone
from tests.support.crash_driver import message
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.support.watch import HANG_S, Background, wait_until
from tests.tools.hostkit import short_dir

SEED = int(os.environ.get("LOOPD_DAEMON_SEED", "20261203"))
KILLS = int(os.environ.get("LOOPD_DAEMON_KILLS", "12"))
SESSIONS = ("one", "two")
BOUND_S = HANG_S  # hang guards, not timings


def _attached(config: cfg.Config) -> list[str]:
    with Client.from_config(config) as client:
        return [row["name"] for row in client.status().sessions]


def test_a_client_killed_mid_turn_has_its_turn_cancelled_and_the_log_stays_valid(
    tmp_path: Path, run_dir: Path
) -> None:
    with FakeLlama(agent()) as fake:
        path = daemon_config(tmp_path, run_dir, fake.url)
        with Daemon(path) as daemon:
            slow = 't1 :: run_command {"command": "sleep 60; echo too-late"}'
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.daemon.turn_client", str(path), "s", slow],
                cwd=ROOT, env=env(), stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert proc.stdout is not None
                for line in proc.stdout:  # the tool runs: the sleep is in the tool host
                    if line.strip() == "tool_call_started":
                        break
                wait_until(lambda: any("sleep" in c for c in daemon.commands()),
                           BOUND_S, "the command to start")  # fmt: skip
                proc.kill()
                proc.wait(HANG_S)
            finally:
                kill_tree(proc.pid)
                if proc.stdout is not None:
                    proc.stdout.close()
            wait_until(lambda: "s" not in _attached(daemon.config), BOUND_S,
                       "the daemon to give the session up")  # fmt: skip
            wait_until(lambda: not any("sleep" in c for c in daemon.commands()),
                       BOUND_S, "the cancelled command to be killed")  # fmt: skip
            with daemon.client() as again:  # the session works, and shows no result
                before = again.read_log("s")
                outcome = again.turn("s", "t2 :: list_dir {}").run(lambda e: None)
                after = again.read_log("s")
    assert [type(r).__name__ for r in before] == ["Baseline", "User", "Assistant", "Usage"]
    assert not any(isinstance(r, ToolResult) for r in before)  # cancelled, nothing run late
    assert outcome.content == "done t2." and after[: len(before)] == before
    assert "was silent for" in daemon.text() and "cancelling its 1 turn(s)" in daemon.text()


class Drivers:
    """One client thread per session, running numbered turns until the daemon goes."""

    def __init__(self, config: cfg.Config, log_dir: Path) -> None:
        self.done: collections.Counter[str] = collections.Counter()
        self.ended: dict[str, str] = {}
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._drive, args=(config, log_dir, s), daemon=True)
            for s in SESSIONS
        ]
        for t in self._threads:
            t.start()

    def _drive(self, config: cfg.Config, log_dir: Path, session: str) -> None:
        try:
            with Client.from_config(config) as client:
                client.open(session)
                records = client.read_log(session)
                n = sum(1 for r in records if isinstance(r, User)) + 1
                while True:
                    client.turn(session, message(n)).run(lambda e: None)
                    with self._lock:
                        self.done[session] += 1
                    n += 1
        except LoopdError as e:  # the daemon went: DaemonError, Cancelled...
            self.ended[session] = type(e).__name__

    def each_done(self) -> bool:
        with self._lock:
            return all(self.done[s] >= 1 for s in SESSIONS)

    def join(self) -> None:
        for t in self._threads:
            t.join(BOUND_S)
            assert not t.is_alive(), "a client did not notice its daemon had gone"


def _saved(save: Path) -> dict[str, int]:
    return {s: max((p.stat().st_mtime_ns for p in save.glob(f"{s}-*.bin")), default=0)
            for s in SESSIONS}  # fmt: skip


def _reference(fake: FakeLlama, root: Path, workspace: Path) -> list[list[str]]:
    """A clean daemon life's turns 1-3 (each kind the driver cycles through), as shapes."""
    with short_dir() as d:
        path = daemon_config(root, d / "run", fake.url, workspace=workspace)
        with Daemon(path) as daemon, daemon.client() as client:
            for n in (1, 2, 3):
                client.turn("ref", message(n)).run(lambda e: None)
            records = client.read_log("ref")
    turns = split_turns(tuple(records))
    assert [[type(r).__name__ for r in rs] for _, rs in turns] == [FULL_TURN] * 3
    return [[shape(r) for r in rs] for _, rs in turns]


def test_sigterm_and_sigkill_of_the_daemon_at_random_moments_lose_nothing(
    tmp_path: Path, run_dir: Path
) -> None:
    rng = random.Random(SEED)
    save = tmp_path / "save"
    save.mkdir()
    workspace = tmp_path / "ws"
    stats: collections.Counter[str] = collections.Counter()
    with FakeLlama(agent(), props={"total_slots": 2}, save_dir=save) as fake:
        reference = _reference(fake, tmp_path / "reference", workspace)
        path = daemon_config(tmp_path / "d", run_dir, fake.url, workspace=workspace,
                             sections={"slots": {"save_dir": str(save)}})  # fmt: skip
        config = cfg.load(path)
        checkers = {s: Checker(config.log_dir / s / "log.bin", reference, s) for s in SESSIONS}
        for life in range(KILLS):
            early = life % 4 == 3  # one life in four dies starting up, at a seeded moment
            term = rng.random() < 0.5
            with Daemon(path, wait=not early) as daemon:
                drivers = None
                if early:
                    time.sleep(rng.uniform(0.0, 1.5))
                else:
                    drivers = Drivers(config, config.log_dir)
                    wait_until(drivers.each_done, 60, "a turn on each session")
                    time.sleep(rng.uniform(0.0, 0.3))
                started = daemon.children()
                before = _saved(save)
                if term:
                    code = daemon.terminate(60)
                else:
                    daemon.kill()
                    code = None
                if drivers is not None:
                    drivers.join()
                stats["survived " + ("SIGTERM" if term else "SIGKILL")] += 1
                wait_gone(started, BOUND_S)
                if term and daemon.proc.returncode is not None and not early:
                    assert code == 0, daemon.text()
                    assert not (run_dir / "loopd.pid").exists()
                    assert not (run_dir / "loopd.sock").exists()
                    after = _saved(save)
                    assert all(after[s] > before[s] for s in SESSIONS), (before, after)
            for name, checker in checkers.items():
                if (config.log_dir / name / "log.bin").exists():
                    turns = checker.check(kills=life + 1)
                    last = turns[-1][1] if turns else []
                    stats["mid-turn" if 0 < len(last) < len(FULL_TURN) else "between turns"] += 1
            stats["killed during start-up"] += early
        # One last life, not killed: whole turns on both sessions, then `loopd stop`.
        with Daemon(path) as daemon:
            drivers = Drivers(config, config.log_dir)
            wait_until(lambda: all(drivers.done[s] >= 2 for s in SESSIONS), 60, "two turns")
            with daemon.client() as client:
                client.stop()
            drivers.join()
            assert daemon.proc.wait(60) == 0
    for checker in checkers.values():
        turns = checker.check(kills=KILLS + 1)  # the stop may cancel the last turn too
        whole = [uncompacted(rs) for _, rs in turns]
        tail = whole if len(whole[-1]) == len(FULL_TURN) else whole[:-1]
        assert [[type(r).__name__ for r in rs] for rs in tail[-2:]] == [FULL_TURN] * 2
        last = tail[-1]
        assert isinstance(last[3], ToolResult) and isinstance(last[4], Assistant)
        assert isinstance(last[0], User) and isinstance(last[-1], Usage)
    line = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()))
    print(f"\ndaemon kill test (seed {SEED}): {KILLS} lives; {line}")


def test_sigterm_during_a_long_command_cancels_the_turn_and_the_daemon_exits(
    tmp_path: Path, run_dir: Path
) -> None:
    """A command that would run for an hour (tools.timeout_s allows it) is in flight when the
    daemon gets SIGTERM: the turn is cancelled, the command killed, and the daemon exits 0
    (it hung before: its shutdown waited on the session actor, busy in the tool call)."""
    slow = 't1 :: run_command {"command": "sleep 3600; echo too-late"}'
    with FakeLlama(agent()) as fake:
        path = daemon_config(tmp_path, run_dir, fake.url,
                             sections={"tools": {"timeout_s": 7200}})  # fmt: skip
        with Daemon(path) as daemon, daemon.client() as client:
            turn = client.turn("s", slow)
            events = iter(turn)
            next(e for e in events if type(e).__name__ == "ToolCallStarted")
            wait_until(lambda: any("sleep 3600" in c for c in daemon.commands()),
                       BOUND_S, "the command to start")  # fmt: skip
            started = daemon.children()
            ended = Background(lambda: list(events))
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon.pid, signal.SIGTERM)
            try:  # a hang guard: the daemon's own grace is well inside it
                code = daemon.proc.wait(3 * HANG_S)
            except subprocess.TimeoutExpired:
                kill_tree(daemon.pid)
                raise AssertionError(f"the daemon hung on SIGTERM: {daemon.text()}") from None
            with pytest.raises(LoopdError):
                ended.join(BOUND_S)
            wait_gone(started, BOUND_S)
    assert code == 0, daemon.text()
    assert not (run_dir / "loopd.pid").exists()
    records = read_records(cfg.load(path).log_dir / "s" / "log.bin")
    assert not any(isinstance(r, ToolResult) for r in records)  # cancelled, nothing run late


def _tgkill(pid: int, tid: int, signum: int) -> None:
    """Send ``signum`` to thread ``tid`` of process ``pid`` (glibc's tgkill)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.tgkill(pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), "tgkill")  # ESRCH: a ProcessLookupError


def _takes(pid: int, tid: int, signum: int) -> bool:
    """Whether thread ``tid`` of ``pid`` does not block ``signum`` (libzmq's threads do);
    False for one that has ended since it was listed."""
    try:
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigBlk:"):
            return not int(line.split()[1], 16) >> (signum - 1) & 1
    return False


def _polls_for_good(pid: int) -> bool:
    """Whether the main thread of ``pid`` sleeps in poll(2) with no timeout (x86-64's
    syscall 7, its third argument -1): the daemon's loop with no timer due, no client."""
    fields = Path(f"/proc/{pid}/task/{pid}/syscall").read_text().split()
    return fields[:1] == ["7"] and int(fields[3], 16) & 0xFFFFFFFF == 0xFFFFFFFF


@pytest.mark.skipif(platform.machine() != "x86_64" or not hasattr(ctypes.CDLL(None), "tgkill"),
                    reason="reads x86-64 syscall numbers in /proc; needs glibc's tgkill")
def test_a_sigterm_taken_by_a_worker_thread_stops_an_idle_daemon(
    tmp_path: Path, run_dir: Path
) -> None:
    """The kernel hands a process's SIGTERM to any thread that does not block it (the main
    thread when it can). Python runs the handler in the main thread only, once that thread
    runs Python code; the daemon's loop, with no client left and so no timer due, slept in
    poll for ever: a SIGTERM that landed on another of its threads left it serving (the CI
    teardown that waited 60 s for a daemon whose last client had said bye). Sent here to a
    long-lived worker thread on purpose (tgkill), it stops the daemon."""
    with FakeLlama(agent()) as fake:
        path = daemon_config(tmp_path, run_dir, fake.url)
        with Daemon(path) as daemon:
            with daemon.client() as client:
                client.turn("s", "t1 :: list_dir {}").run(lambda e: None)
            # The bye read, the client's heartbeat timer gone: nothing wakes the loop now.
            wait_until(lambda: _polls_for_good(daemon.pid), BOUND_S, "the loop to sleep")
            workers = [t.id for t in psutil.Process(daemon.pid).threads()
                       if t.id != daemon.pid and _takes(daemon.pid, t.id, signal.SIGTERM)]
            assert workers, "no thread of the daemon but the main one takes SIGTERM"
            for tid in sorted(workers):  # the oldest first: it stays (one may have ended)
                with contextlib.suppress(ProcessLookupError):
                    _tgkill(daemon.pid, tid, signal.SIGTERM)
                    break
            else:
                raise AssertionError("every worker thread ended before the signal")
            try:  # a hang guard: the daemon stops at once
                code = daemon.proc.wait(HANG_S)
            except subprocess.TimeoutExpired:
                daemon.terminate()  # the main thread takes this one: the test ends
                raise AssertionError("the daemon did not stop on a SIGTERM taken by a "
                                     f"worker thread: {daemon.text()}") from None
    assert code == 0, daemon.text()
    assert "loopd daemon stopped" in daemon.text()


def test_a_stop_that_outlasts_its_grace_kills_what_the_daemon_started_and_exits(
    tmp_path: Path, run_dir: Path
) -> None:
    """The model server takes the KV saves and never answers (inference.read_timeout_s an
    hour): the slot keeper's save at stop would hold the daemon that long, and did. Past
    daemon.stop_grace_s it writes its threads' stacks to its log, kills its tool host and
    exits 1; its pid file and socket are gone."""
    save = tmp_path / "save"
    save.mkdir()
    with FakeLlama(agent(), save_dir=save) as fake:
        path = daemon_config(tmp_path, run_dir, fake.url, stop_grace_s=2,
                             sections={"slots": {"save_dir": str(save)},
                                       "inference": {"read_timeout_s": 3600}})  # fmt: skip
        try:
            with Daemon(path) as daemon:
                with daemon.client() as client:  # its baseline saved for new sessions
                    client.turn("s", "t1 :: list_dir {}").run(lambda e: None)
                fake.slot_gate.clear()  # from now on every slot action waits for the test
                started = daemon.children()
                assert started, "the daemon runs its tool host"
                with contextlib.suppress(ProcessLookupError):
                    os.kill(daemon.pid, signal.SIGTERM)
                try:  # a hang guard, well past the grace
                    code = daemon.proc.wait(HANG_S)
                except subprocess.TimeoutExpired:
                    kill_tree(daemon.pid)
                    raise AssertionError(f"the daemon hung on its stop: {daemon.text()}") from None
                wait_gone(started, BOUND_S)
                assert any(a == "save" for a, _, _ in fake.slot_calls)  # what it waited on
        finally:
            fake.slot_gate.set()
    text = daemon.text()
    assert code == 1, text
    assert "did not stop within daemon.stop_grace_s = 2 s" in text
    assert "Thread 0x" in text and "keeper" in text  # the stacks: where it was stuck
    assert not (run_dir / "loopd.pid").exists() and not (run_dir / "loopd.sock").exists()
