"""A hypothesis state machine drives the in-process session service (actors.service.local)
through open, turn (an answer, a tool call, a failing tool call, a turn past its tool
limit), fork, rewind, compact and close, and after every step checks every session's log
against a model of what it must hold:

- the operations, in order: each turn's message, each rewind's turn, each compaction, the
  fork's note after the source's records (a fork is the source's log, then Forked);
- the turns still shown (a rewind goes back to what was shown when a turn was asked,
  the model's own fold), so every rewind takes back the turn the model says;
- every turn whole: its tool calls each answered once, in order, an answer and its Usage
  at its end (a turn stopped by its limit: the calls before it answered, the one past it
  not run);
- the file as the service says (a reader agrees), tool-call numbers only growing.

Hypothesis prints a failure's steps shrunk, as a replayable program, and the run's seed in
the header (``--hypothesis-seed=N`` replays it). ``LOOPD_MACHINE_EXAMPLES`` (default 10) and
``LOOPD_MACHINE_STEPS`` (default 16) size the run; CI's profile is derandomized.
"""

from __future__ import annotations

import collections
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from actors.base import config as cfg
from actors.base.errors import TurnLimit, UsageError
from actors.log.file import read_records
from actors.log.records import (
    Assistant,
    CacheLoss,
    Compaction,
    Forked,
    Record,
    Rewind,
    ToolResult,
    Usage,
    User,
)
from actors.service.local import LocalService
from tests.daemon.daemonkit import daemon_config
from tests.faults.crash import check_calls
from tests.support.fake_llama import FakeLlama
from tests.support.scripted_llama import agent
from tests.tools.hostkit import short_dir

EXAMPLES = int(os.environ.get("LOOPD_MACHINE_EXAMPLES", "10"))
STEPS = int(os.environ.get("LOOPD_MACHINE_STEPS", "16"))
TOOL_LIMIT = 2  # loop.tool_iterations: a turn asking for more is stopped there
READ = 'read_file {"path": "notes.txt"}'
KINDS = {
    "answer": "",
    "tool": f" :: {READ}",
    "fail": ' :: read_file {"path": "no/such/file.txt"}',
    "limit": f" :: {READ} :: {READ} :: {READ}",
}
COUNTS: collections.Counter[str] = collections.Counter()


class Rig:
    """The service (one world, one tool host, the fake) shared by every example."""

    service: ClassVar[LocalService]
    log_dir: ClassVar[Path]
    names: ClassVar[Iterator[int]] = itertools.count(1)


@pytest.fixture(scope="module", autouse=True)
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with FakeLlama(agent()) as fake, short_dir() as d:
        path = daemon_config(tmp_path_factory.mktemp("machine"), d / "run", fake.url,
                             sections={"loop": {"tool_iterations": TOOL_LIMIT}})
        config = cfg.load(path)
        Rig.service, Rig.log_dir = LocalService.start(config), config.log_dir
        try:
            yield
        finally:
            Rig.service.shutdown()
    print(f"\nsession machine: {COUNTS['examples']} examples, {COUNTS['steps']} steps; "
          + ", ".join(f"{k}: {v}" for k, v in sorted(COUNTS.items())
                      if k not in ("examples", "steps")))


