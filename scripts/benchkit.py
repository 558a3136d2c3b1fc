"""What the real-model benches share (``bench_slots``, ``bench_fork``): a long session's
history and a turn timed to its first token.

Not a bench itself (``python -m scripts.bench`` runs ``bench_*.py`` only).
"""

from __future__ import annotations

import time

from actors.base.cancel import CancelToken
from actors.base.events import Content, Event, Reasoning, ToolCallDelta
from actors.log.records import Record, Usage
from actors.session.turn import Runtime
from actors.session.world import World


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


def timed_turn(app: World, runtime: Runtime, name: str, text: str) -> tuple[float, Usage]:
    """One turn of session ``name``, its actor stopped after: seconds to its first token,
    and its last Usage."""
    session = app.session(name)
    sink = FirstToken()
    started = time.perf_counter()
    session.turn(runtime, text, sink, CancelToken()).get(timeout=900)
    records: tuple[Record, ...] = session.records().get(timeout=60)
    session.actor_ref.stop(timeout=30)
    app.sessions.remove(session)
    usage = [r for r in records if isinstance(r, Usage)][-1]
    return (sink.at or time.perf_counter()) - started, usage
