"""The client protocol's codec: every kind round-trips, and every kind of bad input is refused."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import msgpack
import pytest

from actors.base import errors
from actors.base import events as ev
from actors.base.errors import WireError
from actors.base.events import Choice
from actors.daemon import protocol as p
from actors.daemon.client import remote_error
from actors.log.records import SlotState, SlotUse, Usage
from actors.log.records import encode as encode_record
from actors.service.types import McpServer

LIMIT = 1 << 20
USAGE = encode_record(Usage(
    timings={"cache_n": 3}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=10,
    completion_tokens=2, finish_reason="stop",
))  # fmt: skip
SAMPLES: list[Any] = [
    p.Ping(), p.Pong(), p.Bye(), p.Open(1, "s", True), p.Opened(2, "s", False, 7, 0),
    p.Close(3, "s"), p.Ok(4), p.Turn(5, "s", "hi"), p.Cancel(5),
    p.Approve(5, 2, Choice.ONCE, "fine", "person"), p.Sessions(6), p.SessionList(6, ("a", "b")),
    p.ReadLog(7, "s", 3), p.Log(7, (b"\x81\xa1a\x01",), 4, True), p.Status(8),
    p.StatusReply(8, 123, "ipc:///x", 1.5, 2, ({"name": "s", "busy": True},)), p.Stop(9),
    p.EventMessage(5, "content", {"text": "x"}),
    p.Done(5, "answer", 1, 1, False, USAGE, SlotUse("u", 0, SlotState.RESTORED, 10, 2.0, "")),
    p.Done(5, "answer", 0, 0, True, USAGE, None),
    p.Error(5, "Cancelled", "Cancelled.", 130),
    p.Approval(5, 2, "run_command", "{}", "ok?", "run_command: ls", 300.0),
    p.Fork(10, "a", "b", None), p.Fork(10, "a", "b", 2), p.ForkReply(10, "b", "a", 2, 5, 4646),
    p.Rewind(11, "s", 1), p.Rewound(11, "s", 1, (2, 3), (1,)),
    p.Compact(12, "s"), p.CompactReply(12, "s", 900, 300, 2, 41.5), p.Remove(13, "s"),
    p.SessionStatus(14, "s"), p.SessionState(14, "s", 5, 2, True, False, "/w"),
]  # fmt: skip


def test_every_kind_has_a_sample() -> None:
    assert {type(m) for m in SAMPLES} == set(p.CODEC.kinds)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips(msg: Any) -> None:
    assert p.decode(p.encode(msg), LIMIT) == msg


def _body(msg: Any) -> dict[str, Any]:
    body: dict[str, Any] = msgpack.unpackb(p.encode(msg))
    return body


@pytest.mark.parametrize(
    ("change", "text"),
    [
        ({"v": 2}, "version 2 is not supported"),
        ({"kind": "nope"}, "unknown message kind 'nope'"),
        ({"extra": 1}, "turn: unknown field(s) extra"),
        ({"id": -1}, "turn.id: expected a non-negative integer id"),
        ({"id": True}, "turn.id"),
        ({"text": b"bytes"}, "turn.text: expected str, got bytes"),
    ],
)
def test_bad_fields_are_refused_with_what_is_wrong(change: dict[str, Any], text: str) -> None:
    body = {**_body(p.Turn(5, "s", "hi")), **change}
    with pytest.raises(WireError, match=text.replace("(", r"\(").replace(")", r"\)")) as caught:
        p.decode(msgpack.packb(body), LIMIT)
    if "id" not in change:
        assert caught.value.id == 5  # the peer can be told which request failed


def test_a_missing_field_and_an_oversized_frame_are_refused() -> None:
    body = _body(p.Turn(5, "s", "hi"))
    del body["text"]
    with pytest.raises(WireError, match=r"turn\.text: missing"):
        p.decode(msgpack.packb(body), LIMIT)
    with pytest.raises(WireError, match="over the limit of 10 bytes"):
        p.decode(p.encode(p.Turn(5, "s", "hi")), 10)


def _event_samples() -> list[ev.Event]:
    values = {"str": "x", "int": 3, "bool": True, "float": 0.5, "str | None": None}
    out = []
    for cls in typing.get_args(ev.Event):
        if cls is ev.AgentEvent:  # a child's event: the event itself and its agent
            out += [ev.AgentEvent("s.a1", ev.Content("x")),
                    ev.AgentEvent("s.a1", ev.ToolCallStarted("read_file", 2, "{}"))]
            continue
        out.append(cls(**{f.name: values[str(f.type)] for f in dataclasses.fields(cls)}))
    return out


@pytest.mark.parametrize("event", _event_samples(), ids=lambda e: type(e).__name__)
def test_every_event_crosses_the_wire_as_its_json(event: ev.Event) -> None:
    msg = p.encode_event(9, event)
    assert msg.event == ev.event_name(event)
    again = p.decode(p.encode(msg), LIMIT)
    assert p.decode_event(again) == event


def test_a_bad_event_is_refused() -> None:
    with pytest.raises(WireError, match="unknown event 'boom'"):
        p.decode_event(p.EventMessage(1, "boom", {}))
    with pytest.raises(WireError, match="event content: fields must be exactly text"):
        p.decode_event(p.EventMessage(1, "content", {"text": "a", "more": 1}))
    with pytest.raises(WireError, match="event content: expected str, got int"):
        p.decode_event(p.EventMessage(1, "content", {"text": 1}))


@pytest.mark.parametrize(
    ("name", "code"), [("SessionInUse", 5), ("Cancelled", 130), ("TurnLimit", 3),
                       ("InferError", 4), ("SomethingNew", 2)],
)  # fmt: skip
def test_an_error_answer_becomes_the_loopd_error_of_its_name(name: str, code: int) -> None:
    error = remote_error(p.Error(1, name, "what happened", code))
    assert type(error).__name__ == name and str(error) == "what happened"
    assert error.exit_code == code and isinstance(error, errors.LoopdError)
    if hasattr(errors, name):
        assert type(error) is getattr(errors, name)


# Frames written by loopd at ee2b571, before the one codec, from these messages (in order):
# today's encoding must be the same bytes, and reading them the same messages.
OLD_FRAMES = Path(__file__).parent / "fixtures" / "frames-before-one-codec.msgpack"
OLD_MESSAGES: list[Any] = [
    p.Ping(), p.Pong(), p.Bye(), p.Open(1, "s", True), p.Opened(2, "s", False, 7, 0),
    p.Close(3, "s"), p.Ok(4), p.Turn(5, "s", "hi", ("read_file", "run_command: ls")),
    p.Cancel(5), p.Approve(5, 2, Choice.ONCE, "fine", "person"), p.Sessions(6),
    p.SessionList(6, ("a", "b")), p.ReadLog(7, "s", 3), p.Log(7, (b"\x81\xa1a\x01",), 4, True),
    p.Status(8), p.StatusReply(8, 123, "ipc:///x", 1.5, 2, ({"name": "s", "busy": True},)),
    p.Stop(9), p.EventMessage(5, "content", {"text": "x"}),
    p.Done(5, "answer", 1, 1, False, b"usage", SlotUse("u", 0, SlotState.RESTORED, 10, 2.0, "")),
    p.Done(5, "answer", 0, 0, True, b"", None), p.Error(5, "Cancelled", "Cancelled.", 130),
    p.Approval(5, 2, "run_command", "{}", "ok?", "run_command: ls", 300.0),
]  # fmt: skip


# Fields added to version 1 after those frames were written: today's encoding has them too.
ADDED_SINCE = {"status_reply": {"workspace": "", "model": ""},
               "opened": {"context": 0, "servers": [], "tools": [], "notes": []},
               "open": {"servers": []},
               "done": {"context": 0, "compactions": 0},
               "turn": {"traceparent": "", "batch": False}, "approval": {"child": ""}}


def test_frames_from_before_the_one_codec_are_read_and_written_the_same() -> None:
    frames = msgpack.unpackb(OLD_FRAMES.read_bytes())
    assert len(frames) == len(OLD_MESSAGES)
    for frame, msg in zip(frames, OLD_MESSAGES, strict=True):
        assert p.decode(frame, LIMIT) == msg
        kind = p.CODEC.kind_of(msg)
        if kind in ADDED_SINCE:
            old = msgpack.unpackb(frame)
            assert msgpack.unpackb(p.encode(msg)) == {**old, **ADDED_SINCE[kind]}
        else:
            assert p.encode(msg) == frame, kind


@pytest.mark.parametrize(
    ("msg", "field", "default"),
    [
        (p.Opened(2, "s", False, 7, 5), "cut_bytes", 0),
        (p.Turn(5, "s", "hi", ("x",)), "approve", ()),
        (p.Turn(5, "s", "hi", (), "", True), "batch", False),
        (p.StatusReply(8, 1, "ipc:///x", 1.0, 0, (), "/ws"), "workspace", ""),
        (p.StatusReply(8, 1, "ipc:///x", 1.0, 0, (), "/ws", "m at u"), "model", ""),
        (p.Opened(2, "s", False, 7, 0, 8192), "context", 0),
        (p.Done(5, "answer", 0, 0, False, b"", None, 8192), "context", 0),
        (p.Done(5, "answer", 0, 0, False, b"", None, 8192, 2), "compactions", 0),
        (p.Open(3, "s", True, (McpServer("probe", ("probe-server",), ("A=b",)),)), "servers",
         ()),
        (p.Opened(2, "s", True, 0, 0, 0, ("probe",), ("echo",), ("a note",)), "servers", ()),
        (p.Opened(2, "s", True, 0, 0, 0, ("probe",), ("echo",), ("a note",)), "notes", ()),
        (p.Approval(5, 2, "write_file", "{}", "ok?", "", 0.0, "s.a1"), "child", ""),
    ],
)
def test_a_field_added_later_reads_as_its_default_when_an_older_peer_leaves_it_out(
    msg: Any, field: str, default: Any
) -> None:
    body = _body(msg)
    del body[field]
    assert p.decode(msgpack.packb(body), LIMIT) == dataclasses.replace(msg, **{field: default})


def test_the_document_names_every_field_added_later_with_its_default() -> None:
    added = p.CODEC.added()
    assert {(kind, field) for kind, field, _, _ in added} == {
        ("opened", "cut_bytes"), ("turn", "approve"), ("status_reply", "workspace"),
        ("status_reply", "model"), ("opened", "context"), ("done", "context"),
        ("done", "compactions"), ("turn", "traceparent"), ("open", "servers"),
        ("opened", "servers"), ("opened", "tools"), ("opened", "notes"), ("turn", "batch"),
        ("approval", "child"),
    }
    doc = " ".join((p.__doc__ or "").split())
    for kind, field, _, _ in added:
        assert f"``{kind}.{field}`` (default " in doc
