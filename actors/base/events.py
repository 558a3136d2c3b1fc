"""Events a turn emits to its sink while it runs: what the person sees live.

Chat events come from the inference actor (docs/inference.md#events), turn events from the
session actor (docs/turn.md#step-by-step). All are frozen dataclasses, so they can cross
threads safely, and :func:`to_json` gives the ``--json`` line of any of them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, Protocol, TypeAlias

from actors.base.cancel import CancelToken

__all__ = [
    "NO_APPROVER",
    "AgentDone",
    "AgentEvent",
    "AgentStarted",
    "AnswerCut",
    "ApprovalDecided",
    "ApprovalRequested",
    "Approver",
    "CacheLossEvent",
    "ChatEvent",
    "Choice",
    "Compacted",
    "Compacting",
    "Content",
    "Decision",
    "ElicitationAnswered",
    "ElicitationRequested",
    "Elicited",
    "Elicitor",
    "Event",
    "Progress",
    "Queued",
    "Reasoning",
    "Retrying",
    "Sink",
    "ThinkingCapped",
    "ToolCallDelta",
    "ToolCallStarted",
    "ToolProgress",
    "ToolResultEvent",
    "TornTail",
    "TurnEvent",
    "Used",
    "Waiting",
    "event_name",
    "to_json",
]

@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """The request waits behind other sessions: for a free slot (all are leased) or an idle
    inference actor. ``sessions``: the ones it waits on ("b, c"). A session never queues
    behind itself (the save of its own state after a turn is waited for silently)."""

    ahead: int = 1
    waiting_for: str = "an inference actor"  # or "a free slot"
    sessions: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """Sent; nothing back yet."""


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """Prompt processing: ``processed`` of ``total`` tokens (the ``cache`` reused included);
    ``time_ms`` since the server started on this prompt (0: not said)."""

    processed: int
    total: int
    cache: int
    time_ms: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class Reasoning:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Content:
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclasses.dataclass(frozen=True, slots=True)
class ThinkingCapped:
    tokens: int
    cap: int


@dataclasses.dataclass(frozen=True, slots=True)
class AnswerCut:
    """loopd stopped the response's answer (or its reasoning) before the server ended it
    and kept what came: ``why`` "repeat", "copy" or "echo" (the runaway-text limit), "timeout" or
    "error" (the request ended: what streamed is the answer, cut); ``note`` says it for the
    person; ``tokens``: the pieces the server had sent."""

    why: str
    note: str
    tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class Retrying:
    attempt: int
    delay: float
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallStarted:
    name: str
    call: int
    arguments: str


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResultEvent:
    name: str
    call: int
    class_: str
    truncated: bool
    outcome: str  # result | failed | denied | local | repeat | invalid
    content: str = ""  # the result as the log keeps it (an editor shows it: loopd acp)


@dataclasses.dataclass(frozen=True, slots=True)
class Used:
    """A model request answered and logged (its Usage record): the tokens of its prompt
    (``cached`` of them reused from the slot, ``processed`` by the server: its ``cache_n``
    and ``prompt_n``, 0 when not said) and of its response. An editor shows the context
    used from it (loopd acp's ``usage_update``)."""

    prompt_tokens: int
    completion_tokens: int
    processed: int = 0
    cached: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class CacheLossEvent:
    expected: int
    got: int
    cause: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Compacting:
    """The conversation is being compacted (docs/rendering.md#compaction): ``why`` auto (the
    next request would pass session.compact_at), person (asked for) or overflow (the server
    said the prompt exceeds its context); ``tokens_before`` the prompt's size then; ``how``
    summary (the model writes it) or elide (no model call)."""

    why: str
    tokens_before: int
    how: str


@dataclasses.dataclass(frozen=True, slots=True)
class Compacted:
    """The Compaction record is in the log: the next request sends the summary and the last
    ``turns_kept`` turns, about ``tokens_after`` tokens (the baseline's included); ``ms``
    the compaction took (the summary request included). ``processed`` and ``generated``:
    the summary request's prompt tokens the server processed (its ``prompt_n``) and the
    tokens it wrote (0 when no model wrote the summary: elide)."""

    why: str
    tokens_before: int
    tokens_after: int
    turns_kept: int
    ms: float
    processed: int = 0
    generated: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class ApprovalRequested:
    """Call ``call`` waits for the person: whoever drives the turn answers (actors.approval.gate).

    ``arguments`` is the tool's arguments as JSON text; ``rule`` what an "allow for this
    session" or "always" answer would grant ("" when only once or deny can be chosen, e.g. a
    command with shell operators); ``timeout_s`` how long the turn waits (0: no limit).
    """

    call: int
    tool: str
    arguments: str
    prompt: str
    rule: str = ""
    timeout_s: float = 0.0
    child: str = ""  # the child agent session whose call it is ("": the turn's own): call
    # numbers are per session, so an editor needs both (ACP's id ``CHILD:N``)


@dataclasses.dataclass(frozen=True, slots=True)
class ApprovalDecided:
    """What was decided for a call that needed approval (as its Approval record says)."""

    call: int
    tool: str
    decision: str  # allow | deny
    scope: str  # once | session | always
    by: str  # person | rule | session | timeout | cancel | what the approver said
    reason: str = ""
    rule: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ElicitationRequested:
    """Call ``call`` (of ``tool``) asks the person something mid-call: MCP server ``server``
    says ``message`` and wants a form filled. ``fields`` is the form's JSON schema as text
    (each property's ``default`` is what Enter keeps); ``timeout_s`` how long it waits (0:
    as long as the call's limit)."""

    call: int
    tool: str
    server: str
    message: str
    fields: str
    timeout_s: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class ToolProgress:
    """Call ``call`` (of ``tool``) is ``done`` of ``total`` (0: unknown) while it runs: an MCP
    server's progress notification; ``message`` what it is at ("" when it says nothing)."""

    call: int
    tool: str
    done: float
    total: float = 0.0
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ElicitationAnswered:
    """What went back to the server: ``accept`` (the form's values), ``decline`` or
    ``cancel``; ``by`` who gave it (``person``, ``timeout``, ``cancel``)."""

    call: int
    tool: str
    action: str
    by: str = "person"


@dataclasses.dataclass(frozen=True, slots=True)
class TornTail:
    """Opening the session cut a torn last record (a write a crash interrupted)."""

    session: str
    cut_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class AgentStarted:
    """The turn handed ``task`` to a child session ``agent`` (docs/agents.md); ``context``
    fresh (the baseline and the task) or fork (the parent's conversation so far)."""

    agent: str
    task: str
    context: str


@dataclasses.dataclass(frozen=True, slots=True)
class AgentDone:
    """Child ``agent`` ended: ``ok`` with its answer, else ``reason`` says why; ``tokens``
    it generated, ``seconds`` it ran."""

    agent: str
    ok: bool
    tokens: int
    seconds: float
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class AgentEvent:
    """An event of child session ``agent``, passed on by its parent's turn: ``--json`` and
    the daemon show it as the event itself with an ``agent`` field."""

    agent: str
    event: Event


ChatEvent: TypeAlias = (
    Queued | Waiting | Progress | Reasoning | Content | ToolCallDelta | ThinkingCapped | Retrying
    | AnswerCut
)
TurnEvent: TypeAlias = (
    ToolCallStarted | ToolResultEvent | CacheLossEvent | ApprovalRequested | ApprovalDecided
    | ElicitationRequested | ElicitationAnswered | ToolProgress | Compacting | Compacted | Used
    | AgentStarted | AgentDone
)
Event: TypeAlias = ChatEvent | TurnEvent | TornTail | AgentEvent
Sink: TypeAlias = Callable[[Event], None]

_NAMES = {
    ToolResultEvent: "tool_result",
    CacheLossEvent: "cache_loss",
    ToolCallStarted: "tool_call_started",
    ToolCallDelta: "tool_call_delta",
    ThinkingCapped: "thinking_capped",
    AnswerCut: "answer_cut",
    ApprovalRequested: "approval_requested",
    ApprovalDecided: "approval_decided",
    ElicitationRequested: "elicitation_requested",
    ElicitationAnswered: "elicitation_answered",
    ToolProgress: "tool_progress",
    TornTail: "torn_tail",
    AgentStarted: "agent_started",
    AgentDone: "agent_done",
}


def event_name(event: Event) -> str:
    """The snake_case name of an event, as in ``--json`` output."""
    if isinstance(event, AgentEvent):  # a child's event goes by its own name
        return event_name(event.event)
    cls = type(event)
    return _NAMES.get(cls) or cls.__name__.lower()


def to_json(event: Event) -> dict[str, Any]:
    """A JSON-ready map: ``{"event": name, ...fields}`` (``class_`` becomes ``class``)."""
    if isinstance(event, AgentEvent):
        return {**to_json(event.event), "agent": event.agent}
    out: dict[str, Any] = {"event": event_name(event)}
    for f in dataclasses.fields(event):
        out[f.name.rstrip("_")] = getattr(event, f.name)
    return out


# --- what whoever drives a turn answers: approval decisions (the gate: actors.approval.gate)

NO_APPROVER = "nobody can answer approvals here: allow it with a rule (tools.allow)"


class Choice(enum.StrEnum):
    ONCE = "once"
    SESSION = "session"
    ALWAYS = "always"  # allow, and save the rule (the rules file's allow list)
    DENY = "deny"
    NEVER = "never"  # deny, and save the rule as a deny rule (the rules file's deny list)


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """An approver's answer; ``by`` says who gave it (``person``, or e.g. ``no terminal``)."""

    choice: Choice
    reason: str = ""
    by: str = "person"


class Approver(Protocol):
    def __call__(
        self, request: ApprovalRequested, cancel: CancelToken, deadline: float
    ) -> Decision | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Elicited:
    """The person's answer to an :class:`ElicitationRequested`: ``action`` accept (with
    ``content``, the form's values by field), decline or cancel."""

    action: str
    content: dict[str, Any] = dataclasses.field(default_factory=dict)


class Elicitor(Protocol):
    """An approver that can also ask the person a server's question (an optional
    ``elicit`` method beside ``__call__``): the answer by ``deadline`` (a monotonic time),
    None when none came (the deadline, ``cancel``)."""

    def elicit(
        self, request: ElicitationRequested, cancel: CancelToken, deadline: float
    ) -> Elicited | None: ...
