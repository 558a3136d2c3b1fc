"""Load through the daemon: 32 clients at once, 20 tool turns each, on 4 slots and 4 hosts.

The in-process load test (:mod:`tests.faults.test_load`) with a ``loopd serve`` process in
the middle: the fake llama-server (the agent script, 4 slots) in its own process, the
daemon in its own with ``inference.parallel = 4`` and the 4 tool hosts of
:mod:`tests.support.load`, and 32 clients (threads of this process, each its own
connection) running their 20 turns at the same time, each turn one tool call on one of the
4 hosts and an answer.

Then: every session's log holds every turn, whole and in order (the same check as the
in-process test), the daemon reads it back as the file says, ``loopd stop`` ends the daemon
(exit 0) and every process it started, every log reopens with nothing cut, and the threads
of this process are back to what they were. ``LOOPD_LOAD_TURNS`` sets the turns per client.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from actors.base import config as cfg
from actors.base.events import Event
from actors.daemon.client import Client
from actors.log.file import read_records
from actors.tools.toolbox import Toolbox
from tests.daemon.daemonkit import Daemon, cli, daemon_config
from tests.support.load import SLOTS, TOOLS, check_log, check_reopen, expected_results, message
from tests.support.scripted_llama import serve_in_process
from tests.support.watch import wait_until
from tests.tools.hostkit import short_dir

CLIENTS = 32
TURNS = int(os.environ.get("LOOPD_LOAD_TURNS", "20"))


def _ignore(_event: Event) -> None:
    pass


@pytest.mark.timeout(1800)  # a hang guard: minutes on a loaded machine
def test_32_clients_at_once_through_the_daemon(tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    failures: list[BaseException] = []
    counts: dict[int, int] = {}
    with serve_in_process(slots=SLOTS) as url, short_dir() as d:
        path = daemon_config(
            tmp_path, d / "run", url, hosts={h: (tool,) for h, (tool, _) in TOOLS.items()},
            sections={
                "inference": {"parallel": SLOTS, "timeout_s": 60, "retries": 2},
                "tools": {"max_concurrent_calls": 32},
                "daemon": {"heartbeat_s": 1.0},
            },
        )  # fmt: skip
        config = cfg.load(path)
        with Toolbox.start(config) as toolbox:  # what each tool answers, asked once
            expected = expected_results(toolbox)
        with Daemon(path) as daemon:

            def drive(s: int) -> None:
                try:
                    with Client.from_config(config) as client:
                        for n in range(TURNS):
                            outcome = client.turn(f"load{s:02d}", message(s, n)).run(_ignore)
                            assert outcome.tool_calls == 1, outcome
                except BaseException as e:  # reported by the main thread
                    failures.append(e)

            clients = [threading.Thread(target=drive, args=(s,)) for s in range(CLIENTS)]
            for t in clients:
                t.start()
            for t in clients:
                t.join(240)
            assert not any(t.is_alive() for t in clients), "a client hung"
            assert failures == [], failures[:3]
            with daemon.client() as reader:
                for s in range(CLIENTS):
                    records = tuple(reader.read_log(f"load{s:02d}"))
                    check_log(records, s, expected, TURNS)
                    assert read_records(config.log_dir / f"load{s:02d}" / "log.bin") == records
                    counts[s] = len(records)
            stopped = cli(path, "stop")
            assert stopped.returncode == 0, stopped.stderr
            assert daemon.proc.wait(60) == 0
        # leaving Daemon: every process it started has exited (or the test fails there)
    check_reopen(config.log_dir, counts)  # closed cleanly: reopens with nothing cut
    wait_until(lambda: set(threading.enumerate()) <= threads_before, timeout=30,
               what="the client threads to stop")  # fmt: skip
