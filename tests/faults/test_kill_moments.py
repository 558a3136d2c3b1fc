"""SIGKILL at seeded moments of loopd's durable work: nothing lost, nothing half, nothing left.

A child (:mod:`tests.faults.moment_child`) runs turns with tool calls and the slot keeper's
KV saves, a compaction by hand, a fork, a rewind, an auto compaction, three clients at
once through the in-process session service, a turn handing two tasks to agents (child
sessions), and is stopped at its K-th step of I/O (a
write, an fsync, a rename, ...; before it, after it, or halfway through a write) and
SIGKILLed there. A clean run of the same child, first, gives the number of steps and every
session's records. After each kill:

- every process the child started is gone (its tool host watches its parent);
- every session log reads whole (a torn tail is cut on open, nothing else) and the reader
  and the reopened session agree; a session whose creation was cut holds no record;
- every session's records are a prefix of the clean run's (without times and cache
  numbers: :func:`tests.faults.crash.shape`); a fork's target is absent or whole;
- every KV state's metadata still reads (a save is a cache: whole or ignored);
- the next turn on session ``a``, in a new world, is right.

``LOOPD_KILL_MOMENTS`` (default 8, one a phase: the share ``make test`` runs) sets how
many moments, ``LOOPD_KILL_SEED`` the seed; each moment prints its K and WHEN, and
``LOOPD_KILL_REPLAY=K:WHEN`` runs that one moment again (``LOOPD_KILL_PHASE=agents``: every
moment in that phase) (the step count can shift by a few
between runs: threads interleave their writes).
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from actors.base.errors import SessionError
from actors.inference.slots.files import SlotStore
from actors.log.file import SessionLog, read_records
from actors.log.records import Assistant, CacheLoss, Forked, Record, Usage, User
from actors.session.world import start_world
from tests.faults.crash import shape, wait_gone
from tests.faults.killpoint import run_to_moment
from tests.faults.moment_child import N_CTX, PHASES, config, message
from tests.support.fake_llama import FakeLlama
from tests.support.leftovers import hosts_of, leftovers_killed
from tests.support.scripted_llama import agent
from tests.support.watch import HANG_S

MOMENTS = int(os.environ.get("LOOPD_KILL_MOMENTS", "8"))
SEED = int(os.environ.get("LOOPD_KILL_SEED", "20261206"))
REPLAY = os.environ.get("LOOPD_KILL_REPLAY", "")
ONLY = os.environ.get("LOOPD_KILL_PHASE", "")  # every moment in this one phase (e.g. agents)
WHENS = ("before", "after", "half")
CHILD = "tests.faults.moment_child"

STATS: collections.Counter[str] = collections.Counter()


def shapes(records: tuple[Record, ...]) -> list[str]:
    return [shape(r) for r in records if not isinstance(r, CacheLoss)]


def sessions(root: Path) -> dict[str, Path]:
    base = root / "sessions"
    if not base.is_dir():
        return {}
    return {p.name: p / "log.bin" for p in base.iterdir()
            if not p.name.startswith(".") and (p / "log.bin").exists()}


Clean = tuple[dict[str, range], dict[str, list[str]], list[list[str]]]


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clean]:
    """The clean run: each phase's steps and every session's record shapes."""
    root = tmp_path_factory.mktemp("clean")
    said: list[str] = []
    with leftovers_killed():
        line = run_to_moment(CHILD, root, -1, "before", said=said)
    assert line.startswith("finished "), line
    starts = [(p.split()[1], int(p.split()[2])) for p in said if p.startswith("phase ")]
    assert [name for name, _ in starts] == list(PHASES)
    ends = [s for _, s in starts[1:]] + [int(line.split()[1])]
    phases = {name: range(start, end) for (name, start), end in zip(starts, ends, strict=True)}
    logs = {name: shapes(read_records(path)) for name, path in sessions(root).items()}
    assert sorted(logs) == ["a", "b", "c0", "c1", "c2", "d0", "d1", "d2", "e", "e.a1", "e.a2"]
    print(f"\nclean run: {line.split()[1]} steps; "
          + ", ".join(f"{k} {len(v)}" for k, v in phases.items()))
    trace = [t.split()[1:] for t in said if t.startswith("trace ")]
    yield phases, logs, trace
    total = sum(v for k, v in STATS.items() if k.startswith("killed "))
    print(f"\nkill moments (seed {SEED}): {total} SIGKILLs survived of {1 if REPLAY else MOMENTS}; "
          + ", ".join(f"{k}: {v}" for k, v in sorted(STATS.items())))


def moment(i: int, phases: dict[str, range]) -> tuple[int, str]:
    """Moment ``i``: the phases in turn (each has its share, whatever its writes), a step
    of it and a WHEN drawn from the seed (or the replayed one)."""
    if REPLAY:
        k, when = REPLAY.split(":")
        return int(k), when
    rng = random.Random(f"{SEED}:{i}")
    steps = phases[ONLY or PHASES[i % len(PHASES)]]
    return rng.choice(steps), rng.choice(WHENS)


def check_logs(root: Path, clean: dict[str, list[str]]) -> None:
    """Every log whole and a prefix of the clean run's; a fork's target absent or whole."""
    for name, path in sessions(root).items():
        assert name in clean, f"a session the clean run has not: {name}"
        try:
            seen = read_records(path)
        except SessionError as e:
            assert "has no baseline record" in str(e), e  # its creation was cut: holds nothing
            STATS["a creation cut"] += 1
            continue
        log, report = SessionLog.open(path, fsync="never")
        with log:
            records = log.records
        STATS["torn tails cut"] += report.cut_bytes > 0
        assert records == seen, f"session {name}: the reader and the reopened log disagree"
        got = shapes(records)
        assert got == clean[name][: len(got)], f"session {name} is not a prefix of the clean run's"
        if name == "b":
            assert any(isinstance(r, Forked) for r in records), "a fork's target half made"
    store = SlotStore(root / "save", reachable=True)
    assert all(meta.session for _, meta in store.all())  # every saved state's metadata reads


def next_turn_works(root: Path) -> None:
    path = root / "sessions" / "a" / "log.bin"
    try:
        before = read_records(path)
    except SessionError:  # not made yet, or its creation cut (check_logs said which)
        before = ()
    with FakeLlama(agent(), save_dir=root / "save", props={"n_ctx": N_CTX}) as fake, \
            start_world(config(root, fake.url)) as world:
        world.session("a").turn(world.runtime, message(7), lambda _: None).get(timeout=120)
    after = read_records(path)
    assert after[: len(before)] == before, "the next turn changed what was there"
    new = after[len(before):]
    # (it may compact first: the conversation may need it)
    assert [r.content for r in new if isinstance(r, User)] == [message(7)], new
    answers = [r for r in new if isinstance(r, Assistant)]
    assert answers[-1].content == "done turn 000007.", answers[-1]
    assert isinstance(new[-1], Usage)


@pytest.mark.parametrize("i", range(1 if REPLAY else MOMENTS))
def test_a_sigkill_at_a_seeded_moment_loses_nothing(
        i: int, clean: Clean, tmp_path: Path) -> None:
    phases, logs, _ = clean
    k, when = moment(i, phases)
    print(f"moment {i}: LOOPD_KILL_REPLAY={k}:{when} (seed {SEED})")
    with leftovers_killed():
        started: list[psutil.Process] = []
        line = run_to_moment(CHILD, tmp_path, k, when, started)
        wait_gone(started, HANG_S)
        if line.startswith("finished"):
            STATS["ran past (steps shifted)"] += 1
        else:
            _, _, did, op, phase = line.split()
            STATS[f"killed in {phase}"] += 1
            STATS[f"{did} {op}"] += 1
        check_logs(tmp_path, logs)
        next_turn_works(tmp_path)
        assert hosts_of(os.getpid()) == []


def test_every_durable_write_is_synced_in_order(clean: Clean) -> None:
    """What a SIGKILL cannot show (the kernel keeps what was written) a power cut would:
    the clean run's steps in order keep the rules that make them durable. A file is
    synced before it is renamed into place; a directory is synced after a name in it
    changed; a log is synced after each write, before anything else writes it. KV states
    (``save/``) are caches checked by size and crc when restored: left out."""
    trace = [t for t in clean[2] if "/save/" not in t[1]]
    assert trace, "the clean run traced no step"
    unsynced: dict[str, int] = {}  # file -> index of its last write not yet synced
    renamed: dict[str, int] = {}  # directory -> index of a rename into it not yet synced
    problems = []
    for i, (op, path, *rest) in enumerate(trace):
        if op == "write":
            if path.endswith("/log.bin") and path in unsynced:
                problems.append(f"step {i}: {path} written again before it was synced")
            unsynced[path] = i
        elif op in ("fsync", "fdatasync"):
            unsynced.pop(path, None)
            renamed.pop(path, None)
        elif op in ("rename", "replace"):
            to, kind = rest
            if kind == "file" and path in unsynced:
                problems.append(f"step {i}: {path} renamed to {to} before it was synced")
            unsynced.pop(path, None)
            renamed.setdefault(os.path.dirname(to), i)
    problems += [f"step {i}: {p} written and never synced" for p, i in unsynced.items()
                 if p.endswith("/log.bin")]
    problems += [f"step {i}: a rename into {d} and the directory never synced"
                 for d, i in renamed.items()]
    STATS["ordered steps checked"] = len(trace)
    assert problems == [], "\n".join(problems)
