"""The records of a session log, and their msgpack codec.

A record is a frozen dataclass. On disk it is a msgpack map: ``kind`` plus the fields by
their names (docs/log.md#encoding) (``class`` for :attr:`ToolResult.class_`), ``time`` as msgpack's
timestamp extension. Decoding checks every field's type, so a log written by a buggy or
foreign writer is refused with the kind and field named instead of being half-read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
from collections.abc import Mapping
from typing import Any, TypeAlias

import msgpack

from actors.base.errors import RecordError
from actors.log import server_values
from actors.tools.protocol.spec import ResultClass
from actors.wire.fieldchecks import Check, exact, member

__all__ = [
    "Approval",
    "ApprovalDecision",
    "ApprovalScope",
    "Assistant",
    "Baseline",
    "CacheLoss",
    "Compaction",
    "CompactionBy",
    "Record",
    "SlotState",
    "SlotUse",
    "ToolCall",
    "ToolResult",
    "Usage",
    "User",
    "check_slot_use",
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


@dataclasses.dataclass(frozen=True, slots=True)
class Usage:
    timings: Mapping[str, JSON]
    reasoning_tokens: int
    thinking_capped: bool
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    slot: SlotUse | None = None  # None in logs written before the slot keeper
    time: dt.datetime = dataclasses.field(default_factory=now)


@dataclasses.dataclass(frozen=True, slots=True)
class CacheLoss:
    expected: int
    got: int
    cause: str = ""  # why, as far as loopd knows ("" in logs written before the keeper)
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
    """

    summary: str
    kept: int
    tokens_before: int
    by: CompactionBy
    time: dt.datetime = dataclasses.field(default_factory=now)


Record: TypeAlias = (
    Baseline | User | Assistant | Usage | CacheLoss | ToolResult | Approval | Compaction
)

_KINDS: dict[type[Any], str] = {
    Baseline: "baseline",
    User: "user",
    Assistant: "assistant",
    Usage: "usage",
    CacheLoss: "cache_loss",
    ToolResult: "tool_result",
    Approval: "approval",
    Compaction: "compaction",
}
_BY_KIND = {kind: cls for cls, kind in _KINDS.items()}


# --- field checks ---------------------------------------------------------------------
# Each check returns the decoded Python value or raises TypeError with what was expected.

def _count(v: Any) -> int:
    """A non-negative integer (an index, a number of tokens)."""
    n: int = _INT(v)
    if n < 0:
        raise TypeError(f"expected a non-negative integer, got {n}")
    return n


def _optional(inner: Check) -> Check:
    return lambda v: None if v is None else inner(v)


def _time(v: Any) -> dt.datetime:
    if not isinstance(v, dt.datetime) or v.tzinfo is None:
        raise TypeError(f"expected a UTC timestamp, got {type(v).__name__}")
    return v


def _mapping(v: Any) -> Mapping[str, JSON]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise TypeError(f"expected a map with text keys, got {type(v).__name__}")
    return v


def _timings(v: Any) -> Mapping[str, JSON]:
    """A Usage's timings: its well-formed numbers (a bad value an older loopd logged is
    left out, so the session still runs)."""
    return server_values.timings(_mapping(v))


def _tools(v: Any) -> tuple[Mapping[str, JSON], ...]:
    if not isinstance(v, list):
        raise TypeError(f"expected a list of tool definitions, got {type(v).__name__}")
    return tuple(_mapping(t) for t in v)


def _tool_calls(v: Any) -> tuple[ToolCall, ...]:
    if not isinstance(v, list):
        raise TypeError(f"expected a list of tool calls, got {type(v).__name__}")
    calls = []
    for c in v:
        m = _mapping(c)
        try:
            calls.append(ToolCall(**{k: _STR(m[k]) for k in ("id", "name", "arguments")}))
        except KeyError as e:
            raise TypeError(f"tool call without {e.args[0]!r}") from None
    return tuple(calls)


_STR, _INT, _BOOL = exact(str), exact(int), exact(bool)
_result_class = member(ResultClass)
_slot_state = member(SlotState)
_decision = member(ApprovalDecision)
_scope = member(ApprovalScope)
_by = member(CompactionBy)
_NUMBER = exact(float, int)
_SLOT_USE: dict[str, Check] = {
    "server": _STR, "slot": _INT, "state": _slot_state, "restored": _INT,
    "restore_ms": lambda v: float(_NUMBER(v)), "reason": _STR,
}


def check_slot_use(v: Any) -> SlotUse:
    """A SlotUse from its map (the field check of ``Usage.slot``; the daemon protocol's too)."""
    m = _mapping(v)
    try:
        return SlotUse(**{k: check(m[k]) for k, check in _SLOT_USE.items()})
    except KeyError as e:
        raise TypeError(f"slot use without {e.args[0]!r}") from None

