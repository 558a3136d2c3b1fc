"""The gate's side of a call's questions mid-call: an MCP server's elicitation goes to the
approver's ``elicit`` (or nowhere), and its progress becomes events."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from actors.approval.gate import Gate
from actors.approval.rulesfile import RuleStore
from actors.base.cancel import CancelToken
from actors.base.config import parse
from actors.base.events import (
    ApprovalRequested,
    Decision,
    ElicitationAnswered,
    ElicitationRequested,
    Elicited,
    Event,
    ToolProgress,
)
from actors.tools.protocol import wire

FORM = {"type": "object", "properties": {"name": {"type": "string", "default": "Ada"}}}
QUESTION = wire.Ask(7, 1, "greeter", "Whom shall I greet?", FORM)


class Person:
    """An approver that can also answer a server's questions: with ``answer`` (None: no
    answer came by the deadline)."""

    def __init__(self, answer: Elicited | None) -> None:
        self.answer = answer
        self.asked: list[tuple[ElicitationRequested, float]] = []

    def __call__(self, request: ApprovalRequested, cancel: CancelToken, deadline: float
                 ) -> Decision | None:
        raise AssertionError("no approval is asked here")

    def elicit(self, request: ElicitationRequested, cancel: CancelToken, deadline: float
               ) -> Elicited | None:
        self.asked.append((request, deadline))
        return self.answer


def gate(tmp_path: Path, approver: Any, events: list[Event]) -> Gate:
    tools = parse({"tools": {"approval_timeout_s": 30}}).tools
    return Gate(tools=tools, store=RuleStore(tmp_path / "rules.toml"), records=lambda: (),
                append=lambda _r: None, emit=events.append, approver=approver,
                cancel=CancelToken())


def test_a_question_goes_to_the_person_with_its_form(tmp_path: Path) -> None:
    events: list[Event] = []
    person = Person(Elicited("accept", {"name": "Grace"}))
    questions = gate(tmp_path, person, events).asker(3, "greet")
    assert questions.ask is not None and questions.timeout_s == 30
    assert questions.ask(QUESTION, math.inf) == ("accept", {"name": "Grace"})
    ((asked, _),) = person.asked
    assert (asked.call, asked.tool, asked.server, asked.message) == (
        3, "greet", "greeter", "Whom shall I greet?")
    assert '"default": "Ada"' in asked.fields
    assert events == [asked, ElicitationAnswered(call=3, tool="greet", action="accept")]


def test_no_answer_in_time_cancels_the_question(tmp_path: Path) -> None:
    events: list[Event] = []
    questions = gate(tmp_path, Person(None), events).asker(3, "greet")
    assert questions.ask is not None
    assert questions.ask(QUESTION, 0.0) == ("cancel", {})
    assert events[-1] == ElicitationAnswered(call=3, tool="greet", action="cancel", by="timeout")


def test_an_approver_without_elicit_asks_nobody_but_hears_progress(tmp_path: Path) -> None:
    events: list[Event] = []

    def approver(request: ApprovalRequested, cancel: CancelToken, deadline: float) -> None:
        return None

    questions = gate(tmp_path, approver, events).asker(4, "steps")
    assert questions.ask is None  # the host answers by tools.elicitation
    assert questions.progress is not None
    questions.progress(wire.Progress(9, 2.0, 3.0, "step 2"))
    assert events == [ToolProgress(call=4, tool="steps", done=2.0, total=3.0, message="step 2")]