class Model:
    """What one session's log must hold: its operations and the turns it still shows."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.shown: list[int] = []
        self.asked: list[list[int]] = []  # per turn: the turns shown when it was asked

    def copy(self) -> Model:
        other = Model()
        other.ops, other.shown = list(self.ops), list(self.shown)
        other.asked = [list(a) for a in self.asked]
        return other

    def turn(self, text: str) -> None:
        self.ops.append(f"turn {text}")
        self.asked.append(list(self.shown))
        self.shown.append(len(self.asked))

    def rewind(self) -> int:
        to_turn = self.shown[-2] if len(self.shown) > 1 else 0
        self.ops.append(f"rewind {to_turn}")
        if to_turn < len(self.asked):
            self.shown = list(self.asked[to_turn])
        return to_turn


def operations(records: tuple[Record, ...]) -> list[str]:
    """The log as the model writes it; every turn checked whole on the way."""
    ops: list[str] = []
    turn: list[Record] = []

    def end_turn() -> None:
        if not turn:
            return
        calls = [c.id for r in turn if isinstance(r, Assistant) for c in r.tool_calls]
        answered = [r.tool_call_id for r in turn if isinstance(r, ToolResult)]
        assert isinstance(turn[0], User)
        if turn[0].content.startswith("limit"):  # stopped: the call past the limit not run
            # (the next request shows it "No result", actors/session/messages.py)
            assert answered == calls[:TOOL_LIMIT] and len(calls) == TOOL_LIMIT + 1, calls
        else:
            assert answered == calls, f"tool calls not each answered once: {calls} {answered}"
            assert isinstance(turn[-1], Usage) and isinstance(turn[-2], Assistant), turn[-2:]
        turn.clear()

    for record in records[1:]:
        if isinstance(record, User):
            end_turn()
            ops.append(f"turn {record.content}")
            turn.append(record)
        elif isinstance(record, Rewind | Compaction | Forked):
            end_turn()
            ops.append(f"rewind {record.to_turn}" if isinstance(record, Rewind) else
                       f"forked {record.from_} {record.at}" if isinstance(record, Forked) else
                       f"compact {record.by.value}")
        elif not isinstance(record, CacheLoss):  # (after a Usage: what the cache missed)
            assert turn, f"a {type(record).__name__} outside a turn"
            turn.append(record)
    end_turn()
    return ops


class SessionMachine(RuleBasedStateMachine):
    sessions = Bundle("sessions")

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, Model] = {}
        self.service = Rig.service
        self.example = next(Rig.names)
        self.made = itertools.count(1)
        COUNTS["examples"] += 1

    def _name(self) -> str:
        return f"m{self.example}-{next(self.made)}"

    def _did(self, what: str) -> None:
        COUNTS["steps"] += 1
        COUNTS[what] += 1

    @rule(target=sessions)
    def open(self) -> str:
        name = self._name()
        opened = self.service.open(name)
        assert opened.created and opened.records == 1
        self.models[name] = Model()
        self._did("open")
        return name

    @rule(name=sessions)
    def answer(self, name: str) -> None:
        self.turn(name, "answer")

    @rule(name=sessions)
    def tool(self, name: str) -> None:
        self.turn(name, "tool")

    @rule(name=sessions, kind=st.sampled_from(["fail", "limit"]))
    def trouble(self, name: str, kind: str) -> None:
        self.turn(name, kind)

    def turn(self, name: str, kind: str) -> None:
        model = self.models[name]
        text = f"{kind} {len(model.asked) + 1}{KINDS[kind]}"
        model.turn(text)
        if kind == "limit":  # stopped there: the calls made are answered, no answer
            with pytest.raises(TurnLimit, match=r"loop\.tool_iterations = 2"):
                self.service.turn(name, text, lambda _: None, _refuse)
        else:
            outcome = self.service.turn(name, text, lambda _: None, _refuse)
            assert outcome.tool_calls == KINDS[kind].count("::"), (kind, outcome)
        self._did(f"turn {kind}")

    @rule(target=sessions, source=sessions)
    def fork(self, source: str) -> str:
        name = self._name()
        made = self.service.fork(source, name)
        model = self.models[source].copy()
        assert made.at == len(model.asked)
        model.ops.append(f"forked {source} {made.at}")
        self.models[name] = model
        self._did("fork")
        return name

    @rule(name=sessions)
    def rewind(self, name: str) -> None:
        model = self.models[name]
        if not model.shown:
            with pytest.raises(UsageError, match="to take back"):
                self.service.rewind(name)
            self._did("rewind refused")
            return
        taken = model.shown[-1]
        done = self.service.rewind(name)
        assert done.to_turn == model.rewind() and done.taken == (taken,), done
        assert done.left == tuple(model.shown)
        self._did("rewind")

    @rule(name=sessions)
    def compact(self, name: str) -> None:
        try:
            self.service.compact(name, lambda _: None)
        except UsageError as e:
            assert "nothing to compact" in str(e)
            self._did("compact refused")
            return
        self.models[name].ops.append("compact person")
        self._did("compact")

    @rule(name=consumes(sessions))
    def close(self, name: str) -> None:
        """Detached: its log stays as it is, and it opens again from it."""
        before = self.service.records(name)
        self.service.close(name)
        assert read_records(Rig.log_dir / name / "log.bin") == before
        opened = self.service.open(name, create=False)
        assert not opened.created and opened.records == len(before) and opened.cut_bytes == 0
        self._did("close and reopen")

    @invariant()
    def every_log_holds_what_the_model_says(self) -> None:
        for name, model in self.models.items():
            records = self.service.records(name)
            assert operations(records) == model.ops, name
            assert read_records(Rig.log_dir / name / "log.bin") == records
            check_calls(records)

    def teardown(self) -> None:
        for name in self.models:
            self.service.close(name)


def _refuse(*_: Any) -> bool:
    raise AssertionError("no call of these turns needs approval")


SessionMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None)
test_the_session_service_keeps_what_the_model_says = SessionMachine.TestCase
