"""The baselines' KV states of this test run: saved once, restored by every real-model test
that starts from one (docs/slots.md#a-new-session-starts-warm).

A new session's first request on the embedded model processes its baseline (the system
prompt and the tools: ~1,170 tokens with the defaults, ~300 with the tests' short system
prompt and no standard tools) and saves it, unless a saved one is there. Every real-model
test has a data home of its own (tests/conftest.py), so each processed its baseline cold:
the same ~1,170 tokens in three tests, the same ~300 in five. A test marked
``@pytest.mark.baseline(NAME)`` gets instead, in its data home's save directory, a copy of
the state of the baseline :data:`BASELINES` names, made in this run: by a new session's
first turn on a server of this run's build (loopd's own warm start, ``SlotKeeper.warm_start``,
on a data home of its own), once per run for all the pytest-xdist workers (the first that
needs it makes it; the others wait on its lock). Nothing of another run or build reaches a
test: the store lives in this run's temporary directory. A test about the cold start or the
baseline's own save is not marked, and processes its baseline as before.

A marked test whose config renders another baseline (another system prompt, tools or slot
count) finds no file under its key: it processes its own, as unmarked (slower, still right).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from tests.support.embedded import MODEL

__all__ = ["BASELINES", "SHORT_SYSTEM", "baseline_files"]

SHORT_SYSTEM = "Answer in a few words."  # not embedded.system's ~450 tokens: fewer to process

# name -> the config sections a baseline's sessions share (the rest of a test's config, like
# its context size, log or workspace, is no part of the baseline's key)
BASELINES: Mapping[str, Mapping[str, Mapping[str, Any]]] = {
    # the embedded defaults: their system prompt, the standard tools, two slots
    "defaults": {},
    # the tests' short system prompt, no standard tools, two slots (the default)
    "short": {"session": {"system": SHORT_SYSTEM}, "tools": {"standard": False}},
    # the same on one slot (a state restores only on a server of its own slot count)
    "short-1-slot": {"session": {"system": SHORT_SYSTEM}, "tools": {"standard": False},
                     "embedded": {"slots": 1}},
}
FILES = "_baseline-*"  # the baselines' state files and metadata (KEY.bin, KEY.json)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """``path`` locked (flock) for this process: one xdist worker at a time."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def baseline_files(name: str, store: Path, data_home: Callable[[], str],
                   threads: int) -> list[Path]:
    """The saved state of baseline ``name`` (``KEY.bin`` and ``KEY.json``) in ``store`` (this
    run's), made there first if no test of this run made it yet. ``data_home`` gives a new
    private ``XDG_DATA_HOME`` (the model linked in) to make it in; ``threads``: the
    server's, as the tests'."""
    done = store / name
    with _locked(store / f"{name}.lock"):
        if not done.is_dir():
            made = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=store))
            _make(name, made, data_home, threads)
            made.rename(done)  # whole or not at all: a failed make leaves no half store
    return sorted(done.iterdir())


def _make(name: str, into: Path, data_home: Callable[[], str], threads: int) -> None:
    """One new session's first turn of one token on the baseline's config: the server
    processes the baseline and saves it (the warm start's own path); its files go ``into``."""
    from actors.base.cancel import CancelToken
    from actors.inference.slots.files import slot_dir
    from actors.session.world import start_world

    home = Path(data_home())
    try:
        sections = {k: dict(v) for k, v in BASELINES[name].items()}
        embedded = {**sections.pop("embedded", {}), "threads": threads, "model": MODEL,
                    "data_dir": str(home / "loopd")}
        config = cfg.parse({
            **sections,
            "log": {"dir": str(home / "sessions"), "fsync": "never"},
            "loop": {"max_tokens": 1},
            "inference": {"temperature": 0, "seed": 1},
            "embedded": embedded,
        })
        with start_world(config) as world:
            world.session("baseline").turn(world.runtime, "Hi.", lambda _: None,
                                           CancelToken()).get(timeout=900)
        found = sorted(slot_dir(config.embedded).glob(FILES))
        if not {p.suffix for p in found} >= {".bin", ".json"}:
            raise RuntimeError(f"baseline {name!r}: the warm start saved no state "
                               f"({[p.name for p in found]}): see docs/slots.md")
        for path in found:
            shutil.copy2(path, into / path.name)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def copy_into(files: list[Path], data_home: str) -> None:
    """``files`` copied (not linked: a restore rewrites the metadata, a save the state) into
    the embedded save directory of ``data_home``, made as the server makes it (0700)."""
    slots = Path(data_home) / "loopd" / "slots"
    slots.mkdir(mode=0o700, exist_ok=True)
    os.chmod(slots, 0o700)
    for path in files:
        shutil.copy2(path, slots / path.name)
