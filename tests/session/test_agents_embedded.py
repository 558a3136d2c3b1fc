"""Agents on the real model: two children at once, each starting warm (docs/agents.md).

The embedded llama-server with two slots. The parent's first response is scripted (two
``agent`` calls: the small model is not asked to decide that here, only to answer the
children's tasks and then the parent); everything else is the real model. Both children's
requests are at the server at the same time (each one's answer began before the other's
ended), and each child's first request processes only its task plus a few tokens of the
template: the baseline's KV state is restored into its slot (or processed once, apart, by
the first child of a baseline never saved). Answers are cut at a few tokens
(``loop.max_tokens``): what is measured is the prompt and the overlap.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import AgentDone, AgentEvent, Content, Event, Progress, Reasoning
from actors.log.file import read_records
from actors.log.records import Usage
from actors.log.sessiondir import session_path
from actors.session.world import start_world
from tests.support.embedded import FEW, THREADS, require_embedded
from tests.support.scripted_parent import ParentScripted

TASKS = ("Name the capital of France in one word.", "Name the capital of Italy in one word.")
TEMPLATE = 12  # tokens of the chat template around a user message and the assistant cue


@pytest.mark.embedded
@pytest.mark.timeout(1200)
def test_two_children_run_at_once_and_each_first_request_processes_only_its_task(
        tmp_path: Path) -> None:
    require_embedded()
    config = cfg.parse({
        "log": {"dir": str(tmp_path / "sessions"), "fsync": "never"},
        "tools": {"standard": False, "workspace": str(tmp_path)},
        "session": {"system": "Answer in a few words."},
        "loop": {"max_tokens": 6},
        "inference": {"temperature": 0, "seed": 1},
        "agents": {"enabled": True},
        "embedded": {"slots": 2, "threads": THREADS},
    })
    seen: dict[str, list[float]] = {}  # child -> [first token at, done at]
    lock = threading.Lock()

    def sink(event: Event) -> None:
        with lock:
            if isinstance(event, AgentEvent) and isinstance(event.event, Content | Reasoning
                                                            | Progress):
                seen.setdefault(event.agent, [time.monotonic(), 0.0])
            if isinstance(event, AgentDone):
                seen.setdefault(event.agent, [0.0, 0.0])[1] = time.monotonic()

    with start_world(config) as world:
        runtime = dataclasses.replace(world.runtime, inference=ParentScripted(
            world.runtime.inference, "s", [(task, "fresh") for task in TASKS]))
        session = world.session("s")
        started = time.monotonic()
        outcome = session.turn(runtime, "What are the capitals of France and Italy?", sink,
                               CancelToken()).get(timeout=1100)
        wall = time.monotonic() - started
        firsts = {}
        for name, task in zip(("s.a1", "s.a2"), TASKS, strict=True):
            records = read_records(session_path(config, name))
            firsts[name] = (next(r for r in records if isinstance(r, Usage)),
                            world.runtime.inference.tokens(name, task))
    print(f"\nturn {wall:.1f} s; children (first token, done) {seen}; first requests "
          + "; ".join(f"{n}: prompt_n {u.timings.get('prompt_n')} cache_n "
                      f"{u.timings.get('cache_n')} task {t}" for n, (u, t) in firsts.items()))
    assert outcome.content is not None
    (a_first, a_done), (b_first, b_done) = seen["s.a1"], seen["s.a2"]
    assert a_first < b_done and b_first < a_done, seen  # at the server at the same time
    for usage, task_tokens in firsts.values():
        assert usage.timings["prompt_n"] <= task_tokens + TEMPLATE + FEW, usage.timings
        assert usage.timings["cache_n"] > 0, usage.timings  # the baseline, restored or kept
