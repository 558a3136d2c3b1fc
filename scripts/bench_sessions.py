"""Concurrent sessions: turns per second and memory (RSS) at 1, 8 and 32 sessions.

One process, as ``loopd`` runs it: one inference actor (``inference.parallel = 4``), a
Toolbox of 4 local tool hosts (one tool each), fsync "always", and N session actors, each
driven by its own thread through ``SessionActor.turn``. The fake llama-server runs the
agent script in its own process. Every turn is one tool call (the 4 hosts in turn) and an
answer, so two model calls and one tool round trip.

Per level: turns/s over the whole level (wall clock), the p50 turn latency, and the peak
RSS of this process during the level (sampled every 5 ms), also as MiB over the idle
process; the tool hosts' RSS is reported at the end. Ratios are against 1 session.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from actors.base.config import Config
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.log.records import Baseline, now
from actors.session.actor import open_session
from actors.session.turn import Runtime
from actors.tools.registry import baseline_tools
from actors.tools.toolbox import Toolbox
from tests.support.load import SLOTS, load_config, message, run_at_once
from tests.support.scripted_llama import serve_in_process
from tests.support.watch import Peak

__all__ = ["LEVELS", "run"]

LEVELS = ((1, 100), (8, 25), (32, 10))  # (sessions, turns per session)
WARMUP = (2, 5)  # (sessions, turns), not measured
SMOKE = {"LEVELS": ((1, 2), (2, 2)), "WARMUP": (1, 1)}  # `bench --smoke`
MiB = 1024 * 1024


def _config(root: Path, url: str) -> Config:
    return load_config(root, url, inference={"retries": 0}, log={"fsync": "always"})


def _sink(_event: Event) -> None:
    pass


def _level(
    config: Config, runtime: Runtime, tools: Any, level: int, sessions: int, turns: int
) -> tuple[float, float, int]:
    """(turns/s, p50 turn ms, peak RSS bytes) of ``sessions`` sessions doing ``turns`` each."""
    proxies = []
    for s in range(sessions):
        base = Baseline(system="You are terse.", tools=tools, model="fake", created=now())
        proxies.append(open_session(config, f"l{level}s{s}", base))
    latencies: list[float] = []
    lock = threading.Lock()

    def drive(s: int) -> None:
        for n in range(turns):
            start = time.perf_counter()
            proxies[s].turn(runtime, message(s, n), _sink).get(timeout=120)
            with lock:
                latencies.append(time.perf_counter() - start)

    me = psutil.Process()
    peak = Peak(lambda: int(me.memory_info().rss))
    try:
        wall = run_at_once(drive, sessions)
    finally:
        top = peak.stop()
        for proxy in proxies:
            proxy.actor_ref.stop(timeout=30)
    return sessions * turns / wall, statistics.median(latencies) * 1000, top


def run() -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="loopd-bench-sessions-"))
    try:
        with serve_in_process(slots=SLOTS) as url:
            return _measure(_config(root, url))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(config: Config) -> list[dict[str, Any]]:
    toolbox = Toolbox.start(config)
    inference = Inference.start(config.inference)
    rows: list[dict[str, Any]] = []
    try:
        if toolbox.problems:
            raise RuntimeError(f"tool hosts did not start: {toolbox.problems}")
        runtime = Runtime(config=config, inference=inference, registry=toolbox.registry)
        tools = baseline_tools(toolbox.registry, ())
        _level(config, runtime, tools, 0, *WARMUP)
        idle = psutil.Process().memory_info().rss
        first = 0.0
        for i, (sessions, turns) in enumerate(LEVELS, start=1):
            rate, p50, top = _level(config, runtime, tools, i, sessions, turns)
            first = first or rate
            what = f"{sessions} session{'s' if sessions > 1 else ''}"
            rows += [
                {"name": f"{what}: turns/s", "value": rate, "unit": "turns/s",
                 "ratio": rate / first, "note": f"{turns} turns each, 1 tool call per turn"},
                {"name": f"{what}: turn latency p50", "value": p50, "unit": "ms"},
                {"name": f"{what}: peak RSS", "value": top / MiB, "unit": "MiB",
                 "note": f"+{(top - idle) / MiB:.1f} MiB over the idle process"},
            ]  # fmt: skip
        hosts = sum(
            psutil.Process(s.pid).memory_info().rss
            for s in toolbox.status().values() if s.pid is not None
        )  # fmt: skip
        rows.append({"name": "4 tool hosts: RSS in all", "value": hosts / MiB, "unit": "MiB"})
    finally:
        inference.stop()
        toolbox.close()
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
