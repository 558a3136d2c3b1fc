"""`make soak`: mixed load through the daemon for a long time, its memory, open descriptors and
threads sampled: they must stay flat after the warm-up.

The world of ``make bench``'s daemon part (the fake llama-server with the agent script and 4
slots in its own process, ``loopd serve`` with the 4 tool hosts of :mod:`tests.support.load`,
fsync "always") and CLIENTS clients, each its own connection, each running without pause:
turns with a tool call, a compaction by hand every 7th, a fork every 11th (a turn on the
fork, then the fork removed), a rewind every 13th, and a new session every 40th (the old
one closed and removed: one session's records stay in memory while it is open, so a
session that grows for ever is not a leak). Every SAMPLE seconds: the daemon's RSS, its
open descriptors and threads, its tool hosts' RSS, the operations done and the errors.

``LOOPD_SOAK_SECONDS`` (default 3600), ``LOOPD_SOAK_CLIENTS`` (default 4). The verdict
compares the last third of the samples after the warm-up (a fifth of the run) with its
beginning: RSS within 10% (or 8 MiB) of the first sample, the median of descriptors and of
threads within 4 of the first third's (one sample is no level: they follow the work in
flight). The plot (RSS, threads, descriptors, operations a second) is an SVG written here,
``LOOPD_SOAK_PLOT`` (default ``bench/soak.svg``).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from actors.base import config as cfg
from actors.base.events import Event
from actors.daemon.client import Client
from tests.daemon.daemonkit import Daemon, daemon_config
from tests.support.load import SLOTS, TOOLS, message
from tests.support.scripted_llama import serve_in_process

SECONDS = int(os.environ.get("LOOPD_SOAK_SECONDS", "3600"))
CLIENTS = int(os.environ.get("LOOPD_SOAK_CLIENTS", "4"))
SAMPLE = max(1.0, min(60.0, SECONDS / 40))
MIB = 1024 * 1024
PLOT = Path(os.environ.get("LOOPD_SOAK_PLOT", "bench/soak.svg"))


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    rss: int
    fds: int
    threads: int
    hosts_rss: int
    ops: int
    errors: int


def _ignore(_event: Event) -> None:
    pass


class Load:
    """CLIENTS clients in threads, each running operations until ``stop``."""

    def __init__(self, config: cfg.Config) -> None:
        self.config = config
        self.stop = threading.Event()
        self.counts: collections.Counter[str] = collections.Counter()
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(c,)) for c in range(CLIENTS)]

    def _did(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1

    def _client(self, c: int) -> None:
        n, generation = 0, 0
        with Client.from_config(self.config) as client:
            session = f"soak{c}-{generation}"
            while not self.stop.is_set():
                n += 1
                try:
                    client.turn(session, message(c, n)).run(_ignore)
                    self._did("turns")
                    if n % 7 == 0:
                        client.compact(session)
                        self._did("compactions")
                    if n % 11 == 0:
                        fork = f"{session}-f{n}"
                        client.fork(session, fork)
                        client.turn(fork, message(c, n + 1)).run(_ignore)
                        client.close_session(fork)
                        client.remove(fork)
                        self._did("forks")
                    if n % 13 == 0:
                        client.rewind(session)
                        self._did("rewinds")
                    if n % 40 == 0:
                        client.close_session(session)
                        client.remove(session)
                        generation += 1
                        session = f"soak{c}-{generation}"
                        self._did("sessions")
                except Exception as e:  # counted and shown; the soak goes on
                    with self._lock:
                        self.errors.append(f"client {c} op {n}: {e}")

    def ops(self) -> int:
        with self._lock:
            return sum(self.counts.values())


def sample(daemon: psutil.Process, start: float, load: Load) -> Sample:
    hosts = 0
    for child in daemon.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a host that ended just now
            hosts += child.memory_info().rss
    return Sample(time.monotonic() - start, daemon.memory_info().rss, daemon.num_fds(),
                  daemon.num_threads(), hosts, load.ops(), len(load.errors))


def verdict(samples: list[Sample]) -> list[str]:
    """What grew after the warm-up (empty: flat). RSS: the late third's highest against the
    first sample after the warm-up. Descriptors and threads follow what is in flight at the
    sample's instant (a turn's sockets, an open log), so one sample is no level: the late
    third's median against the first third's (after the warm-up), 4 more is growth."""
    warm = [s for s in samples if s.at >= SECONDS / 5]
    if len(warm) < 3:
        return ["too few samples after the warm-up to judge"]
    third = max(1, len(warm) // 3)
    base, early, late = warm[0], warm[:third], warm[-third:]
    grew = []
    rss = max(s.rss for s in late)
    if rss > base.rss * 1.10 and rss - base.rss > 8 * MIB:
        grew.append(f"daemon RSS {base.rss / MIB:.1f} -> {rss / MIB:.1f} MiB")
    for name in ("fds", "threads"):
        before = statistics.median(getattr(s, name) for s in early)
        after = statistics.median(getattr(s, name) for s in late)
        if after > before + 4:
            grew.append(f"{name} {before:g} -> {after:g} (medians)")
    return grew


_W, _H, _LEFT, _TOP, _GAP = 640, 120, 70, 24, 34  # one panel's plot area and margins


def _panel(top: int, title: str, minutes: list[float], lines: list[tuple[str, list[float]]],
           span: float) -> list[str]:
    """One panel: ``lines`` (colour, values) against ``minutes``, its axis from 0."""
    high = max((v for _, values in lines for v in values), default=0.0) or 1.0
    out = [f'<text x="{_LEFT}" y="{top - 6}" font-size="13">{title}</text>',
           f'<rect x="{_LEFT}" y="{top}" width="{_W}" height="{_H}" fill="none" '
           'stroke="#bbb"/>',
           f'<text x="{_LEFT - 6}" y="{top + 10}" font-size="11" text-anchor="end">'
           f'{high:,.4g}</text>',
           f'<text x="{_LEFT - 6}" y="{top + _H}" font-size="11" text-anchor="end">0</text>']
    for colour, values in lines:
        points = " ".join(f"{_LEFT + m / span * _W:.1f},{top + _H - v / high * _H:.1f}"
                          for m, v in zip(minutes, values, strict=True))
        out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                   f'points="{points}"/>')
    return out


def svg(samples: list[Sample]) -> str:
    """RSS (the daemon's, its tool hosts'), threads, open descriptors and operations a
    second over the run's minutes: an SVG of polylines, no plotting library needed."""
    minutes = [s.at / 60 for s in samples]
    span = max(minutes[-1] if minutes else 0.0, 1e-9)
    rates = [0.0] + [max(0.0, (b.ops - a.ops) / max(b.at - a.at, 1e-9))
                     for a, b in itertools.pairwise(samples)]
    panels = [
        ("daemon RSS MiB (blue), its tool hosts' RSS MiB (grey)",
         [("#1f5fbf", [s.rss / MIB for s in samples]),
          ("#999", [s.hosts_rss / MIB for s in samples])]),
        ("daemon threads", [("#b3541e", [float(s.threads) for s in samples])]),
        ("daemon open descriptors", [("#2e8b57", [float(s.fds) for s in samples])]),
        ("operations a second (all clients)", [("#6a3d9a", rates)]),
    ]
    height = _TOP + len(panels) * (_H + _GAP) + 10
    body: list[str] = []
    for i, (title, lines) in enumerate(panels):
        body += _panel(_TOP + i * (_H + _GAP), title, minutes, lines, span)
    body.append(f'<text x="{_LEFT + _W}" y="{height - 6}" font-size="11" text-anchor="end">'
                f'{span:.1f} minutes, {CLIENTS} clients, a sample every {SAMPLE:.0f} s</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{_LEFT + _W + 20}" '
            f'height="{height}" font-family="sans-serif">\n'
            '<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def plot(samples: list[Sample], where: Path) -> str:
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(svg(samples))
    return f"plot: {where}"


def main() -> int:
    print(f"soak: {SECONDS} s, {CLIENTS} clients, a sample every {SAMPLE:.0f} s")
    print(f"{'t s':>7} {'RSS MiB':>8} {'fds':>5} {'threads':>7} {'hosts MiB':>9} "
          f"{'ops':>7} {'errors':>6}")
    samples: list[Sample] = []
    with serve_in_process(slots=SLOTS) as url, \
            tempfile.TemporaryDirectory(prefix="loopd-soak-", dir="/tmp") as d:
        root = Path(d)
        path = daemon_config(
            root, root / "run", url, hosts={h: (tool,) for h, (tool, _) in TOOLS.items()},
            sections={"inference": {"parallel": SLOTS, "timeout_s": 60},
                      "tools": {"max_concurrent_calls": 32}},
        )  # fmt: skip
        config = cfg.load(path)
        with Daemon(path) as daemon:
            proc = psutil.Process(daemon.pid)
            load = Load(config)
            start = time.monotonic()
            for t in load.threads:
                t.start()
            try:
                while (now := time.monotonic() - start) < SECONDS:
                    s = sample(proc, start, load)
                    samples.append(s)
                    print(f"{s.at:7.0f} {s.rss / MIB:8.1f} {s.fds:5d} {s.threads:7d} "
                          f"{s.hosts_rss / MIB:9.1f} {s.ops:7d} {s.errors:6d}", flush=True)
                    load.stop.wait(min(SAMPLE, SECONDS - now))
                samples.append(sample(proc, start, load))
            finally:
                load.stop.set()
                for t in load.threads:
                    t.join(120)
    counts = ", ".join(f"{k}: {v}" for k, v in sorted(load.counts.items()))
    print(f"done: {counts}; errors: {len(load.errors)}")
    for line in load.errors[:5]:
        print(f"  {line}")
    print(plot(samples, PLOT))
    grew = verdict(samples)
    print("flat after the warm-up" if not grew else "GREW: " + "; ".join(grew))
    return 0 if not grew and not load.errors else 1


if __name__ == "__main__":
    sys.exit(main())
