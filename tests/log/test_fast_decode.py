"""Opening a log decodes every record through ``CODEC.decode_whole``, the codec's decode
without its layers: it must build exactly what the reference :func:`decode` builds, and
refuse exactly what it refuses, with the same words.

The property tests draw records and damaged maps (a field of another type, one missing, one
unknown, a foreign kind, not a map at all); the seed is printed in pytest's header
(tests/conftest.py), ``pytest --hypothesis-seed=N`` replays a run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.errors import RecordError, WireError
from actors.log import server_values
from actors.log.records import CODEC, Record, decode, encode
from actors.wire.codec import _Bad
from tests.strategies import json_values, records

T = dt.datetime(2025, 1, 2, tzinfo=dt.UTC)

# What a damaged field may hold instead: every msgpack type, and near misses of the right
# ones (True for an int, an int for a float, a negative count, a huge one, NaN, infinity).
odd_values: st.SearchStrategy[Any] = (
    json_values
    | st.binary(max_size=8)
    | st.sampled_from([True, False, -1, 2**64 - 1, 2**63, 0.5, math.nan, math.inf, -0.0])
    | st.datetimes(timezones=st.just(dt.UTC))
    | st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=3), max_size=3)
)


def outcome(read: Any, payload: bytes) -> tuple[str, Any]:
    """("ok", the record) or ("refused", what the error says)."""
    try:
        return "ok", read(payload)
    except (WireError, RecordError) as e:
        return "refused", str(e)


def same_record(a: Record, b: Record) -> None:
    """Equal, field by field, with values of the same types (a list is not a tuple)."""
    assert type(a) is type(b)
    assert a == b
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        assert type(x) is type(y), f.name
        if type(x) is tuple:
            assert [type(i) for i in x] == [type(i) for i in y], f.name


@given(records)
def test_fast_decode_builds_what_decode_builds(record: Record) -> None:
    payload = encode(record)
    fast = CODEC.decode_whole(payload)
    same_record(fast, decode(payload))
    same_record(fast, record)
    same_record(CODEC.decode_whole(memoryview(payload)), fast)  # as the log reads it
    # A record built by filling a twin of its class is a record like any other: frozen,
    # hashable as the written one is, the same after a copy.
    first = dataclasses.fields(fast)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, first, getattr(fast, first))
    assert dataclasses.replace(fast) == fast
    assert repr(fast) == repr(decode(payload))


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A record's map with one thing wrong (or, now and then, nothing), packed."""
    body: Any = msgpack.unpackb(encode(draw(records)), timestamp=3)
    fields = sorted(k for k in body if k != "kind")
    how = draw(st.sampled_from(["retype", "retype", "drop", "add", "kind", "whole", "none"]))
    if how == "retype" and fields:
        body[draw(st.sampled_from(fields))] = draw(odd_values)
    elif how == "drop" and fields:
        del body[draw(st.sampled_from(fields))]
    elif how == "add":
        body[draw(st.text(max_size=8))] = draw(odd_values)
    elif how == "kind":
        body["kind"] = draw(odd_values | st.sampled_from(sorted(CODEC.by_kind)))
    elif how == "whole":
        body = draw(odd_values)
    packed: bytes = msgpack.packb(body, datetime=True)
    return packed


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "baseline", "system": "", "tools": [{}] * 100_001, "model": "", "created": T,
         "time": T},
        {"kind": "usage", "timings": {f"k{i}": i for i in range(50_001)}, "reasoning_tokens": 0,
         "thinking_capped": False, "prompt_tokens": 0, "completion_tokens": 0,
         "finish_reason": "", "time": T},
    ],
    ids=["array", "map"],
)
def test_fast_decode_keeps_the_container_limits(body: dict[str, Any]) -> None:
    payload = msgpack.packb(body, datetime=True)
    kind, said = outcome(CODEC.decode_whole, payload)
    assert kind == "refused" and "exceeds max_" in said
    agree(payload)


def agree(payload: bytes) -> None:
    fast, reference = outcome(CODEC.decode_whole, payload), outcome(decode, payload)
    assert fast[0] == reference[0]
    if fast[0] == "ok":
        same_record(fast[1], reference[1])
    else:
        assert fast[1] == reference[1]


@given(damaged())
def test_fast_decode_refuses_what_decode_refuses_in_its_words(payload: bytes) -> None:
    agree(payload)


def read_outcome(read: Any, body: Any) -> tuple[str, Any]:
    try:
        return "ok", read(body, CODEC._envelope)
    except _Bad as e:
        return "refused", (e.field, e.text)


@given(damaged())
def test_a_shapes_quick_reader_reads_or_refuses_as_its_careful_one(payload: bytes) -> None:
    """Each shape's ``read`` (a map exactly as loopd writes it, else handed on) against its
    ``careful`` (field after field), on the same maps; nested maps (tool calls, a slot)
    are read by the same pair."""
    body = msgpack.unpackb(payload, timestamp=3)
    if type(body) is not dict or type(body.get("kind")) is not str:
        return
    shape = CODEC.by_kind.get(body["kind"])
    if shape is None:
        return
    quick, careful = read_outcome(shape.read, body), read_outcome(shape.careful, body)
    assert quick[0] == careful[0]
    if quick[0] == "ok":
        same_record(quick[1], careful[1])
    else:
        assert quick[1] == careful[1]


@given(st.binary(max_size=64))
def test_fast_decode_refuses_any_bytes_as_decode_does(payload: bytes) -> None:
    agree(payload)


good_timings = st.dictionaries(
    st.text(max_size=64),
    st.integers(0, 2**63 - 1) | st.floats(min_value=0, allow_nan=False, allow_infinity=False),
    max_size=8,
)
bad_keys = st.text(min_size=65, max_size=70) | st.integers(0, 3) | st.booleans() | st.none()
bad_values = (
    st.sampled_from([-1, 2**63, 2**64 - 1, True, False, None, "1", [1], {"a": 1}])
    | st.floats(max_value=-1e-300)
    | st.sampled_from([math.nan, math.inf, -math.inf])
)


@st.composite
def timings(draw: st.DrawFn) -> dict[Any, Any]:
    """Well-formed timings, then maybe one entry that timings() leaves out, or too many."""
    obj: dict[Any, Any] = draw(good_timings)
    how = draw(st.sampled_from(["good", "bad key", "bad value", "too many"]))
    if how == "bad key":
        obj[draw(bad_keys)] = draw(st.integers(0, 9))
    elif how == "bad value":
        obj[draw(st.text(max_size=64))] = draw(bad_values)
    elif how == "too many":
        obj.update((f"k{i}", i) for i in range(server_values.MAX_FIELDS + 1))
    return obj


@given(timings())
def test_all_kept_is_true_exactly_when_timings_keeps_everything(obj: dict[Any, Any]) -> None:
    kept = server_values.timings(obj)
    everything = kept.keys() == obj.keys() and all(kept[k] is obj[k] for k in obj)
    assert server_values.all_kept(obj) == everything
