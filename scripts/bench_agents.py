"""The agent tool on the real embedded server, two slots (docs/agents.md).

(a) **At once**: a turn whose first response hands two tasks to agents (scripted:
    :mod:`tests.support.scripted_parent`; the rest is the real model), with
    ``agents.max_parallel`` 2 (both children at once, a slot each) against 1 (one after the
    other): the wall time of the children (the first started to the last done) and of the
    turn, side by side in one run on one server.
(b) **A child's first request**: prompt tokens processed and time to its first token, for a
    fresh child (the baseline's saved KV state restored), a forked one (the parent's state)
    and a cold one (``slots.warm_start`` off, a new server: it processes the baseline too).

Needs the embedded extra; without it the bench reports itself skipped.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import AgentDone, AgentEvent, AgentStarted, Content, Event, Reasoning
from actors.log.file import read_records
from actors.log.records import AgentLink, Usage
from actors.log.sessiondir import session_path
from actors.session.world import World, start_world
from scripts.benchkit import SMOKE_SERVER, scratch, skipped
from tests.support.scripted_parent import ParentScripted

ANSWER = 48  # tokens each child writes at most: what two slots decode side by side
THREADS = 0  # the server's threads (embedded.threads); 0: every core, as a person's has
SYSTEM = ""  # session.system; "": embedded.system, a person's
TASKS = ("Describe Paris in three sentences.", "Describe Rome in three sentences.")
SMOKE = {"ANSWER": 2, **SMOKE_SERVER}  # `bench --smoke`: two-token answers
NAMES = tuple(f"{p}{s}" for p in ("par", "seq", "warm", "cold") for s in ("", ".a1", ".a2"))


class Clock:
    """A sink noting, per child, when it started, its first token, and when it ended."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        now = time.perf_counter()
        with self.lock:
            if isinstance(event, AgentStarted):
                self.started[event.agent] = now
            elif isinstance(event, AgentDone):
                self.done[event.agent] = now
            elif isinstance(event, AgentEvent) and isinstance(event.event, Content | Reasoning):
                self.first.setdefault(event.agent, now)

    def span(self) -> float:
        return max(self.done.values()) - min(self.started.values())


def run() -> list[dict[str, Any]]:
    if (skip := skipped()) is not None:
        return skip
    sections: dict[str, Any] = {"embedded": {"threads": THREADS, "slots": 2},
                                "session": {"system": SYSTEM}, "agents": {"enabled": True}}
    with scratch("loopd-bench-agents-", NAMES, ANSWER, **sections) as config:
        return _measure(config)


def _turn(world: World, config: cfg.Config, name: str, tasks: list[tuple[str, str]]
          ) -> tuple[float, Clock]:
    """One turn of ``name`` that starts ``tasks``' children: its seconds and their clock."""
    runtime = dataclasses.replace(world.runtime, config=config, inference=ParentScripted(
        world.runtime.inference, name, tasks))
    session = _OPEN.get((id(world), name)) or world.session(name)
    _OPEN[(id(world), name)] = session
    clock = Clock()
    started = time.perf_counter()
    session.turn(runtime, "Tell me about Paris and Rome.", clock, CancelToken()).get(timeout=1800)
    return time.perf_counter() - started, clock


_OPEN: dict[tuple[int, str], Any] = {}  # a session's actor, opened once a world


def _first(config: cfg.Config, child: str) -> Usage:
    records = read_records(session_path(config, child))
    after = max(i for i, r in enumerate(records) if isinstance(r, AgentLink))
    return next(r for r in records[after:] if isinstance(r, Usage))


def _measure(config: cfg.Config) -> list[dict[str, Any]]:
    fresh = [(t, "fresh") for t in TASKS]
    serial = config.replace("agents", max_parallel=1)
    with start_world(config) as world:
        # the children's baseline saved once (another task: a slot keeps what it last held)
        _turn(world, config, "warm", [("Describe Oslo in three sentences.", "fresh")])
        par_s, par = _turn(world, config, "par", fresh)
        seq_s, seq = _turn(world, serial, "seq", fresh)
        _, forked = _turn(world, config, "warm", [(TASKS[0], "fork")])
    cold = config.replace("slots", warm_start=False)
    with start_world(cold) as world:
        _, colds = _turn(world, cold, "cold", fresh[:1])
    rows: list[dict[str, Any]] = [
        {"name": "two children at once: their wall time", "value": par.span(), "unit": "s",
         "ratio": 1.0, "note": f"the turn {par_s:.1f} s (agents.max_parallel = 2)"},
        {"name": "two children one after the other: their wall time", "value": seq.span(),
         "unit": "s", "ratio": seq.span() / max(par.span(), 1e-9),
         "note": f"the turn {seq_s:.1f} s (agents.max_parallel = 1)"},
    ]
    for what, clock, child in (("fresh, warm", par, "par.a1"), ("forked", forked, "warm.a2"),
                               ("cold (warm_start off)", colds, "cold.a1")):
        usage = _first(config if child != "cold.a1" else cold, child)
        ttft = clock.first.get(child, clock.done[child]) - clock.started[child]
        rows.append({"name": f"a child's first request, {what}: prompt tokens processed",
                     "value": int(usage.timings.get("prompt_n", 0)), "unit": "tokens",
                     "note": f"of {usage.prompt_tokens:,}; first token after {ttft:.1f} s"})
    return rows
