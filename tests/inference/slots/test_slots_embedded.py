"""A session comes back in a new command and its KV state is restored: the real model.
And a new session starts warm: its first request restores the saved baseline.

Real ``loopd run`` processes on the embedded llama-server, one after the other, on one
session with more than 500 tokens of history (a short system prompt and one long user
message: the cheapest way to get there; a request without the state processes all of them,
a restored one only its ~25 new ones). The first command saves the session's slot when its
turn is answered; the second starts a new server, restores the file, and its request
processes only the new tokens (``timings.prompt_n``), with no CacheLoss and a log that says
"restored".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.inference.slots.keeper import BASE_LOST, BASE_RESTORED
from actors.log.file import read_records
from actors.log.records import CacheLoss, SlotState, Usage
from tests.daemon.daemonkit import Daemon, cli
from tests.support.baselines import SHORT_SYSTEM
from tests.support.embedded import FEW, MODEL, THREADS, flat, require_embedded
from tests.tools.hostkit import short_dir

ROOT = Path(__file__).resolve().parents[3]
HISTORY_TOKENS = 500  # a cold request processes all of it, a restored one ~25
BASELINE_TOKENS = 200  # SHORT_SYSTEM and the tools without the standard ones: ~300 tokens


def long_message(facts: int = 20) -> str:  # 20: ~680 tokens with SHORT_SYSTEM
    lines = [f"Fact {i}: the box number {i} holds {i * 7 % 31} red marbles and {i % 5} blue."
             for i in range(1, facts + 1)]
    return "Read these facts; I will ask about them.\n" + "\n".join(lines)


def loopd(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "LOOPD_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "actors.cli", *args, "--config", str(config)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400, check=False,
    )


@pytest.mark.embedded
@pytest.mark.baseline("short")  # restored in the first command: what is shown is the session's
@pytest.mark.timeout(600)
def test_a_new_command_restores_a_long_session_and_processes_only_the_new_tokens(
    tmp_path: Path,
) -> None:
    require_embedded()
    config = tmp_path / "loopd.toml"
    config.write_text(
        f'[log]\ndir = "{tmp_path / "sessions"}"\n'
        f'[session]\nsystem = "{SHORT_SYSTEM}"\n'
        "[tools]\nstandard = false\n"
        "[loop]\nmax_tokens = 8\n"
        "[inference]\ntemperature = 0\nseed = 1\n"
        f"[embedded]\nthreads = {THREADS}\nmodel = \"{MODEL}\"\n",
        encoding="utf-8",
    )
    first = loopd(config, "run", "--session", "long", long_message())
    assert first.returncode == 0, first.stderr
    second = loopd(config, "run", "--session", "long", "How many red marbles are in box 3?")
    assert second.returncode == 0, second.stderr
    try:
        records = read_records(tmp_path / "sessions" / "long" / "log.bin")
        before, after = [r for r in records if isinstance(r, Usage)]
        assert before.prompt_tokens >= HISTORY_TOKENS
        assert after.slot is not None and after.slot.state is SlotState.RESTORED
        assert after.slot.restored >= HISTORY_TOKENS
        new_tokens = after.prompt_tokens - before.prompt_tokens
        assert after.timings["prompt_n"] <= new_tokens + FEW, (after.timings, new_tokens)
        assert not [r for r in records if isinstance(r, CacheLoss)]
        said = f"restored {after.slot.restored:,} tokens in"
        assert said in flat(second.stderr)  # the run's summary line
        assert said in flat(loopd(config, "log", "show", "long").stdout)
    finally:
        removed = loopd(config, "sessions", "rm", "long")  # and its KV state file with it
    assert removed.returncode == 0, removed.stderr
    assert not (tmp_path / "sessions" / "long").exists()


@pytest.mark.embedded
@pytest.mark.baseline("short-1-slot")  # restored: what is shown is the session's state
@pytest.mark.timeout(900)
def test_a_state_saved_with_one_context_size_is_restored_with_another(tmp_path: Path) -> None:
    """``embedded.ctx_size`` raised (and lowered again, the state still fitting): the real
    llama-server takes the saved state each time, so nothing is processed again."""
    require_embedded()

    def config(ctx_size: int) -> Path:
        path = tmp_path / f"loopd-{ctx_size}.toml"
        # compact_at 0.8: at the embedded 0.4 these small contexts compact, and the state
        # this test carries from one context size to the next would be dropped
        path.write_text(
            f'[log]\ndir = "{tmp_path / "sessions"}"\n'
            f'[session]\nsystem = "{SHORT_SYSTEM}"\ncompact_at = 0.8\n'
            "[tools]\nstandard = false\n"
            "[loop]\nmax_tokens = 8\n"
            "[inference]\ntemperature = 0\nseed = 1\n"
            f"[embedded]\nctx_size = {ctx_size}\nslots = 1\nthreads = {THREADS}\n"
            f'model = "{MODEL}"\n',
            encoding="utf-8",
        )
        return path

    facts = long_message(11)  # about 250 tokens
    runs = [loopd(config(1024), "run", "--session", "ctx", facts),
            loopd(config(2048), "run", "--session", "ctx", "How many red marbles in box 3?"),
            loopd(config(1024), "run", "--session", "ctx", "And in box 4?")]
    for run in runs:
        assert run.returncode == 0, run.stderr
    try:
        records = read_records(tmp_path / "sessions" / "ctx" / "log.bin")
        first, larger, smaller = [r for r in records if isinstance(r, Usage)]
        for after, before in ((larger, first), (smaller, larger)):
            assert after.slot is not None and after.slot.state is SlotState.RESTORED, after.slot
            assert after.timings["cache_n"] >= before.prompt_tokens  # the history, not redone
            new_tokens = after.prompt_tokens - before.prompt_tokens
            assert after.timings["prompt_n"] <= new_tokens + FEW, (after.timings, new_tokens)
        assert not [r for r in records if isinstance(r, CacheLoss)]
        assert "prompt cache lost" not in flat(runs[1].stderr + runs[2].stderr)
    finally:
        assert loopd(config(1024), "sessions", "rm", "ctx").returncode == 0


@pytest.mark.embedded
@pytest.mark.baseline("short-1-slot")  # the saved baseline that stands in, made in this run
@pytest.mark.timeout(900)
def test_a_state_a_smaller_context_cannot_hold_is_not_sent_and_the_loss_says_why(
    tmp_path: Path,
) -> None:
    """The state is saved after a long turn, that turn is rewound (the conversation is short
    again), and the server comes back with a context smaller than the state: loopd does not
    send it (llama-server takes a state only into a context that holds it), the saved
    baseline stands in, the request is processed from the baseline on, and the CacheLoss
    says why, in the log and to the person."""
    require_embedded()

    def config(ctx_size: int) -> Path:
        path = tmp_path / f"loopd-{ctx_size}.toml"
        # compact_at 0.8: at the embedded 0.4 these small contexts compact, and the state
        # this test carries from one context size to the next would be dropped
        path.write_text(
            f'[log]\ndir = "{tmp_path / "sessions"}"\n'
            f'[session]\nsystem = "{SHORT_SYSTEM}"\ncompact_at = 0.8\n'
            f'[tools]\nstandard = false\nworkspace = "{tmp_path}"\n'
            "[loop]\nmax_tokens = 8\n"
            "[inference]\ntemperature = 0\nseed = 1\n"
            f"[embedded]\nctx_size = {ctx_size}\nslots = 1\nworkspace_map = 0\n"
            f"threads = {THREADS}\nmodel = \"{MODEL}\"\n"
            f'[daemon]\nruntime_dir = "{tmp_path / "run"}"\n',
            encoding="utf-8",
        )
        return path

    facts = long_message(15)  # ~350 tokens: after "Hi." (~300) the state is more than 512
    runs = [loopd(config(2048), "run", "--session", "small", "Hi."),
            loopd(config(2048), "run", "--session", "small", facts),
            loopd(config(2048), "rewind", "small"),
            loopd(config(512), "run", "--session", "small", "What did I say first?")]
    for run in runs:
        assert run.returncode == 0, run.stderr
    try:
        records = read_records(tmp_path / "sessions" / "small" / "log.bin")
        first, long_one, last = [r for r in records if isinstance(r, Usage)]
        saved = long_one.prompt_tokens + long_one.completion_tokens
        assert saved > 512 > last.prompt_tokens  # the state does not fit; the prompt does
        # the saved baseline stands in: only the conversation after it is processed again
        assert last.slot is not None and last.slot.state is SlotState.RESTORED, last.slot
        cause = "does not fit the server's context (512 tokens a slot)"
        assert cause in last.slot.reason and BASE_RESTORED in last.slot.reason
        (loss,) = [r for r in records if isinstance(r, CacheLoss)]
        assert loss.got < first.prompt_tokens <= loss.expected and cause in loss.cause
        assert cause in flat(runs[3].stderr), runs[3].stderr
    finally:
        assert loopd(config(2048), "sessions", "rm", "small").returncode == 0


@pytest.mark.embedded
@pytest.mark.timeout(900)
def test_new_sessions_start_warm_from_the_saved_baseline_also_after_the_daemon_restarts(
    tmp_path: Path,
) -> None:
    """Three new sessions through the daemon, the third after it restarted (a new
    llama-server process: only the saved file can help): each first request restores the
    baseline (system prompt and tools, ~300 tokens here) and processes only its message and
    the template's few tokens. The first new session of the baseline may have processed it
    (it then saved it), or restored what an earlier run saved."""
    require_embedded()
    with short_dir() as d:
        config = tmp_path / "loopd.toml"
        config.write_text(
            f'[log]\ndir = "{tmp_path / "sessions"}"\n'
            f'[session]\nsystem = "{SHORT_SYSTEM}"\n'
            "[tools]\nstandard = false\n"
            "[loop]\nmax_tokens = 8\n"
            "[inference]\ntemperature = 0\nseed = 1\n"
            f"[embedded]\nthreads = {THREADS}\nmodel = \"{MODEL}\"\n"
            f'[daemon]\nruntime_dir = "{d / "run"}"\nconnect_timeout_s = 5\n',
            encoding="utf-8",
        )
        asked = {"one": "Name three colours.", "two": "Name three fruits.",
                 "three": "Name three birds."}
        try:
            for daemon_run in (("one", "two"), ("three",)):
                with Daemon(config) as daemon:
                    for name in daemon_run:
                        run = cli(config, "run", "--session", name, asked[name], timeout=400)
                        assert run.returncode == 0, run.stderr + daemon.text()
                    assert cli(config, "stop").returncode == 0
            check_warm(config, tmp_path, asked)
        finally:
            for name in asked:  # and their KV state files with them
                loopd(config, "sessions", "rm", name)


def check_warm(config: Path, tmp_path: Path, asked: dict[str, str]) -> None:
    """Each new session's first request restored the baseline and processed only its
    message (the first of all may have processed and saved it), with no CacheLoss."""
    for name in asked:
        records = read_records(tmp_path / "sessions" / name / "log.bin")
        usage = next(r for r in records if isinstance(r, Usage))
        losses = [r for r in records if isinstance(r, CacheLoss)]
        assert usage.slot is not None, name
        if name == "one" and usage.slot.state is not SlotState.RESTORED:
            # the embedded save directory is this user's: what another config left under
            # this baseline's name (another slot count, build) is a loss, and replaced
            assert all(BASE_LOST.format(why="") in loss.cause for loss in losses), losses
            assert "processed first" in usage.slot.reason and "saved" in usage.slot.reason
            continue
        assert not losses, name
        assert usage.slot.state is SlotState.RESTORED, (name, usage.slot)
        assert BASE_RESTORED in usage.slot.reason
        assert usage.slot.restored >= BASELINE_TOKENS, (name, usage.slot)
        message = usage.prompt_tokens - usage.slot.restored  # its message and template marks
        assert usage.timings["prompt_n"] <= message + FEW, (name, usage.timings, message)
        assert usage.timings["prompt_n"] < BASELINE_TOKENS // 5, (name, usage.timings)
        said = f"restored {usage.slot.restored:,} tokens in"
        assert said in flat(loopd(config, "log", "show", name).stdout)
