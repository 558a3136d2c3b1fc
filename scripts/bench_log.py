"""Session log speed, side by side with SQLite storing the same msgpack payloads.

Appends of ~300-byte records: the log with fsync "always" (fdatasync per record) and
"never", against SQLite in WAL mode with ``synchronous=FULL`` (and ``OFF``), one
transaction per record. Then the time to reopen a 100,000-record log (read, CRC, decode
every record) against a SQLite ``SELECT`` of the same payloads plus the same decode.
Temp files go under ``$LOOPD_BENCH_DIR`` (default: the system temp dir); put it on the
disk that holds the sessions, fsync numbers mean nothing on tmpfs.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from actors.log.file import HEADER, SessionLog, frame
from actors.log.records import (
    Assistant,
    Baseline,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
    decode,
    encode,
)
from actors.tools.protocol.spec import ResultClass

__all__ = ["run"]

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
BASE = Baseline(system="bench", tools=(), model="m", created=T0, time=T0)
BUDGET_S = 2.0  # per durable append measurement
FAST_N = 20_000  # appends without fsync
REOPEN_N = 100_000
SMOKE = {"BUDGET_S": 0.05, "FAST_N": 200, "REOPEN_N": 500}  # `bench --smoke`


def record_300b(i: int) -> Record:
    """A tool result whose payload is about 300 bytes."""
    return ToolResult(
        call=i, tool_call_id=f"call_{i:08d}", content="x" * 200, class_=ResultClass.PUBLIC,
        untrusted=False, truncated=False, time=T0,
    )


def mixed(i: int) -> Record:
    """A realistic mix for the reopen measurement: every kind that a turn writes."""
    k = i % 5
    if k == 0:
        return User(content=f"question {i} " + "y" * 80, time=T0)
    if k == 1:
        call = ToolCall(id=f"c{i}", name="read_file", arguments='{"path": "notes.txt"}')
        return Assistant(content=None, reasoning="thinking " * 10, tool_calls=(call,), time=T0)
    if k == 2:
        return record_300b(i)
    if k == 3:
        return Usage(
            timings={"cache_n": i, "prompt_n": 12, "prompt_ms": 3.5, "predicted_ms": 40.1},
            reasoning_tokens=10, thinking_capped=False, prompt_tokens=i, completion_tokens=30,
            finish_reason="stop", time=T0,
        )
    return Assistant(content="answer " * 20, reasoning=None, time=T0)


class _Rate:
    """Appends per second over several short rounds, so that two stores measured in
    alternating rounds share the machine's noise."""

    def __init__(self, append: Callable[[int], None]) -> None:
        self.append, self.n, self.seconds = append, 0, 0.0

    def round(self, budget_s: float, limit: int) -> None:
        started = time.perf_counter()
        while self.n < limit:
            self.n += 1
            self.append(self.n)
            if time.perf_counter() - started >= budget_s:
                break
        self.seconds += time.perf_counter() - started

    @property
    def per_s(self) -> float:
        return self.n / self.seconds if self.seconds else 0.0


def _side_by_side(a: _Rate, b: _Rate, budget_s: float, limit: int, rounds: int = 4) -> None:
    for i in range(1, rounds + 1):
        cap = limit * i // rounds  # each store does at most limit in all
        a.round(budget_s / rounds, cap)
        b.round(budget_s / rounds, cap)


