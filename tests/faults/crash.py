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

import json
import re
from typing import Any

from actors.records import CacheLoss, Record, ToolResult, Usage, User, to_json

__all__ = ["check_calls", "shape", "split_turns", "turn_number"]

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


def check_calls(records: tuple[Record, ...]) -> None:
    """Call numbers in the log only grow: each tool result has a number of its own."""
    calls = [r.call for r in records if isinstance(r, ToolResult)]
    assert calls == sorted(set(calls)), f"tool call numbers repeat or go back: {calls}"
