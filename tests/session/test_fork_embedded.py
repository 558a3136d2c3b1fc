"""Fork and rewind on the real model: a branch and an undo start from saved KV state.

Real ``loopd`` commands, one after another, on the embedded llama-server (each ``run`` is a
new server process, so only a saved state file can spare the prompt processing). A source
session of more than 500 tokens (a short system prompt, one long message, then a question)
is forked at its end and at its first turn; each fork's first request processes only its new tokens
(``timings.prompt_n``), and its log says the state was the source's. Then one of the forks
takes back its last turn and goes on: that request too processes only its new message, from
the fork's own saved state. The answers are cut at a few tokens (``loop.max_tokens``): what
is measured is the prompt.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.inference.slots.keeper import FORKED
from actors.log.file import read_records
from actors.log.records import CacheLoss, Forked, Record, Rewind, SlotState, Usage, User
from tests.support.baselines import SHORT_SYSTEM
from tests.support.embedded import FEW, MODEL, THREADS, flat, require_embedded

ROOT = Path(__file__).resolve().parents[2]
HISTORY_TOKENS = 500  # a cold request would process all of it: the checks see ~20
NAMES = ("src", "end", "early")


def long_message() -> str:
    lines = [f"Fact {i}: the box number {i} holds {i * 7 % 31} red marbles and {i % 5} blue."
             for i in range(1, 21)]  # ~680 tokens with SHORT_SYSTEM (28: 924)
    return "Read these facts; I will ask about them.\n" + "\n".join(lines)


def loopd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPD_CONFIG"}
    done = subprocess.run(
        [sys.executable, "-m", "actors.cli", *args, "--config", str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )
    assert done.returncode == 0, (args, done.stderr)
    return done


def log_of(tmp_path: Path, name: str) -> tuple[Record, ...]:
    return read_records(tmp_path / "sessions" / name / "log.bin")


def last_usage(tmp_path: Path, name: str) -> Usage:
    return [r for r in log_of(tmp_path, name) if isinstance(r, Usage)][-1]


def assert_warm(after: Usage, held: Usage) -> None:
    """``after``'s request reused all of ``held``'s request (the state the source saved
    holds it) and processed only its new tokens, plus a few: those after ``held``'s prompt
    (the answer to it, re-rendered from its text, and the new message)."""
    new_tokens = after.prompt_tokens - held.prompt_tokens
    assert after.timings["cache_n"] >= held.prompt_tokens - FEW, (after.timings, held.timings)
    assert after.timings["prompt_n"] <= new_tokens + FEW, (after.timings, new_tokens)


@pytest.mark.embedded
@pytest.mark.baseline("short")  # restored in the first command: what is shown is the forks'
@pytest.mark.timeout(900)
def test_forks_at_the_end_and_at_a_turn_and_a_rewind_process_only_their_new_tokens(
    tmp_path: Path,
) -> None:
    require_embedded()
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\n'
        f'[session]\nsystem = "{SHORT_SYSTEM}"\n'
        "[tools]\nstandard = false\n"
        "[loop]\nmax_tokens = 6\n"
        "[inference]\ntemperature = 0\nseed = 1\n"
        f"[embedded]\nthreads = {THREADS}\nmodel = \"{MODEL}\"\n",
        encoding="utf-8",
    )
    try:
        loopd(config, "run", "--local", "--session", "src", long_message())
        loopd(config, "run", "--local", "--session", "src", "How many red marbles in box 3?")
        first, second = [r for r in log_of(tmp_path, "src") if isinstance(r, Usage)]
        assert first.prompt_tokens >= HISTORY_TOKENS
        src_bytes = hashlib.sha256((tmp_path / "sessions/src/log.bin").read_bytes()).digest()

        said = loopd(config, "sessions", "fork", "--local", "src", "end").stderr
        assert "it starts from src's saved KV state" in flat(said)
        loopd(config, "sessions", "fork", "--local", "src", "early", "--at", "1")
        assert hashlib.sha256((tmp_path / "sessions/src/log.bin").read_bytes()).digest() \
            == src_bytes  # the source is not touched

        # each fork's first request: from src's state, only the new message processed
        for name, held, at in (("end", second, 2), ("early", first, 1)):
            run = loopd(config, "run", "--local", "--session", name, "And in box 4?")
            records = log_of(tmp_path, name)
            (note,) = [r for r in records if isinstance(r, Forked)]
            assert (note.from_, note.at) == ("src", at)
            after = last_usage(tmp_path, name)
            assert after.slot is not None and after.slot.state is SlotState.RESTORED, after.slot
            assert after.slot.restored >= HISTORY_TOKENS
            origin = FORKED.format(origin="src")
            assert origin in after.slot.reason  # the log says whose state it was
            assert origin in flat(run.stderr)  # and so does the run's summary line
            assert origin in flat(loopd(config, "log", "show", name).stdout)
            assert_warm(after, held)
            assert not [r for r in records if isinstance(r, CacheLoss)]

        # the end fork takes back its turn 3 and asks another: its own state serves it
        loopd(config, "rewind", "--local", "end")
        loopd(config, "run", "--local", "--session", "end", "And in box 5?")
        records = log_of(tmp_path, "end")
        assert [r.to_turn for r in records if isinstance(r, Rewind)] == [2]
        assert [r.content for r in records if isinstance(r, User)][-2:] == [
            "And in box 4?", "And in box 5?"]  # the rewound turn stays in the log
        after = last_usage(tmp_path, "end")
        assert after.slot is not None and after.slot.state is SlotState.RESTORED, after.slot
        assert FORKED.format(origin="src") not in after.slot.reason  # the fork's own state
        assert_warm(after, second)  # turn 2's request and answer were kept in it
        assert not [r for r in records if isinstance(r, CacheLoss)]
    finally:
        for name in NAMES:  # and their KV state files with them
            if (tmp_path / "sessions" / name).exists():
                loopd(config, "sessions", "rm", name)
