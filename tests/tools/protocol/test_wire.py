"""The wire codec: messages round-trip; whatever a peer sends raises WireError at worst."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.errors import WireError
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.wire.fieldchecks import MAX_DEPTH

json_leaf = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text()
)
json_data = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
objects = st.dictionaries(st.text(max_size=8), json_data, max_size=5)
ids = st.integers(0, 2**63 - 1)
texts = st.text()
classes = st.sampled_from(list(ResultClass))
specs = st.builds(
    ToolSpec,
    name=texts, description=texts, parameters=objects, result_class=classes,
    needs_approval=st.booleans(), untrusted=st.booleans(),
)  # fmt: skip
messages = st.one_of(
    st.just(wire.Hello()),
    st.just(wire.Ping()),
    st.just(wire.Pong()),
    st.builds(wire.Unhealthy, reason=texts),
    st.builds(wire.Tools, tools=st.lists(specs, max_size=3).map(tuple)),
    st.builds(wire.ToolRequest, id=ids, session=texts, call=ids, tool=texts, arguments=objects,
              approved=st.booleans()),
    st.builds(wire.Result, id=ids, content=texts, class_=classes, untrusted=st.booleans()),
    st.builds(wire.Failed, id=ids, message=texts),
    st.builds(wire.Denied, id=ids, reason=texts),
    st.builds(wire.PendingApproval, id=ids, prompt=texts),
    st.builds(wire.Cancel, id=ids),
)


def _no_surrogates(msg: Any) -> bool:
    try:
        wire.encode(msg)
    except WireError:
        return False
    return True


@given(messages.filter(_no_surrogates))
def test_every_message_round_trips(msg: wire.Message) -> None:
    assert wire.decode(wire.encode(msg)) == msg


@given(st.binary(max_size=512))
def test_arbitrary_bytes_raise_only_wire_error(frame: bytes) -> None:
    with contextlib.suppress(WireError):
        wire.decode(frame, 256)


msgpack_data = st.recursive(
    json_leaf
    | st.binary(max_size=8)
    | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.binary(max_size=4), inner, max_size=4)
    ),
    max_leaves=20,
)
kinds = st.sampled_from(["hello", "tools", "request", "result", "failed", "denied",
                         "pending_approval", "ping", "pong", "cancel", "nope"])  # fmt: skip
near_messages = st.builds(
    lambda kind, fields, v: {"v": v, "kind": kind, **fields},
    kinds,
    st.dictionaries(
        st.sampled_from(["id", "session", "call", "tool", "arguments", "content", "class",
                         "untrusted", "message", "reason", "prompt", "tools", "extra"]),
        msgpack_data, max_size=6,
    ),
    st.sampled_from([1, 1, 1, 2, True, "1"]),
)  # fmt: skip


@given(msgpack_data | near_messages)
def test_arbitrary_msgpack_raises_only_wire_error(value: Any) -> None:
    frame = msgpack.packb(value)
    try:
        msg = wire.decode(frame)
    except WireError:
        return
    assert wire.decode(wire.encode(msg)) == msg  # whatever was accepted is a valid message


def _frame(**body: Any) -> bytes:
    return msgpack.packb({"v": 1, **body})


@pytest.mark.parametrize(
    ("frame", "says"),
    [
        (b"\xc1", "not a msgpack message"),
        (msgpack.packb([1, 2]), "must be a msgpack map"),
        (msgpack.packb({"v": 2, "kind": "ping"}), "protocol version 2 is not supported"),
        (msgpack.packb({"kind": "ping"}), "protocol version None"),
        (_frame(kind="launch"), "unknown message kind 'launch'"),
        (_frame(kind="ping", extra=1), "unknown field(s) extra"),
        (_frame(kind="failed", id=1), "failed.message: missing"),
        (_frame(kind="failed", id=True, message="x"), "non-negative integer id"),
        (_frame(kind="failed", id=-1, message="x"), "non-negative integer id"),
        (
            _frame(kind="result", id=1, content="x", **{"class": "top"}, untrusted=False),
            "class: expected one of",
        ),
        (
            _frame(kind="result", id=1, content="x", **{"class": "public"}, untrusted=1),
            "untrusted: expected bool",
        ),
        (
            _frame(kind="request", id=1, session="s", call=1, tool="t", arguments=[]),
            "arguments: expected a map",
        ),
        (
            _frame(kind="request", id=1, session="s", call=1, tool="t", arguments={"a": b"x"}),
            "bytes is not JSON",
        ),
        (_frame(kind="tools", tools=[{"name": "x"}]), "tool 0: fields must be exactly"),
    ],
)
def test_bad_frames_are_refused_with_what_is_wrong(frame: bytes, says: str) -> None:
    with pytest.raises(WireError) as e:
        wire.decode(frame)
    assert says in str(e.value)


def test_an_oversized_frame_is_refused_before_unpacking() -> None:
    frame = wire.encode(wire.Result(1, "x" * 2000))
    with pytest.raises(WireError, match="over the limit of 1024 bytes"):
        wire.decode(frame, 1024)
    assert wire.decode(frame, len(frame)) == wire.Result(1, "x" * 2000)


def test_the_request_id_is_kept_on_an_error_when_it_could_be_read() -> None:
    with pytest.raises(WireError) as e:
        wire.decode(_frame(kind="result", id=7, content=3, **{"class": "public"}, untrusted=False))
    assert e.value.id == 7


def test_deep_nesting_is_refused() -> None:
    deep: Any = "x"
    for _ in range(MAX_DEPTH + 5):
        deep = {"a": deep}
    frame = _frame(kind="request", id=1, session="s", call=1, tool="t", arguments=deep)
    with pytest.raises(WireError, match="nested deeper"):
        wire.decode(frame)


def test_encode_refuses_what_cannot_go_on_the_wire() -> None:
    with pytest.raises(WireError, match="not a tool wire message"):
        wire.encode("hello")  # type: ignore[arg-type]
    with pytest.raises(WireError, match="cannot encode"):
        wire.encode(wire.Result(1, "\ud800"))
    with pytest.raises(WireError, match="arguments"):
        wire.encode(wire.ToolRequest(1, "s", 1, "t", {"when": object()}))


def test_answers_default_their_id_so_providers_need_not_know_it() -> None:
    assert wire.Result(content="x").id == 0
    assert wire.Failed(message="x") == wire.Failed(0, "x")


# Frames written by loopd at ee2b571, before the one codec, from these messages (in order):
# today's encoding must be the same bytes, and reading them the same messages.
OLD_FRAMES = Path(__file__).parent / "fixtures" / "frames-before-one-codec.msgpack"
OLD_MESSAGES: list[wire.Message] = [
    wire.Hello(), wire.Ping(), wire.Pong(), wire.Unhealthy("worker gone"),
    wire.Tools((
        ToolSpec(
            "read_file", "Read",
            {"type": "object", "properties": {"path": {"type": "string"}}},
            ResultClass.INTERNAL, True, False,
        ),
        ToolSpec("x", "", {}),
    )),
    wire.ToolRequest(1, "s", 2, "read_file", {"path": "a", "n": [1, 2.5, None, True]},
                     approved=True),
    wire.ToolRequest(2**63 - 1, "s", 0, "t", {}),
    wire.Result(1, "content", ResultClass.SECRET, True), wire.Result(),
    wire.Failed(3, "boom"), wire.Denied(4, "no"), wire.PendingApproval(5, "ok?"), wire.Cancel(6),
]  # fmt: skip


# Fields added since those frames were written: today's frames carry them too.
ADDED_SINCE: dict[str, dict[str, object]] = {
    "request": {"landing": "", "traceparent": "", "ask_s": 0.0, "progress": False},
    "pending_approval": {"landing": "", "protected": ""},
}


def test_frames_from_before_the_one_codec_are_read_and_written_the_same() -> None:
    frames = msgpack.unpackb(OLD_FRAMES.read_bytes())
    assert len(frames) == len(OLD_MESSAGES)
    for frame, msg in zip(frames, OLD_MESSAGES, strict=True):
        assert wire.decode(frame) == msg
        written = msgpack.unpackb(wire.encode(msg))
        for name, default in ADDED_SINCE.get(written["kind"], {}).items():
            assert written.pop(name) == default
        assert msgpack.packb(written) == frame, type(msg).__name__


def test_a_request_without_approved_is_not_approved() -> None:
    """A port written before approvals sends no ``approved``: the request reads as not
    approved (the host then asks, for a tool that needs approval) instead of being refused."""
    frame = _frame(kind="request", id=3, session="s", call=1, tool="t", arguments={"a": 1})
    assert wire.decode(frame) == wire.ToolRequest(3, "s", 1, "t", {"a": 1}, approved=False)


def test_the_document_names_every_field_added_later_with_its_default() -> None:
    assert [(kind, field, default) for kind, field, default, _ in wire.CODEC.added()] == [
        ("request", "approved", False), ("request", "landing", ""),
        ("request", "traceparent", ""), ("request", "ask_s", 0.0),
        ("request", "progress", False),
        ("pending_approval", "landing", ""), ("pending_approval", "protected", ""),
    ]
    doc = " ".join((wire.__doc__ or "").split())
    assert "``request.approved`` (default ``false``: not approved)" in doc
    assert ("``request.landing`` (default ``\"\"``: none named), ``pending_approval.landing`` "
            "and ``pending_approval.protected`` (default ``\"\"``)") in doc
    assert "``request.traceparent`` (default ``\"\"``: not traced)" in doc
    assert "``request.ask_s`` (default ``0.0``: nobody to ask)" in doc
    assert "``request.progress`` (default ``false``: no progress wanted)" in doc


def test_a_question_and_its_reply_cross_the_wire() -> None:
    ask = wire.Ask(3, 1, "greeter", "Whom?", {"type": "object", "properties": {}})
    assert wire.decode(wire.encode(ask)) == ask
    reply = wire.Reply(3, 1, "accept", {"name": "Ada"})
    assert wire.decode(wire.encode(reply)) == reply
    progress = wire.Progress(3, 2.0, 3.0, "step 2")
    assert wire.decode(wire.encode(progress)) == progress
    assert wire.decode(_frame(kind="reply", id=3, question=1, action="decline",
                              content={})) == wire.Reply(3, 1, "decline")
