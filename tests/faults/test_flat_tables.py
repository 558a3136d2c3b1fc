"""Open, turn, compact, fork, rewind, close and remove, over and over, through the in-process
session service (what the daemon runs for each client): what it keeps per session goes
when the session goes, and the garbage the work leaves stays where the collector's young
collections take it. ``make soak`` found both growing (scripts/soak.py): the slot keeper
remembered every session ever used, and opening a log moved every thread's young objects
to the oldest generation, where no collection came for them.
"""

from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import cast

from actors.base import config as cfg
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.service.local import LocalService
from tests.daemon.daemonkit import daemon_config
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

CYCLES = 5
READ = 'read_file {"path": "notes.txt"}'


def _ignore(_event: Event) -> None:
    pass


def _refuse(*_args: object) -> bool:
    return False


def _garbage() -> weakref.ref[object]:
    """A garbage cycle, made just after a young collection: the next one takes it."""

    class Cycle:
        def __init__(self) -> None:
            self.me = self

    gc.collect(0)
    return weakref.ref(Cycle())


def _cycle(service: LocalService, n: int) -> list[weakref.ref[object]]:
    """One session's life and a fork's; the garbage made as each log was opened again."""
    name, fork = f"s{n}", f"s{n}-fork"
    service.turn(name, f"turn {n} :: {READ}", _ignore, _refuse)
    service.compact(name, _ignore)
    service.close(name)
    left = [_garbage()]
    service.turn(name, f"turn {n}b", _ignore, _refuse)  # reopened: its log read
    service.fork(name, fork)
    left.append(_garbage())
    service.turn(fork, f"fork {n}", _ignore, _refuse)  # the fork's log read
    service.close(fork)
    service.remove(fork)
    service.rewind(name)
    service.close(name)
    service.remove(name)
    return left


def test_sessions_come_and_go_and_leave_nothing_behind(tmp_path: Path) -> None:
    with FakeLlama(agent()) as fake, short_dir() as d:
        config = cfg.load(daemon_config(tmp_path, d / "run", fake.url))
        with LocalService.start(config) as service:
            _cycle(service, 0)  # the world started, the first of each kind done
            table = service.table
            keeper = cast(Inference, table.worlds.get().runtime.inference).keeper
            for n in range(1, CYCLES + 1):
                left = _cycle(service, n)
                assert (table.rows(), keeper.entries()) == ([], 0), f"after cycle {n}"
                oldest = {id(obj) for obj in gc.get_objects(generation=2)}
                moved = [ref for ref in left if (obj := ref()) is not None and id(obj) in oldest]
                assert not moved, f"cycle {n}: young garbage moved to the oldest generation"