def _sqlite(path: Path, synchronous: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("CREATE TABLE IF NOT EXISTS records (id INTEGER PRIMARY KEY, payload BLOB)")
    return db


def _appends(
    root: Path, policy: str, synchronous: str, budget_s: float, limit: int
) -> Iterator[dict[str, Any]]:
    """The log under ``policy`` against SQLite under ``synchronous``, in alternating rounds."""
    log, _ = SessionLog.open(root / f"log-{policy}" / "log.bin", fsync=policy, baseline=BASE)
    db = _sqlite(root / f"sqlite-{synchronous}.db", synchronous)
    try:
        def insert(i: int) -> None:
            db.execute("BEGIN")
            db.execute("INSERT INTO records (payload) VALUES (?)", (encode(record_300b(i)),))
            db.execute("COMMIT")

        ours, theirs = _Rate(lambda i: log.append(record_300b(i))), _Rate(insert)
        _side_by_side(ours, theirs, budget_s, limit)
    finally:
        log.close()
        db.close()
    size = len(frame(record_300b(1)))
    yield {"name": f"log append, fsync {policy}", "value": ours.per_s, "unit": "appends/s",
           "ratio": ours.per_s / theirs.per_s,
           "note": f"{size} B frames, n={ours.n}; ratio vs the next row"}
    yield {"name": f"sqlite WAL synchronous={synchronous}, 1 tx/record", "value": theirs.per_s,
           "unit": "appends/s", "note": f"same payloads, n={theirs.n}"}


def _best_of(times: int, fn: Callable[[], Any]) -> float:
    best = float("inf")
    for _ in range(times):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def _reopen(root: Path) -> Iterator[dict[str, Any]]:
    records = [mixed(i) for i in range(1, REOPEN_N)]
    payloads = [encode(r) for r in records]
    path = root / "big" / "log.bin"
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.write(HEADER + frame(BASE))
        f.writelines(frame(r) for r in records)
    size = path.stat().st_size

    def reopen() -> None:
        log, report = SessionLog.open(path)
        log.close()
        assert report.records == REOPEN_N and report.cut_bytes == 0

    def floor() -> None:
        """What any reader of these frames pays: read, CRC, msgpack; no record is built."""
        data = path.read_bytes()
        view, pos, head = memoryview(data), len(HEADER), struct.Struct("<II")
        maps = []
        while pos < len(data):
            length, crc = head.unpack_from(data, pos)
            end = pos + 8 + length
            assert zlib.crc32(view[pos + 8 : end]) == crc
            maps.append(msgpack.unpackb(data[pos + 8 : end], timestamp=3))
            pos = end
        assert len(maps) == REOPEN_N

    log_s = _best_of(3, reopen)
    floor_s = _best_of(3, floor)
    decode_s = _best_of(3, lambda: [decode(p) for p in payloads])

    db = _sqlite(root / "big.db", "FULL")
    try:
        db.execute("BEGIN")
        db.executemany(
            "INSERT INTO records (payload) VALUES (?)",
            ((p,) for p in [encode(BASE), *payloads]),
        )
        db.execute("COMMIT")

        def select() -> None:
            rows = [decode(p) for (p,) in db.execute("SELECT payload FROM records ORDER BY id")]
            assert len(rows) == REOPEN_N

        sqlite_s = _best_of(3, select)
    finally:
        db.close()
    note = f"{REOPEN_N:,} records, {size / 1e6:.1f} MB, best of 3"
    yield {"name": "reopen log (read, crc, decode, lock)", "value": log_s, "unit": "s",
           "note": note}
    yield {"name": "  of which decoding the records", "value": decode_s, "unit": "s",
           "ratio": decode_s / log_s, "note": "share of the reopen"}
    yield {"name": "  floor: read, crc, msgpack (no records)", "value": floor_s, "unit": "s",
           "ratio": log_s / floor_s, "note": "ratio: reopen / floor (what building costs)"}
    yield {"name": "sqlite SELECT + decode, same payloads", "value": sqlite_s, "unit": "s",
           "note": "ratio: loopd reopen / sqlite"}
    yield {"name": "reopen ratio loopd / sqlite", "value": log_s / sqlite_s, "unit": "x",
           "ratio": log_s / sqlite_s, "note": "< 1: loopd faster"}


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    base = os.environ.get("LOOPD_BENCH_DIR") or None
    with tempfile.TemporaryDirectory(prefix="loopd-bench-", dir=base) as tmp:
        root = Path(tmp)
        rows += _appends(root, "always", "FULL", 2 * BUDGET_S, 100_000)
        rows += _appends(root, "never", "OFF", BUDGET_S, FAST_N)
        rows += _reopen(root)
    return rows


if __name__ == "__main__":
    for row in run():
        print(row, file=sys.stdout)
