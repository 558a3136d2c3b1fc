"""`make eval`'s conversations longer than the context (set ``overflow``), once per way on.

The task files of set ``overflow`` (examples/eval/overflow-*.toml) are each one session of
20+ turns on a copy of loopd's own docs and sources, so that the embedded model's context
(8,192 tokens a slot) fills several times. Each is run once per *way*, each way on a world
of its own (its own model server, the config differing only in the way):

- ``summary``: ``session.compaction = "summary"`` (the model writes the summary);
- ``elide``: ``session.compaction = "elide"`` (the deterministic summary, no model call);
- ``new-session``: no compaction (``session.compaction = "off"``):
  what a person can do without compaction, a new session each time the context is full.

A way may name ``session.compact_at`` too: ``elide@0.5`` compacts at half the context (a
shorter working context). In every way a turn that fails for a full context
(``SessionFull``) is asked again in a new session on the same workspace, and the rest of
the conversation goes on there.

Per task file and way: turns passed, turns whose answer is only in an early turn ("early
fact") and only in the last turns ("recent fact") passed, turns survived (answered before
the first new session), sessions used, compactions, the prompt tokens the server processed
(llama-server's ``prompt_n``, summed over the conversation, the summary requests' included),
the tokens the model wrote for summaries and the wall time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from actors.base import config as cfg
from actors.base.errors import ConfigError
from scripts import eval as ev

__all__ = ["WAYS", "Overall", "Tally", "run_overflow", "tallies", "way_config"]

WAYS = ("summary", "elide", "new-session")
NO_COMPACTION = "new-session"
EARLY, RECENT = "early fact", "recent fact"


def way_config(base: cfg.Config, way: str) -> cfg.Config:
    """``base`` with the compaction of ``way`` (``NAME`` or ``NAME@COMPACT_AT``)."""
    name, _, at = way.partition("@")
    if name not in WAYS:
        raise ValueError(f"unknown way {way!r}: one of {', '.join(WAYS)} (NAME@0.5 for "
                         "session.compact_at)")
    if name == NO_COMPACTION:
        if at:
            raise ValueError(f"{way}: a new session each time needs no compact_at")
        return base.replace("session", compaction="off")
    changes: dict[str, Any] = {"compaction": name}
    if at:
        changes["compact_at"] = float(at)
    try:
        return base.replace("session", **changes)
    except ConfigError as e:
        raise ValueError(f"way {way!r}: {e}") from None


def run_overflow(
    files: Sequence[ev.TaskFile],
    base: cfg.Config,
    ways: Sequence[str] = WAYS,
    *,
    timeout_s: float = ev.TASK_TIMEOUT_S,
    seed: int = ev.SEED,
    say: Callable[[str], None] = lambda _: None,
) -> list[ev.Row]:
    """Every file's conversation once per way (each way on a world of its own)."""
    configs = {way: way_config(base, way) for way in ways}  # every way checked first
    rows: list[ev.Row] = []
    for way, config in configs.items():
        say(f"== overflow, way {way}")
        rows += ev.run_tasks(files, config, timeout_s=timeout_s, seed=seed, say=say,
                             restart=True, way=way)
    return rows


@dataclasses.dataclass(frozen=True, slots=True)
class Tally:
    """One task file's conversation in one way."""

    file: str
    way: str
    turns: int
    passed: int
    early: tuple[int, int]  # early-fact turns passed, of
    recent: tuple[int, int]  # recent-fact turns passed, of
    survived: int  # turns answered before the first new session (all: none needed)
    sessions: int
    compactions: int
    processed: int  # prompt tokens the server processed, over the whole conversation
    written: int  # tokens the model wrote for the summaries (way summary)
    seconds: float

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class Overall:
    """One way over every file."""

    way: str
    turns: int
    passed: int
    early: tuple[int, int]
    recent: tuple[int, int]
    survived: int
    sessions: int
    compactions: int
    processed: int
    written: int
    seconds: float


def tallies(rows: Sequence[ev.Row]) -> list[Tally]:
    """Per task file and way, in the order they ran."""
    out: list[Tally] = []
    keys = list(dict.fromkeys((r.file, r.way) for r in rows))
    for file, way in keys:
        mine = [r for r in rows if r.file == file and r.way == way]
        restarts = [i for i, r in enumerate(mine) if r.restarted]
        out.append(Tally(
            file=file, way=way, turns=len(mine), passed=sum(r.passed for r in mine),
            early=_of(mine, EARLY), recent=_of(mine, RECENT),
            survived=restarts[0] if restarts else len(mine),
            sessions=1 + len(restarts), compactions=sum(r.compactions for r in mine),
            processed=sum(r.processed for r in mine), written=sum(r.written for r in mine),
            seconds=round(sum(r.seconds for r in mine), 1),
        ))  # fmt: skip
    return out


def overall(found: Sequence[Tally]) -> list[Overall]:
    """Per way, over every file."""
    ways = list(dict.fromkeys(t.way for t in found))
    out: list[Overall] = []
    for way in ways:
        mine = [t for t in found if t.way == way]
        out.append(Overall(
            way=way, turns=sum(t.turns for t in mine), passed=sum(t.passed for t in mine),
            early=(sum(t.early[0] for t in mine), sum(t.early[1] for t in mine)),
            recent=(sum(t.recent[0] for t in mine), sum(t.recent[1] for t in mine)),
            survived=sum(t.survived for t in mine), sessions=sum(t.sessions for t in mine),
            compactions=sum(t.compactions for t in mine),
            processed=sum(t.processed for t in mine), written=sum(t.written for t in mine),
            seconds=round(sum(t.seconds for t in mine), 1),
        ))  # fmt: skip
    return out


def _of(rows: Sequence[ev.Row], kind: str) -> tuple[int, int]:
    mine = [r for r in rows if r.kind == kind]
    return sum(r.passed for r in mine), len(mine)


def table(rows: Sequence[ev.Row]) -> None:
    """The per-file-and-way table and the per-way totals."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    found = tallies(rows)
    t = Table(title="loopd eval: conversations longer than the context, per way")
    cols = ("file", "way", "passed", "early facts", "recent facts", "turns survived",
            "sessions", "compactions", "tokens processed", "summary tokens", "time (s)")
    for col in cols:
        t.add_column(col, justify="left" if col in ("file", "way") else "right")
    for x in [*found, *overall(found)]:
        t.add_row(
            getattr(x, "file", "all"), x.way, f"{x.passed}/{x.turns}",
            f"{x.early[0]}/{x.early[1]}", f"{x.recent[0]}/{x.recent[1]}",
            f"{x.survived}/{x.turns}", str(x.sessions), str(x.compactions),
            f"{x.processed:,}", f"{x.written:,}", f"{x.seconds:.0f}",
        )
    console.print(t)


def summary_json(rows: Sequence[ev.Row]) -> dict[str, Any]:
    found = tallies(rows)
    return {"per_file": [t.row() for t in found],
            "per_way": [dataclasses.asdict(o) for o in overall(found)]}
