"""actors/tools/port/supervisor.py on its own: start, restart with backoff, kill, stop.

The supervisor is an actor between a connection and a host process. Here the processes are
real (small Python programs standing in for a host: one that exits, one that hangs, one
that leaves a child behind) and the connection is a stand-in that records what it is told,
so each decision of the supervisor is seen directly: no heartbeat, no socket.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from actors.base.processes.trees import is_alive
from actors.tools.port.connection import PortState
from actors.tools.port.settings import PortSettings
from actors.tools.port.supervisor import HostLauncher, HostSupervisor, PortStatus
from tests.support.watch import HANG_S, wait_until

WAIT = HANG_S  # a hang guard for each wait, never a timing


class StandInConnection:
    """What the supervisor needs of a connection, recording what it is told."""

    def __init__(self) -> None:
        self.state = PortState.CONNECTING
        self.reason = "starting"
        self.specs = ()
        self.on_unresponsive: Callable[[str], None] = lambda _why: None
        self.started = self.stopped = False
        self.exits: list[str] = []

    def start(self) -> None:
        self.started = True

    def host_exited(self, reason: str, *, final: bool = False) -> None:
        self.exits.append(reason)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True


class Supervised:
    def __init__(self, argv: list[str]) -> None:
        self.conn = StandInConnection()
        self.ref = HostSupervisor.start(
            PortSettings("stand-in", "ipc:///nowhere"), self.conn, HostLauncher(tuple(argv))
        )

    def status(self) -> PortStatus:
        return self.ref.proxy().status().get(timeout=WAIT)  # type: ignore[no-any-return]

    def stop(self) -> None:
        if self.ref.is_alive():
            self.ref.stop(timeout=WAIT)


@pytest.fixture
def supervise() -> Iterator[Callable[[list[str]], Supervised]]:
    started: list[Supervised] = []

    def make(argv: list[str]) -> Supervised:
        started.append(Supervised(argv))
        return started[-1]

    yield make
    for s in started:
        s.stop()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def with_a_child(pid_file: Path, then: str) -> list[str]:
    """A stand-in host that starts a child (its pid in ``pid_file``), then runs ``then``."""
    return python(
        "import subprocess, time\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        f"{then}\n"
    )


def child_of(pid_file: Path) -> psutil.Process:
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", WAIT, "the child")
    return psutil.Process(int(pid_file.read_text()))


def restart_delays(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage().rsplit(" in ", 1)[1] for r in caplog.records
            if "restarting in" in r.getMessage()]  # fmt: skip


def test_a_host_that_exits_is_restarted_with_growing_backoff(
    supervise: Callable[[list[str]], Supervised], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loopd.toolport")
    s = supervise(python("raise SystemExit(1)"))
    assert s.conn.started
    wait_until(lambda: s.status().restarts >= 3, WAIT, "three restarts")
    assert s.conn.exits[:3] == ["exit code 1"] * 3  # each exit told to the connection at once
    assert restart_delays(caplog)[:3] == ["0.1 s", "0.2 s", "0.4 s"]


def test_a_host_that_refuses_its_flags_is_not_restarted(
    supervise: Callable[[list[str]], Supervised], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="loopd.toolport")
    s = supervise(python("raise SystemExit(2)"))
    wait_until(lambda: s.conn.exits == ["exit code 2"], WAIT, "the exit")
    wait_until(lambda: any("it is not restarted" in r.getMessage() for r in caplog.records),
               WAIT, "the supervisor's decision")  # fmt: skip
    # the decision and the restart it did not schedule are one message of the actor's
    assert restart_delays(caplog) == []
    status = s.status()
    assert (status.restarts, status.pid) == (0, None)


def test_an_unresponsive_host_is_killed_and_so_restarted(
    supervise: Callable[[list[str]], Supervised],
) -> None:
    s = supervise(python("import time; time.sleep(300)"))
    wait_until(lambda: s.status().pid is not None, WAIT, "the host to start")
    first = psutil.Process(s.status().pid)
    s.conn.on_unresponsive("stopped answering (nothing for 6.0 s)")  # as the connection does
    wait_until(lambda: not is_alive(first), WAIT, "the silent host to be killed")
    wait_until(lambda: s.status().restarts == 1, WAIT, "the restart")
    wait_until(lambda: s.status().pid not in (None, first.pid), WAIT, "the new host")
    assert s.conn.exits == ["killed by SIGKILL"]


def test_what_a_dead_host_left_running_is_killed(
    supervise: Callable[[list[str]], Supervised], tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    s = supervise(with_a_child(pid_file, "raise SystemExit(1)"))
    child = child_of(pid_file)
    wait_until(lambda: not is_alive(child), WAIT, "the orphaned child to be killed")
    assert s.conn.exits[0] == "exit code 1"


def test_stopping_ends_the_host_its_children_and_the_connection(
    supervise: Callable[[list[str]], Supervised], tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    s = supervise(with_a_child(pid_file, "time.sleep(300)"))
    child = child_of(pid_file)
    host = psutil.Process(s.status().pid)  # type: ignore[arg-type]
    s.stop()
    assert not is_alive(host) and not is_alive(child)
    assert s.conn.stopped
    assert s.conn.exits == []  # a stop is not an exit to report


def test_a_host_that_cannot_start_is_tried_again(
    supervise: Callable[[list[str]], Supervised], caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.WARNING, logger="loopd.toolport")
    s = supervise([str(tmp_path / "no-such-host")])
    wait_until(lambda: s.status().restarts >= 2, WAIT, "two more attempts")
    assert s.status().pid is None
    assert any("could not start" in r.getMessage() for r in caplog.records)
    assert restart_delays(caplog)[:2] == ["0.1 s", "0.2 s"]
