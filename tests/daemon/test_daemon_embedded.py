"""The daemon on the real model: ``loopd serve`` starts the embedded llama-server once, and
``loopd run`` after ``loopd run`` on one session goes through it: the second command's
request finds the session's KV state kept in its slot and processes only the new tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.log.file import read_records
from actors.log.records import CacheLoss, SlotState, Usage
from tests.daemon.daemonkit import Daemon, cli
from tests.support.baselines import SHORT_SYSTEM
from tests.support.embedded import FEW, MODEL, THREADS, flat, require_embedded
from tests.tools.hostkit import short_dir


@pytest.mark.embedded
@pytest.mark.baseline("short")  # restored in the first command: what is shown is the kept slot
@pytest.mark.timeout(900)
def test_loopd_run_after_loopd_run_through_the_daemon_keeps_the_model_and_the_cache(
    tmp_path: Path,
) -> None:
    require_embedded()
    with short_dir() as d:
        config = tmp_path / "loopd.toml"
        config.write_text(
            f'[log]\ndir = "{tmp_path / "sessions"}"\n'
            # not embedded.system's ~450 tokens: a request without the kept state still
            # processes ~300 (the baseline), a warm one ~25
            f'[session]\nsystem = "{SHORT_SYSTEM}"\n'
            "[tools]\nstandard = false\n"
            "[loop]\nmax_tokens = 8\n"
            "[inference]\ntemperature = 0\nseed = 1\n"
            f"[embedded]\nthreads = {THREADS}\nmodel = \"{MODEL}\"\n"
            f'[daemon]\nruntime_dir = "{d / "run"}"\nconnect_timeout_s = 5\n',
            encoding="utf-8",
        )
        with Daemon(config) as daemon:
            first = cli(config, "run", "--session", "warm", "Name three colours.", timeout=400)
            assert first.returncode == 0, first.stderr + daemon.text()
            second = cli(config, "run", "--session", "warm", "And three fruits?", timeout=400)
            assert second.returncode == 0, second.stderr
            for run in (first, second):  # neither command started a model server
                assert "starting" not in run.stderr and "model" not in run.stderr.lower()
            assert cli(config, "stop").returncode == 0
    records = read_records(tmp_path / "sessions" / "warm" / "log.bin")
    before, after = [r for r in records if isinstance(r, Usage)]
    assert after.slot is not None and after.slot.state is SlotState.KEPT
    new_tokens = after.prompt_tokens - before.prompt_tokens
    assert after.timings["prompt_n"] <= new_tokens + FEW, (after.timings, new_tokens)
    assert not [r for r in records if isinstance(r, CacheLoss)]
    assert "state kept in the slot" in flat(cli(config, "log", "show", "warm").stdout)
