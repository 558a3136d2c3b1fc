"""What the crash test compares: records without their times, split into numbered turns.

A clean run and a run killed many times agree on every turn's records except where they
cannot: record times, the server's cache numbers (``Usage.timings``, ``prompt_tokens``,
``CacheLoss``, and what the slot keeper found, ``Usage.slot``: a killed request leaves the
server's slot cache in another state, and a new process finds its slots empty) and the
session's call numbers (a call whose result was never written gives its number back).
:func:`shape` keeps everything else, with the turn number written as ``N``, so turn 7 and
turn 4 of the same kind compare equal.
"""

from __future__ import annotations

import collections
import json
import re
import time
from pathlib import Path
from typing import Any

import psutil

from actors.base.processes.trees import is_alive, kill_tree
from actors.log.file import SessionLog, read_records
from actors.log.records import CacheLoss, Compaction, Record, ToolResult, Usage, User, to_json

__all__ = ["FULL_TURN", "Checker", "check_calls", "shape", "split_turns", "turn_number",
           "uncompacted", "wait_gone"]

FULL_TURN = ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage"]

_TURN = re.compile(r"turn[ -]\d+")
_DROP = {"time": None, "created": None}
_DROP_USAGE = ("timings", "prompt_tokens", "slot")


def shape(record: Record) -> str:
    """The record as comparable text: no times, cache numbers or call number; turn as N."""
    data: dict[str, Any] = {k: v for k, v in to_json(record).items() if k not in _DROP}
    if isinstance(record, Usage):
        for key in _DROP_USAGE:
            data.pop(key, None)
    if isinstance(record, ToolResult):
        data.pop("call", None)
    return _TURN.sub("turn N", json.dumps(data, sort_keys=True, ensure_ascii=False))


def turn_number(record: User) -> int:
    """The n of a ``turn n :: ...`` user message."""
    match = re.match(r"turn (\d+) ::", record.content)
    if match is None:
        raise AssertionError(f"not a numbered turn: {record.content!r}")
    return int(match.group(1))


def split_turns(records: tuple[Record, ...]) -> list[tuple[int, list[Record]]]:
    """The records after the baseline as (turn number, records of the turn), CacheLoss left out."""
    turns: list[tuple[int, list[Record]]] = []
    for record in records[1:]:
        if isinstance(record, CacheLoss):
            continue
        if isinstance(record, User):
            turns.append((turn_number(record), [record]))
        elif not turns:
            raise AssertionError(f"a {type(record).__name__} before the first User record")
        else:
            turns[-1][1].append(record)
    return turns


def uncompacted(records: list[Record]) -> list[Record]:
    """A turn's records but Compactions: a long run (a quiet machine finishes more turns a
    life) passes compact_at, and one may come before any request of a turn."""
    return [r for r in records if not isinstance(r, Compaction)]


def check_calls(records: tuple[Record, ...]) -> None:
    """Call numbers in the log only grow: each tool result has a number of its own."""
    calls = [r.call for r in records if isinstance(r, ToolResult)]
    assert calls == sorted(set(calls)), f"tool call numbers repeat or go back: {calls}"


def wait_gone(procs: list[psutil.Process], bound: float) -> float:
    """Seconds until every process in ``procs`` is gone; fails past ``bound`` (killing them)."""
    start = time.monotonic()
    while True:
        alive = [p for p in procs if is_alive(p)]
        if not alive:
            return time.monotonic() - start
        if time.monotonic() - start > bound:
            for p in alive:
                kill_tree(p.pid)
            raise AssertionError(f"processes outlived the killed daemon: {alive}")
        time.sleep(0.01)


class Checker:
    """Checks the session after each kill against the clean run, and counts what it saw."""

    def __init__(self, path: Path, reference: list[list[str]], name: str) -> None:
        self.path = path
        self.name = name
        self.reference = reference
        self.previous: tuple[Record, ...] = ()
        self.stats: collections.Counter[str] = collections.Counter()

    def check(self, kills: int) -> list[tuple[int, list[Record]]]:
        seen = read_records(self.path, name=self.name)  # a reader, while nobody holds it
        log, report = SessionLog.open(self.path, fsync="never")
        with log:
            records = log.records
        if report.cut_bytes:
            self.stats["torn tails cut"] += 1
        assert records == seen, "the reader and the reopened session disagree"
        assert records[: len(self.previous)] == self.previous, "a durable record changed"
        check_calls(records)
        turns = split_turns(records)
        assert [n for n, _ in turns] == list(range(1, len(turns) + 1)), "turns skipped"
        unfinished = 0
        for n, rs in turns:
            want = self.reference[(n - 1) % len(self.reference)]
            # Compactions have crash tests of their own: test_compact_kill's.
            got = [shape(r) for r in uncompacted(rs)]
            assert got == want[: len(got)], f"turn {n} is not a prefix of a clean run's"
            unfinished += len(got) < len(want)
        assert unfinished <= kills, "a turn was left unfinished by a life that was not killed"
        self.previous = records
        return turns

    def landed(self, before: int, turns: list[tuple[int, list[Record]]]) -> None:
        """Where the last kill landed: mid-turn after which record, or between turns."""
        last = turns[-1][1]
        if len(last) == len(FULL_TURN):
            self.stats["between turns"] += 1
        else:
            self.stats[f"mid-turn after {type(last[-1]).__name__}"] += 1
        self.stats["turns written"] = len(turns)
        self.stats["records written"] = len(self.previous)
        del before
