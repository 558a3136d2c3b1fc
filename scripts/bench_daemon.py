"""The daemon: what a turn costs through ``loopd serve``, and turns/s at 1, 8 and 32 clients.

The same world both ways: the fake llama-server (the agent script, 4 slots) in its own
process, ``inference.parallel = 4``, the 4 tool hosts of :mod:`tests.support.load`, fsync
"always"; every turn is one tool call and an answer (two model calls, one tool call).

- **a turn, in-process vs through the daemon**: one session, turns one after another, p50
  latency of each. In-process is ``start_world`` and ``SessionActor.turn`` (what ``loopd run
  --local`` does after start-up); through the daemon is ``Client.turn`` against a ``loopd
  serve`` process (the events cross a socket and two threads more). The ratio is the
  daemon's over in-process, measured in the same run.
- **a whole ``loopd run``**, cold in-process (``--local``: it starts its tool hosts and
  its world first) vs through the running daemon: what a person waits for a command.
- **turns/s at 1, 8, 32 clients**: N clients (threads, each its own connection) on N
  sessions at once, each a fixed number of turns; wall-clock turns/s, ratio against 1.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.events import Event
from actors.daemon.client import Client
from actors.session.world import start_world
from tests.daemon.daemonkit import ROOT, Daemon, daemon_config, env
from tests.support.load import SLOTS, TOOLS, message, run_at_once
from tests.support.scripted_llama import serve_in_process

__all__ = ["LEVELS", "run"]

TURNS = 40  # one session, one after another, each way
COMMANDS = 3  # whole `loopd run` commands, each way
LEVELS = ((1, 60), (8, 15), (32, 6))  # (clients, turns each)
SMOKE = {"TURNS": 2, "COMMANDS": 1, "LEVELS": ((1, 2), (2, 2))}  # `bench --smoke`


def _sink(_event: Event) -> None:
    pass


def _config(root: Path, url: str) -> Path:
    return daemon_config(
        root, root / "run", url, hosts={h: (tool,) for h, (tool, _) in TOOLS.items()},
        sections={"inference": {"parallel": SLOTS, "timeout_s": 60, "retries": 0},
                  "tools": {"max_concurrent_calls": 32}, "daemon": {"heartbeat_s": 1.0}},
    )  # fmt: skip


def _side_by_side(config: cfg.Config) -> tuple[float, float]:
    """p50 ms of a turn in this process and through the daemon, taken in turn (ABAB...), so
    that both see the same load on a shared machine."""
    local, remote = [], []
    with start_world(config) as world, Client.from_config(config) as client:
        session = world.session("inproc")
        for n in range(-3, TURNS):  # three of each to warm up
            start = time.perf_counter()
            session.turn(world.runtime, message(0, n % 1000), _sink).get(timeout=60)
            middle = time.perf_counter()
            client.turn("daemon", message(0, n % 1000)).run(_sink)
            end = time.perf_counter()
            if n >= 0:
                local.append(middle - start)
                remote.append(end - middle)
    return statistics.median(local) * 1000, statistics.median(remote) * 1000


def _command(path: Path, *flags: str) -> float:
    """p50 ms of COMMANDS ``loopd run`` processes, start to exit."""
    times = []
    for n in range(COMMANDS):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "actors.cli", "run", "--config", str(path), *flags,
             "--session", f"cmd{''.join(flags)}", message(1, n)],
            cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        times.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"loopd run failed: {done.stderr}")
    return statistics.median(times) * 1000


def _level(config: cfg.Config, level: int, clients: int, turns: int) -> float:
    def drive(c: int) -> None:
        with Client.from_config(config) as client:
            for n in range(turns):
                client.turn(f"l{level}c{c}", message(c, n)).run(_sink)

    return clients * turns / run_at_once(drive, clients)


def run() -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="lbd-", dir="/tmp"))
    rows: list[dict[str, Any]] = []
    try:
        with serve_in_process(slots=SLOTS) as url:
            path = _config(root, url)
            config = cfg.load(path)
            with Daemon(path) as daemon:
                local, remote = _side_by_side(config)
                rows += [
                    {"name": "a tool turn in-process: p50", "value": local, "unit": "ms",
                     "note": f"{TURNS} turns, one session (start-up not counted)"},
                    {"name": "the same turn through the daemon: p50", "value": remote,
                     "unit": "ms", "ratio": remote / local,
                     "note": f"{remote - local:+.1f} ms a turn; taken in turn with the above"},
                ]  # fmt: skip
                first = 0.0
                for i, (clients, turns) in enumerate(LEVELS, start=1):
                    rate = _level(config, i, clients, turns)
                    first = first or rate
                    what = f"{clients} client{'s' if clients > 1 else ''}"
                    rows.append({"name": f"{what} through the daemon: turns/s", "value": rate,
                                 "unit": "turns/s", "ratio": rate / first,
                                 "note": f"{turns} turns each, 1 tool call per turn"})  # fmt: skip
                cold = _command(path, "--local")
                warm = _command(path)
                rows += [
                    {"name": "loopd run --local (cold, in-process): p50", "value": cold,
                     "unit": "ms", "note": f"{COMMANDS} commands, each its own process"},
                    {"name": "loopd run through the daemon: p50", "value": warm, "unit": "ms",
                     "ratio": warm / cold, "note": "the same command, the daemon running"},
                ]  # fmt: skip
                with daemon.client() as client:
                    client.stop()
                daemon.proc.wait(60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
