"""Load: 32 sessions at once in one process, 4 tool hosts, every log complete, nothing leaked.

One process runs 32 session actors on one inference actor (``inference.parallel = 4``; the slot
keeper spreads the sessions over the fake server's 4 slots, so they also evict each other's
prompt caches) and a
Toolbox of 4 local tool hosts from ``[[tools.hosts]]``, one tool each. The fake
llama-server runs in its own process (the agent script). Every round, all 32 sessions run
a turn at once: one tool call on one of the 4 hosts, then an answer.

Then: every session's log holds every turn, whole and in order (the right tool result,
the right answer, call numbers 1..n), reads back the same from disk, and reopens with
nothing cut; the run ends within the test timeout (no deadlock); after shutdown the
threads are back to what they were and no child process is left.

``LOOPD_LOAD_TURNS`` sets the turns per session (default 20; CI may set fewer).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pykka
import pytest

from actors.base.config import Config
from actors.base.events import Event
from actors.base.processes.trees import is_alive
from actors.inference.actor import Inference
from actors.log.file import read_records
from actors.log.records import Baseline, now
from actors.session.actor import open_session
from actors.session.turn import Runtime
from actors.tools.registry import baseline_tools
from actors.tools.toolbox import Toolbox
from tests.support.load import SLOTS, check_log, check_reopen, expected_results, message
from tests.support.load import load_config as shared_config
from tests.support.scripted_llama import serve_in_process
from tests.support.watch import wait_until

SESSIONS = 32
TURNS = int(os.environ.get("LOOPD_LOAD_TURNS", "20"))


def load_config(tmp_path: Path, url: str) -> Config:
    return shared_config(tmp_path, url, inference={"retries": 2, "backoff_s": 0.01})


@pytest.fixture
def baseline_threads() -> Iterator[set[threading.Thread]]:
    """The threads alive before the test; checked again after everything it started stopped."""
    yield set(threading.enumerate())


def _children() -> set[int]:
    """Living child processes of this process (any depth), zombies not counted."""
    return {p.pid for p in psutil.Process().children(recursive=True) if is_alive(p)}


@pytest.mark.timeout(1800)  # a hang guard: minutes on a loaded machine
def test_32_sessions_at_once_on_4_hosts(
    tmp_path: Path, baseline_threads: set[threading.Thread]
) -> None:
    sessions: list[Any] = []
    counts: list[int] = []
    children_before = _children()
    with serve_in_process(slots=SLOTS) as url:
        config = load_config(tmp_path, url)
        toolbox = Toolbox.start(config)
        inference = Inference.start(config.inference)
        try:
            assert toolbox.problems == {}
            expected = expected_results(toolbox)
            runtime = Runtime(config=config, inference=inference, registry=toolbox.registry)
            tools = baseline_tools(toolbox.registry, ())
            for s in range(SESSIONS):
                base = Baseline(system="You are terse.", tools=tools, model="fake", created=now())
                sessions.append(open_session(config, f"load{s:02d}", base))
            sink: Callable[[Event], None] = lambda _e: None  # noqa: E731
            for n in range(TURNS):
                futures = [
                    proxy.turn(runtime, message(s, n), sink)
                    for s, proxy in enumerate(sessions)
                ]
                outcomes = pykka.get_all(futures, timeout=120)
                assert all(o.tool_calls == 1 for o in outcomes)
            for s, proxy in enumerate(sessions):
                records = proxy.records().get(timeout=30)
                check_log(records, s, expected, TURNS)
                path = config.log_dir / f"load{s:02d}" / "log.bin"
                assert read_records(path) == records
                counts.append(len(records))
        finally:
            for proxy in sessions:
                proxy.actor_ref.stop(timeout=30)
            inference.stop()
            toolbox.close()
    check_reopen(config.log_dir, dict(enumerate(counts)))  # closed cleanly: nothing cut
    wait_until(lambda: set(threading.enumerate()) <= baseline_threads, timeout=30,
               what="the threads to stop")  # fmt: skip
    wait_until(lambda: _children() <= children_before, timeout=30,
               what="every child process to exit")  # fmt: skip
