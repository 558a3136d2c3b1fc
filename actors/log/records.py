"""The records of a session log, and their msgpack encoding.

A record is a frozen dataclass. On disk it is a msgpack map: ``kind`` plus the fields by
their names (docs/log.md#encoding) (``class`` for :attr:`ToolResult.class_`), ``time`` as
msgpack's timestamp extension. The codec (:mod:`actors.wire.codec`) reads the kinds, fields
and checks from the dataclasses below. Decoding checks every field's type, so a log written
by a buggy or foreign writer is refused with the kind and field named instead of being
half-read.

Fields added after logs were first written (a log without them reads as the default):

- ``usage.slot`` (nil) and ``cache_loss.cause`` (""): with the slot keeper (f41d248).
- ``rewind.refused`` (""): a turn refused for a full context is taken back.
- ``compaction.outside`` (false): a summary made from text from outside keeps its mark.
- ``compaction.tokens_after`` (0: not known): the prompt's size after it, about, so the
  session's size is known before its next request (``loopd sessions``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import typing
from collections.abc import Mapping
from typing import Any, TypeAlias

from actors.base.errors import RecordError, WireError
from actors.log import server_values
from actors.tools.protocol.spec import ResultClass
from actors.wire.codec import CHECK, Codec, Natural, added

__all__ = [
    "CODEC",
    "MAX_RECORD",
    "AgentLink",
    "Approval",
    "ApprovalDecision",
    "ApprovalScope",
    "Assistant",
    "Baseline",
    "CacheLoss",
    "Compaction",
    "CompactionBy",
    "Cut",
    "Forked",
    "Record",
    "Rewind",
    "SlotState",
    "SlotUse",
    "ToolCall",
    "ToolResult",
    "Usage",
    "User",
    "decode",
    "encode",
    "kind_of",
    "now",
    "to_json",
]

JSON: TypeAlias = Any


def now() -> dt.datetime:
    """The current UTC time, the value every record's ``time`` defaults to."""
    return dt.datetime.now(dt.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the model's raw JSON text, kept as sent

    @property
    def tool(self) -> str:
        """The tool the call runs: call_tool's inner name when it has one."""
        if self.name != "call_tool":
            return self.name
        try:
            inner = json.loads(self.arguments).get("name")
        except (ValueError, AttributeError):
            return self.name
        return inner if isinstance(inner, str) and inner else self.name


class SlotState(enum.StrEnum):
    """What the slot keeper found for a request: the session's KV state was..."""

    KEPT = "kept"  # still in the slot from its last request
    RESTORED = "restored"  # loaded from the session's file into the slot
    NONE = "none"  # not there, and not restored (``SlotUse.reason`` says why)


@dataclasses.dataclass(frozen=True, slots=True)
class SlotUse:
    """What the slot keeper did for one request (part of its Usage record)."""

    server: str  # the server's URL
    slot: int
    state: SlotState
    restored: int = 0  # tokens restored from the session's file
    restore_ms: float = 0.0
    reason: str = ""  # why nothing was restored, or what else the keeper noticed


@dataclasses.dataclass(frozen=True, slots=True)
class Baseline:
    system: str
    tools: tuple[Mapping[str, JSON], ...]
    model: str
    created: dt.datetime
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class User:
    content: str
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class Assistant:
    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    time: dt.datetime = dataclasses.field(default_factory=now)


def _timings(v: Any) -> Mapping[str, JSON]:
    """A Usage's timings: its well-formed numbers (a bad value an older loopd logged is
    left out, so the session still runs)."""
    if type(v) is not dict:
        raise TypeError(f"expected a map, got {type(v).__name__}")
    return v if server_values.all_kept(v) else server_values.timings(v)


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    timings: Mapping[str, JSON] = dataclasses.field(metadata={CHECK: _timings})
    reasoning_tokens: int
    thinking_capped: bool
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    slot: SlotUse | None = added(None, "the slot keeper (f41d248)")
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class CacheLoss:
    expected: int
    got: int
    cause: str = added("", "the slot keeper (f41d248)")  # why, as far as loopd knows
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class Cut:
    """loopd cut the response logged just before (in the same write): ``why`` "repeat",
    "copy" or "echo" (the runaway-text limit: the answer, or the reasoning asked again with thinking
    off), "timeout" or "error" (the request ended after the answer began: what streamed is
    the answer); ``note`` says it for the person. Renders to nothing."""

    why: str
    note: str
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolResult:
    call: int
    tool_call_id: str
    content: str
    class_: ResultClass
    untrusted: bool
    truncated: bool
    time: dt.datetime = dataclasses.field(default_factory=now)


class ApprovalDecision(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"


class ApprovalScope(enum.StrEnum):
    """How far an allow reaches: this call, the rest of the session, or every session."""

    ONCE = "once"
    SESSION = "session"
    ALWAYS = "always"


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    """The decision on a call that needed approval, written before the call's ToolResult.

    ``by``: ``person``, ``rule`` (``rule`` names it), ``session`` (an earlier "for this
    session" answer, named in ``rule``), ``timeout``, ``cancel``, or what the approver said
    (e.g. ``no terminal``). ``rule``: for a person's "session" or "always" answer, the rule
    it granted. Renders to nothing: the model reads only the ToolResult.
    """

    call: int
    tool: str
    decision: ApprovalDecision
    scope: ApprovalScope
    by: str
    reason: str = ""
    rule: str = ""
    time: dt.datetime = dataclasses.field(default_factory=now)


class CompactionBy(enum.StrEnum):
    """Why a compaction happened."""

    AUTO = "auto"  # the next request would have passed session.compact_at of the context
    PERSON = "person"  # asked for: `loopd compact`, /compact in chat, the daemon protocol
    OVERFLOW = "overflow"  # the server answered that the prompt exceeds its context


@dataclasses.dataclass(frozen=True, slots=True)
class Compaction:
    """From here on the conversation is rendered from ``summary`` and the records from
    index ``kept`` on (actors/session/messages.py); nothing before it is deleted.

    ``kept``: the index (0 being the Baseline) of the first record still sent verbatim;
    ``tokens_before``: the prompt's size, in tokens, that made the compaction necessary
    (loopd's estimate, or the server's count when it answered that the context was full).
    ``outside``: the summary was made from text from outside (an untrusted tool result, or
    an earlier summary that was): its frame tells the model so. ``tokens_after``: loopd's
    estimate of the prompt after it (0 in older logs).
    """

    summary: str
    kept: Natural
    tokens_before: Natural
    by: CompactionBy
    outside: bool = added(False, "a summary made from outside text keeps its mark")
    tokens_after: Natural = added(0, "the size after a compaction, before the next request")
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class Forked:
    """This session was forked from session ``from_`` (``from`` in the log) after its turn
    ``at``: the records before this one are a copy of that session's, byte for byte.
    Renders to nothing (docs/rendering.md#fork-and-rewind)."""

    from_: str
    at: Natural  # the source's turns copied (turn N: its N-th User record)
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class Rewind:
    """From here on the conversation is rendered as it was when turn ``to_turn + 1`` was
    asked: the turns after ``to_turn`` are skipped (actors/session/messages.py); they stay
    in the log. ``to_turn`` counts User records in the log (0: back to the Baseline).

    ``refused``: why loopd took the turn back itself (the server refused its prompt as
    larger than the context, in the server's numbers); "" when the person did."""

    to_turn: Natural
    refused: str = added("", "a turn refused for a full context is taken back")
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class AgentLink:
    """Session ``parent``'s turn handed ``task`` to child session ``child`` (the ``agent``
    tool, docs/agents.md): the same record is in both logs, the parent's before the call's
    result, the child's before its first turn. ``context``: fresh or fork. Renders to
    nothing."""

    parent: str
    child: str
    task: str
    context: str
    time: dt.datetime = dataclasses.field(default_factory=now)


Record: TypeAlias = (
    Baseline | User | Assistant | Usage | CacheLoss | ToolResult | Approval | Compaction
    | Forked | Rewind | Cut | AgentLink
)
"""Every kind of record the log holds; adding one here (and its dataclass above) is all the
codec needs."""

MAX_RECORD = 64 * 1024 * 1024  # a larger frame is never allocated: torn or corrupt

CODEC = Codec(
    "log", typing.get_args(Record), version=None, noun="record", timestamps=True,
    max_frame=MAX_RECORD,
)  # fmt: skip


def kind_of(record: Record) -> str:
    """The record's kind as written in the log (``user``, ``tool_result``...)."""
    return CODEC.kind_of(record)


def encode(record: Record) -> bytes:
    """The msgpack payload of one record."""
    try:
        return CODEC.encode(record)
    except WireError as e:
        raise RecordError(str(e)) from None


def decode(payload: bytes) -> Record:
    """One record from its msgpack payload; RecordError names what is wrong."""
    try:
        record: Record = CODEC.decode(payload)
    except WireError as e:
        raise RecordError(str(e)) from None
    return record


def to_json(record: Record) -> dict[str, Any]:
    """A JSON-ready map of a record, as in the log (``kind``, fields; times in ISO 8601)."""
    try:
        body = CODEC.to_map(record)
    except WireError as e:
        raise RecordError(str(e)) from None
    return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in body.items()}
