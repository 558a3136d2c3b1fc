"""The one codec, on a protocol of its own that uses every row of its table: messages
round-trip, every kind of bad input is refused with the kind and the field named, fields
added later read as their defaults, and no input raises anything but WireError.

(The run's hypothesis seed is printed in pytest's header: tests/conftest.py.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
from collections.abc import Mapping
from typing import Any, ClassVar

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.errors import WireError
from actors.wire.codec import CHECK, Codec, Natural, added, plain, shape_of
from actors.wire.fieldchecks import MAX_DEPTH
from tests.strategies import ints64, json_values


class Colour(enum.StrEnum):
    RED = "red"
    BLUE = "blue"


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    name: str
    size: int = added(0, "parts got sizes")


def _even(v: Any) -> int:
    if type(v) is not int or v % 2:
        raise TypeError(f"expected an even int, got {v!r:.20}")
    return v


@dataclasses.dataclass(frozen=True, slots=True)
class Every:
    """A message with a field of every type the codec knows."""

    id: Natural
    text: str
    blob: bytes
    flag: bool
    count: int
    ratio: float
    colour: Colour
    maybe: str | None
    words: tuple[str, ...]
    parts: tuple[Part, ...]
    one: Part | None
    data: Mapping[str, Any]
    anything: Any
    class_: str  # on the wire: "class"
    even: int = dataclasses.field(metadata={CHECK: _even})


@dataclasses.dataclass(frozen=True, slots=True)
class Empty:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Renamed:
    KIND: ClassVar[str] = "call"

    id: Natural
    note: str = added("", "notes")
    tags: tuple[str, ...] = added((), "tags")


@dataclasses.dataclass(frozen=True, slots=True)
class Stamped:
    time: dt.datetime


@dataclasses.dataclass(frozen=True)
class Checked:
    """No slots, and a __post_init__: built through its __init__, which must run."""

    n: int

    def __post_init__(self) -> None:
        if self.n == 13:
            raise TypeError("13 is refused by the class itself")


WIRE = Codec("test wire", (Every, Empty, Renamed, Checked), version=3, max_frame=1 << 16)
LOG = Codec("test log", (Stamped, Part), version=None, noun="record", timestamps=True,
            max_frame=1 << 16)  # fmt: skip

T0 = dt.datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)
EVERY = Every(
    id=7, text="t", blob=b"\x00b", flag=True, count=-3, ratio=0.5, colour=Colour.BLUE,
    maybe=None, words=("a", "b"), parts=(Part("p", 2), Part("q")), one=Part("o", 1),
    data={"k": [1, {"x": None}]}, anything=[1, "two", 3.0], class_="c", even=4,
)  # fmt: skip


def body(msg: Any) -> dict[str, Any]:
    value: dict[str, Any] = msgpack.unpackb(WIRE.encode(msg))
    return value


def frame(**fields: Any) -> bytes:
    return msgpack.packb({"v": 3, **fields})


# --- what the codec reads from the classes ------------------------------------------------


def test_kinds_and_wire_names_come_from_the_classes() -> None:
    assert WIRE.kinds == {Every: "every", Empty: "empty", Renamed: "call", Checked: "checked"}
    assert list(body(EVERY)) == [
        "v", "kind", "id", "text", "blob", "flag", "count", "ratio", "colour", "maybe", "words",
        "parts", "one", "data", "anything", "class", "even",
    ]  # fmt: skip
    b = body(EVERY)
    assert b["v"] == 3 and b["kind"] == "every" and b["colour"] == "blue"
    assert b["parts"] == [{"name": "p", "size": 2}, {"name": "q", "size": 0}]
    assert WIRE.added() == [  # the maps inside messages too
        ("call", "note", "", "notes"), ("call", "tags", (), "tags"),
        ("part", "size", 0, "parts got sizes"),
    ]  # fmt: skip


@pytest.mark.parametrize("msg", [EVERY, Empty(), Renamed(1, "n", ("x",)), Checked(2)],
                         ids=lambda m: type(m).__name__)  # fmt: skip
def test_every_kind_round_trips(msg: Any) -> None:
    back = WIRE.decode(WIRE.encode(msg))
    assert back == msg and type(back) is type(msg)


def test_types_are_kept_not_only_values() -> None:
    back = WIRE.decode(WIRE.encode(EVERY))
    assert type(back.colour) is Colour and type(back.words) is tuple
    assert type(back.parts[0]) is Part and type(back.ratio) is float
    assert WIRE.decode(frame(**{**body(EVERY), "ratio": 2})).ratio == 2.0  # an int reads as float
    assert type(WIRE.decode(frame(**{**body(EVERY), "ratio": 2})).ratio) is float


def test_a_record_codec_has_no_version_and_keeps_utc_timestamps() -> None:
    payload = LOG.encode(Stamped(T0))
    raw = msgpack.unpackb(payload, timestamp=0)
    assert set(raw) == {"kind", "time"} and isinstance(raw["time"], msgpack.Timestamp)
    assert LOG.decode(payload) == Stamped(T0)
    with pytest.raises(WireError, match=r"^stamped\.time: expected a UTC timestamp"):
        LOG.encode(Stamped(dt.datetime(2025, 1, 1)))  # naive: no zone to keep
    with pytest.raises(WireError, match=r"^stamped\.time: expected a UTC timestamp"):
        LOG.decode(msgpack.packb({"kind": "stamped", "time": "2025-01-01"}))


def test_a_class_with_its_own_init_is_built_through_it() -> None:
    assert WIRE.decode(WIRE.encode(Checked(2))) == Checked(2)
    with pytest.raises(WireError, match=r"^checked: 13 is refused by the class itself"):
        WIRE.decode(frame(kind="checked", n=13))


def test_a_type_without_a_wire_form_is_refused_when_the_codec_is_made() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Odd:
        when: dt.date

    with pytest.raises(TypeError, match=r"Odd\.when: .*has no wire form"):
        shape_of(Odd)


# --- fields added later ---------------------------------------------------------------------


def test_a_field_added_later_reads_as_its_default_when_left_out() -> None:
    assert WIRE.decode(frame(kind="call", id=4)) == Renamed(4, "", ())
    assert WIRE.decode(frame(kind="call", id=4, tags=["t"])) == Renamed(4, "", ("t",))
    nested = {**body(EVERY), "one": {"name": "o"}}
    assert WIRE.decode(frame(**nested)).one == Part("o", 0)


def test_a_field_not_added_later_must_be_there() -> None:
    b = body(EVERY)
    del b["text"]
    with pytest.raises(WireError, match=r"^every\.text: missing$") as e:
        WIRE.decode(frame(**b))
    assert e.value.id == 7
    with pytest.raises(WireError, match=r"^call\.id: missing"):
        WIRE.decode(frame(kind="call"))


def test_an_unknown_field_is_refused_even_when_an_added_one_is_missing() -> None:
    """The length matches (one left out, one unknown): still refused, not ignored."""
    with pytest.raises(WireError, match=r"^call: unknown field\(s\) colour"):
        WIRE.decode(frame(kind="call", id=1, note="n", colour="red"))
    with pytest.raises(WireError, match=r"^every: unknown field\(s\) extra, more"):
        WIRE.decode(frame(**body(EVERY), extra=1, more=2))


# --- every kind of bad input ---------------------------------------------------------------

# A wrong value for every field of Every, and what the error says after "every.FIELD: ".
WRONG: list[tuple[str, Any, str]] = [
    ("id", -1, "expected a non-negative integer id"),
    ("id", True, "expected a non-negative integer id"),
    ("id", 2**63, "expected a non-negative integer id"),
    ("text", b"t", "expected str, got bytes"),
    ("blob", "b", "expected bytes, got str"),
    ("flag", 1, "expected bool, got int"),
    ("count", True, "expected int, got bool"),
    ("count", 1.0, "expected int, got float"),
    ("ratio", "1", "expected float or int, got str"),
    ("colour", "green", "expected one of red, blue, got 'green'"),
    ("colour", [], "expected one of red, blue"),
    ("maybe", 1, "expected str, got int"),
    ("words", "ab", "expected a list, got str"),
    ("words", ["a", 1], "item 1: expected str, got int"),
    ("parts", [{"name": "p"}, 3], "part 1: expected a map, got int"),
    ("parts", [{"name": "p", "colour": 1}], "part 0: fields must be exactly name, size "
                                             "(size may be left out)"),
    ("parts", [{"size": 1}], "part 0: fields must be exactly name, size"),
    ("parts", [{"name": 5}], "part 0: expected str, got int (in name)"),
    ("one", {"name": "o", "size": "big"}, "expected int, got str (in size)"),
    ("data", [], "expected a map, got list"),
    ("data", {"k": b"x"}, "bytes is not JSON data"),
    ("anything", {"k": msgpack.ExtType(5, b"")}, "ExtType is not JSON data"),
    ("class", 1, "expected str, got int"),
    ("even", 3, "expected an even int, got 3"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value", "says"), WRONG)
def test_a_wrong_field_is_refused_naming_kind_and_field(field: str, value: Any, says: str) -> None:
    with pytest.raises(WireError) as e:
        WIRE.decode(frame(**{**body(EVERY), field: value}))
    assert str(e.value).startswith(f"every.{field}: {says}")
    assert e.value.id == (7 if field != "id" else None)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xc1", "not a msgpack message: "),
        (b"\x93\x01", "not a msgpack message: "),  # an array cut short
        (msgpack.packb([1, 2]), "not a msgpack message: a message must be a msgpack map, got list"),
        (msgpack.packb({1: 2}), "not a msgpack message: "),  # a map key that is not text
        (msgpack.packb({"kind": "empty"}), "protocol version None is not supported"),
        (msgpack.packb({"v": 2, "kind": "empty"}), "protocol version 2 is not supported"),
        (msgpack.packb({"v": True, "kind": "empty"}), "protocol version True is not supported"),
        (msgpack.packb({"v": 3.0, "kind": "empty"}), "protocol version 3.0 is not supported"),
        (frame(kind="launch"), "unknown message kind 'launch'; known: every, empty, call"),
        (frame(kind=["every"]), "unknown message kind ['every']"),
        (frame(kind=None), "unknown message kind None"),
        (frame(kind="empty", x=1), "empty: unknown field(s) x"),
    ],
)
def test_a_bad_frame_is_refused_saying_what_is_wrong(data: bytes, says: str) -> None:
    with pytest.raises(WireError) as e:
        WIRE.decode(data)
    assert says in str(e.value)


def test_the_size_is_checked_before_msgpack_sees_the_frame() -> None:
    with pytest.raises(WireError, match="frame of 11 bytes is over the limit of 10 bytes"):
        WIRE.decode(b"\xc1" * 11, 10)  # not msgpack either: the size is what it says
    big = WIRE.encode(Renamed(1, "x" * 100))
    with pytest.raises(WireError, match="over the limit of 65536"):
        WIRE.decode(b"\x00" * 65537)
    assert WIRE.decode(big, len(big)) == Renamed(1, "x" * 100)
    with pytest.raises(WireError, match="a frame must be bytes, got str"):
        WIRE.decode("text")  # type: ignore[arg-type]


def test_containers_over_the_limits_are_refused_by_msgpack() -> None:
    small = Codec("tiny", (Renamed,), version=3, max_frame=1 << 20, max_array=4, max_map=4)
    with pytest.raises(WireError, match="not a msgpack message"):
        small.decode(frame(kind="call", id=1, tags=["t"] * 5))
    assert small.decode(frame(kind="call", id=1, tags=["t"] * 4)).tags == ("t",) * 4
    with pytest.raises(WireError, match="not a msgpack message"):
        small.decode(frame(kind="call", id=1, note="", tags=[], x=1))  # a map of 5


def test_json_nested_too_deep_is_refused() -> None:
    deep: Any = 1
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(WireError, match=r"^every\.anything: nested deeper than 64"):
        WIRE.decode(frame(**{**body(EVERY), "anything": deep}))


def test_the_id_is_kept_on_an_error_when_it_could_be_read() -> None:
    with pytest.raises(WireError) as e:
        WIRE.decode(msgpack.packb({"v": 9, "kind": "call", "id": 12}))
    assert e.value.id == 12
    with pytest.raises(WireError) as e:
        WIRE.decode(frame(kind="call", id=-5))
    assert e.value.id is None


# --- encoding -------------------------------------------------------------------------------


def test_encode_refuses_what_cannot_go_on_the_wire_naming_kind_and_field() -> None:
    with pytest.raises(WireError, match="cannot encode Stamped: not a test wire message"):
        WIRE.encode(Stamped(T0))
    with pytest.raises(WireError, match=r"^every\.count: expected int, got str"):
        WIRE.encode(dataclasses.replace(EVERY, count="1"))  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"^every\.id: expected a non-negative integer id"):
        WIRE.encode(dataclasses.replace(EVERY, id=-1))
    with pytest.raises(WireError, match=r"^every\.parts: expected a Part, got dict"):
        WIRE.encode(dataclasses.replace(EVERY, parts=({"name": "p"},)))  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"^every\.one: expected str, got int \(in name\)"):
        WIRE.encode(dataclasses.replace(EVERY, one=Part(1)))  # type: ignore[arg-type]
    with pytest.raises(WireError, match=r"^every\.data: object is not JSON data"):
        WIRE.encode(dataclasses.replace(EVERY, data={"a": object()}))
    with pytest.raises(WireError, match=r"^every: cannot encode"):
        WIRE.encode(dataclasses.replace(EVERY, text="\ud800"))  # a lone surrogate
    with pytest.raises(WireError, match=r"^every: cannot encode"):
        WIRE.encode(dataclasses.replace(EVERY, count=2**64))


def test_encode_makes_plain_what_is_data_in_another_shape() -> None:
    """Mappings, tuples and enums inside data, an enum in a text field, a list for a tuple."""
    msg = dataclasses.replace(
        EVERY, data={"m": dict(a=(1, 2))}, anything=(Colour.RED,), text=Colour.RED,
        words=["x"],  # type: ignore[arg-type]
    )  # fmt: skip
    b = body(msg)
    assert b["data"] == {"m": {"a": [1, 2]}} and b["anything"] == ["red"]
    assert b["text"] == "red" and b["words"] == ["x"]
    assert plain({"a": (1, Colour.BLUE)}) == {"a": [1, "blue"]}
    with pytest.raises(TypeError, match="set is not JSON data"):
        plain({1, 2})


# --- properties -----------------------------------------------------------------------------

parts = st.builds(Part, name=st.text(max_size=5), size=ints64)
ids = st.integers(0, 2**63 - 1)
messages = st.one_of(
    st.builds(
        Every, id=ids, text=st.text(), blob=st.binary(max_size=8), flag=st.booleans(),
        count=st.integers(-(2**63), 2**64 - 1), ratio=st.floats(allow_nan=False),
        colour=st.sampled_from(Colour), maybe=st.none() | st.text(max_size=5),
        words=st.lists(st.text(max_size=5), max_size=3).map(tuple),
        parts=st.lists(parts, max_size=3).map(tuple), one=st.none() | parts,
        data=st.dictionaries(st.text(max_size=5), json_values, max_size=3), anything=json_values,
        class_=st.text(max_size=5), even=st.integers(-100, 100).map(lambda n: 2 * n),
    ),
    st.just(Empty()),
    st.builds(Renamed, id=ids, note=st.text(max_size=5),
              tags=st.lists(st.text(max_size=5), max_size=3).map(tuple)),
    st.builds(Checked, n=st.integers(-5, 5)),
)  # fmt: skip


@given(messages)
def test_every_message_round_trips(msg: Any) -> None:
    assert WIRE.decode(WIRE.encode(msg)) == msg


msgpack_leaves = st.one_of(
    st.none(), st.booleans(), ints64, st.floats(allow_nan=False), st.text(max_size=8),
    st.binary(max_size=6),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=3)),
)
msgpack_data = st.recursive(
    msgpack_leaves,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6) | st.binary(max_size=3), inner, max_size=3),
    max_leaves=15,
)  # fmt: skip
names = st.sampled_from([
    "id", "text", "blob", "flag", "count", "ratio", "colour", "maybe", "words", "parts", "one",
    "data", "anything", "class", "even", "note", "tags", "n", "extra",
])  # fmt: skip
near_messages = st.builds(
    lambda kind, fields, v: {"v": v, "kind": kind, **fields},
    st.sampled_from(["every", "empty", "call", "checked", "nope"]),
    st.dictionaries(names, msgpack_data, max_size=8),
    st.sampled_from([3, 3, 3, 2, True]),
)
mutated = st.builds(
    lambda msg, field, value: {**body(msg), field: value},
    messages, names, msgpack_data,
)  # fmt: skip


@given(msgpack_data | near_messages | mutated)
def test_any_msgpack_raises_only_wire_error_and_what_is_read_is_valid(value: Any) -> None:
    try:
        msg = WIRE.decode(msgpack.packb(value))
    except WireError:
        return
    assert WIRE.decode(WIRE.encode(msg)) == msg


@given(st.binary(max_size=300))
def test_any_bytes_raise_only_wire_error(data: bytes) -> None:
    with contextlib.suppress(WireError):
        WIRE.decode(data, 200)
