"""The record codec: every field round-trips; bad payloads are refused naming kind and field."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

import msgpack
import pytest
from hypothesis import given

from actors.base.errors import RecordError
from actors.log.records import (
    Approval,
    ApprovalDecision,
    ApprovalScope,
    Assistant,
    Baseline,
    CacheLoss,
    Cut,
    Record,
    SlotState,
    SlotUse,
    ToolCall,
    ToolResult,
    Usage,
    User,
    decode,
    encode,
    to_json,
)
from actors.tools.protocol.spec import ResultClass
from tests.strategies import records

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)

SAMPLES: dict[str, Record] = {
    "baseline": Baseline(
        system="s", tools=({"type": "function"},), model="m", created=T0, time=T0
    ),
    "user": User(content="u", time=T0),
    "assistant": Assistant(
        content="a", reasoning="r", tool_calls=(ToolCall(id="1", name="n", arguments="{}"),),
        time=T0,
    ),
    "usage": Usage(
        timings={"cache_n": 1}, reasoning_tokens=1, thinking_capped=True, prompt_tokens=2,
        completion_tokens=3, finish_reason="stop",
        slot=SlotUse("http://127.0.0.1:8080", 1, SlotState.RESTORED, 4646, 20.5, ""), time=T0,
    ),
    "cache_loss": CacheLoss(expected=4, got=1, cause="no saved state", time=T0),
    "cut": Cut(why="repeat", note="answer cut: its last 256 tokens repeat", time=T0),
    "tool_result": ToolResult(
        call=1, tool_call_id="1", content="c", class_=ResultClass.INTERNAL, untrusted=True,
        truncated=False, time=T0,
    ),
    "approval": Approval(
        call=2, tool="run_command", decision=ApprovalDecision.ALLOW, scope=ApprovalScope.SESSION,
        by="person", reason="", rule="run_command: git status", time=T0,
    ),
}

# A value of the wrong type for every field, by wire name (several where a near miss matters).
WRONG: dict[str, list[Any]] = {
    "system": [1, None], "model": [b"m"], "content": [1], "tool_call_id": [2],
    "finish_reason": [None], "reasoning": [3],
    "tools": [{"a": 1}, ["not a map"]],
    "created": ["2025-01-01", 5], "time": ["2025-01-01", 1.5],
    "tool_calls": [
        {}, ["x"], [{"id": "1", "name": "n"}], [{"id": 1, "name": "n", "arguments": ""}]
    ],
    "timings": [[1]],
    "reasoning_tokens": ["1", True, 1.0], "prompt_tokens": [True], "completion_tokens": [None],
    "expected": ["4"], "got": [False], "call": ["1", True],
    "thinking_capped": [1, "true"], "untrusted": [0], "truncated": [None],
    "class": ["top", 1],
    "slot": [1, {"server": "x"}, {"server": "x", "slot": 0, "state": "lost", "restored": 0,
                                  "restore_ms": 0.0, "reason": ""}],
    "cause": [None, 1],
    "tool": [None, 1], "decision": ["maybe", True], "scope": ["forever", None], "by": [0],
    "rule": [None], "reason": [None, 5], "why": [None, 3], "note": [b"n"],
}


def wire(record: Record) -> dict[str, Any]:
    body = msgpack.unpackb(encode(record), timestamp=3)
    assert isinstance(body, dict)
    return body


@given(records)
def test_round_trip_keeps_every_field(record: Record) -> None:
    back = decode(encode(record))
    assert type(back) is type(record)
    assert back == record
    for field in dataclasses.fields(record):
        assert getattr(back, field.name) == getattr(record, field.name), field.name
    assert back.time.utcoffset() == dt.timedelta(0)


@given(records)
def test_to_json_is_json(record: Record) -> None:
    data = to_json(record)
    assert data["kind"] == wire(record)["kind"]
    json.dumps(data)


def test_wire_names_are_the_designs() -> None:
    assert set(wire(SAMPLES["tool_result"])) == {
        "kind", "call", "tool_call_id", "content", "class", "untrusted", "truncated", "time"
    }
    assert wire(SAMPLES["tool_result"])["class"] == "internal"
    assert {k: wire(r)["kind"] for k, r in SAMPLES.items()} == {k: k for k in SAMPLES}
    # time is msgpack's timestamp extension (type -1)
    raw = msgpack.unpackb(encode(SAMPLES["user"]), timestamp=0)
    assert isinstance(raw["time"], msgpack.Timestamp)


def bad_cases() -> list[tuple[str, str, Any]]:
    return [("user", "content", None), ("tool_result", "content", None)] + [
        (kind, field, value)
        for kind, record in SAMPLES.items()
        for field in wire(record)
        if field != "kind"
        for value in WRONG[field]
    ]


@pytest.mark.parametrize(("kind", "field", "value"), bad_cases())
def test_wrong_field_type_is_refused_naming_kind_and_field(
    kind: str, field: str, value: Any
) -> None:
    body = {**wire(SAMPLES[kind]), field: value}
    with pytest.raises(RecordError, match=rf"^{kind}\.{field}: "):
        decode(msgpack.packb(body, datetime=True))


def test_a_record_from_before_the_slot_keeper_decodes_with_the_new_fields_defaulted() -> None:
    usage, loss = wire(SAMPLES["usage"]), wire(SAMPLES["cache_loss"])
    del usage["slot"], loss["cause"]  # the fields as logs written before these fields lack them
    assert decode(msgpack.packb(usage, datetime=True)) == dataclasses.replace(
        SAMPLES["usage"], slot=None)
    assert decode(msgpack.packb(loss, datetime=True)) == dataclasses.replace(
        SAMPLES["cache_loss"], cause="")


@pytest.mark.parametrize("kind", SAMPLES)
def test_missing_and_unknown_fields_are_refused(kind: str) -> None:
    body = wire(SAMPLES[kind])
    field = next(k for k in body if k != "kind")
    del body[field]
    with pytest.raises(RecordError, match=rf"^{kind}\.{field}: missing"):
        decode(msgpack.packb(body, datetime=True))
    extra = {**wire(SAMPLES[kind]), "colour": "red"}
    with pytest.raises(RecordError, match=rf"^{kind}: unknown field\(s\) colour"):
        decode(msgpack.packb(extra, datetime=True))


@pytest.mark.parametrize("kind", ["alien", 3, None, "Baseline"])
def test_unknown_kind_is_refused(kind: Any) -> None:
    with pytest.raises(RecordError, match=rf"unknown record kind {kind!r}; known: baseline, user"):
        decode(msgpack.packb({"kind": kind, "time": T0}, datetime=True))


@pytest.mark.parametrize("payload", [b"", b"\xc1", b"\x93\x01\x02\x03", msgpack.packb("text")])
def test_not_a_record_is_refused(payload: bytes) -> None:
    with pytest.raises(RecordError, match=r"not a msgpack record|must be a map"):
        decode(payload)


def test_encode_refuses_wrong_types_naming_kind_and_field() -> None:
    with pytest.raises(RecordError, match=r"^usage\.prompt_tokens: expected int, got bool"):
        encode(dataclasses.replace(SAMPLES["usage"], prompt_tokens=True))  # type: ignore[arg-type]
    naive = dt.datetime(2025, 1, 1)
    base = SAMPLES["baseline"]
    assert isinstance(base, Baseline)
    with pytest.raises(RecordError, match=r"^baseline\.created: expected a UTC timestamp"):
        encode(dataclasses.replace(base, created=naive))
    with pytest.raises(RecordError, match=r"^tool_result\.class: expected one of public"):
        encode(dataclasses.replace(SAMPLES["tool_result"], class_="top"))  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="cannot encode ToolCall: not a log record"):
        encode(ToolCall(id="1", name="n", arguments=""))  # type: ignore[arg-type]


def test_records_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        User(content="u").content = "changed"  # type: ignore[misc]