# wire name -> (attribute name, check)
_FIELDS: dict[str, dict[str, tuple[str, Check]]] = {
    "baseline": {
        "system": ("system", _STR),
        "tools": ("tools", _tools),
        "model": ("model", _STR),
        "created": ("created", _time),
    },
    "user": {"content": ("content", _STR)},
    "assistant": {
        "content": ("content", _optional(_STR)),
        "reasoning": ("reasoning", _optional(_STR)),
        "tool_calls": ("tool_calls", _tool_calls),
    },
    "usage": {
        "timings": ("timings", _timings),
        "reasoning_tokens": ("reasoning_tokens", _INT),
        "thinking_capped": ("thinking_capped", _BOOL),
        "prompt_tokens": ("prompt_tokens", _INT),
        "completion_tokens": ("completion_tokens", _INT),
        "finish_reason": ("finish_reason", _STR),
        "slot": ("slot", _optional(check_slot_use)),
    },
    "cache_loss": {"expected": ("expected", _INT), "got": ("got", _INT), "cause": ("cause", _STR)},
    "tool_result": {
        "call": ("call", _INT),
        "tool_call_id": ("tool_call_id", _STR),
        "content": ("content", _STR),
        "class": ("class_", _result_class),
        "untrusted": ("untrusted", _BOOL),
        "truncated": ("truncated", _BOOL),
    },
    "approval": {
        "call": ("call", _INT),
        "tool": ("tool", _STR),
        "decision": ("decision", _decision),
        "scope": ("scope", _scope),
        "by": ("by", _STR),
        "reason": ("reason", _STR),
        "rule": ("rule", _STR),
    },
    "compaction": {
        "summary": ("summary", _STR),
        "kept": ("kept", _count),
        "tokens_before": ("tokens_before", _count),
        "by": ("by", _by),
    },
}
for _fields in _FIELDS.values():
    _fields["time"] = ("time", _time)
# Fields added after logs were first written: a record without one decodes to its default.
_ADDED = {"usage": frozenset({"slot"}), "cache_loss": frozenset({"cause"})}


_LEAVES = frozenset({str, int, float, bool, type(None), bytes, dt.datetime})


def _plain(value: Any) -> Any:
    """Record values as msgpack-ready data (tuples become lists, dataclasses maps)."""
    kind = type(value)
    if kind in _LEAVES:  # most values: no ABC check (this runs for every appended record)
        return value
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, ToolCall):
        return {"id": value.id, "name": value.name, "arguments": value.arguments}
    if isinstance(value, SlotUse):
        return {k: _plain(getattr(value, k)) for k in _SLOT_USE}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def kind_of(record: Record) -> str:
    """The record's kind as written in the log (``user``, ``tool_result``...)."""
    return _KINDS[type(record)]


def encode(record: Record) -> bytes:
    """The msgpack payload of one record."""
    kind = _KINDS.get(type(record))
    if kind is None:
        raise RecordError(f"cannot encode {type(record).__name__}: not a log record")
    body: dict[str, Any] = {"kind": kind}
    for wire, (attr, check) in _FIELDS[kind].items():
        value = _plain(getattr(record, attr))
        try:
            check(value)
        except TypeError as e:
            raise RecordError(f"{kind}.{wire}: {e}") from None
        body[wire] = value
    try:
        return msgpack.packb(body, datetime=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as e:
        raise RecordError(f"{kind}: cannot encode: {e}") from None


def decode(payload: bytes) -> Record:
    """One record from its msgpack payload; RecordError names what is wrong."""
    try:
        body = msgpack.unpackb(payload, timestamp=3, strict_map_key=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise RecordError(f"not a msgpack record: {e}") from None
    if not isinstance(body, dict):
        raise RecordError(f"a record must be a map, got {type(body).__name__}")
    kind = body.get("kind")
    fields = _FIELDS.get(kind) if isinstance(kind, str) else None
    if fields is None:
        raise RecordError(f"unknown record kind {kind!r}; known: {', '.join(_BY_KIND)}")
    unknown = set(body) - set(fields) - {"kind"}
    if unknown:
        raise RecordError(f"{kind}: unknown field(s) {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    added = _ADDED.get(str(kind), frozenset())
    for wire, (attr, check) in fields.items():
        if wire not in body:
            if wire in added:
                continue  # an older log: the field's default
            raise RecordError(f"{kind}.{wire}: missing")
        try:
            values[attr] = check(body[wire])
        except TypeError as e:
            raise RecordError(f"{kind}.{wire}: {e}") from None
    record: Record = _BY_KIND[str(kind)](**values)
    return record


def to_json(record: Record) -> dict[str, Any]:
    """A JSON-ready map of a record, as in the log (``kind``, fields; times in ISO 8601)."""
    out: dict[str, Any] = {"kind": kind_of(record)}
    for wire, (attr, _) in _FIELDS[out["kind"]].items():
        value = _plain(getattr(record, attr))
        out[wire] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out
