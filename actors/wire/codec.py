"""One msgpack codec for everything loopd writes or sends: log records, the tool wire, the
daemon's client protocol. Its tables are read from the frozen dataclasses themselves.

One message (or record) is one msgpack map: ``v`` (the protocol's version; not in log
records, whose version is in the file's header), ``kind``, then the fields by name in the
dataclass's order. From a class the codec reads:

- its kind: the class name in snake_case (``CacheLoss`` is ``cache_loss``), or the class's
  ``KIND`` (``ToolRequest.KIND = "request"``);
- its fields: the dataclass's, named on the wire without a trailing ``_`` (``class_`` is
  ``class``);
- each field's check, from its type hint (:func:`typing.get_type_hints`):

  =====================================  ===============================================
  type hint                              on the wire
  =====================================  ===============================================
  ``str``, ``bytes``, ``bool``, ``int``  itself, the type exact (``True`` is not an int)
  ``float``                              a float (an int is read as a float)
  :data:`Natural`                        an int from 0 to 2**63 - 1 (ids, counts)
  ``Annotated[T, fn]``                   a T that ``fn`` checks (``Natural`` is one)
  an ``enum.Enum``                       its value
  ``X | None``                           nil or an X
  ``tuple[X, ...]``                      an array of X
  ``Mapping[str, Any]``, ``dict[...]``   a map of JSON data, nested at most MAX_DEPTH
  ``Any``                                JSON data
  ``datetime.datetime``                  msgpack's timestamp extension, UTC (the log)
  a dataclass                            a map of its fields, read by the same rules
  =====================================  ===============================================

  A field whose type is not enough says how it is read in its metadata:
  ``dataclasses.field(metadata={CHECK: fn})``; ``fn`` takes the msgpack value and returns
  the field's value or raises ``TypeError`` saying what it expected;
- which fields an older peer or log may leave out: those declared with :func:`added`,
  which read as their default when missing. Every other field must be there.

Decoding trusts nothing: the frame's size is checked before msgpack sees it, msgpack runs
with small container limits, every field is checked, a missing field (but an added one) and
an unknown field are refused, and everything wrong raises
:class:`~actors.base.errors.WireError` naming the kind and the field (with the message's
``id`` when one could be read, so that the peer can be told which request failed).

Adding a record or a message is one change: write its frozen dataclass beside the others
and name it in its codec's list (the ``Record`` union of :mod:`actors.log.records`, the
``Message`` union of :mod:`actors.tools.protocol.wire`, ``MESSAGES`` of
:mod:`actors.daemon.protocol`), and describe it in that protocol's document. Adding a
field to one that peers already send, or logs already hold: declare it with
``added(default, "when")`` and name it in the document's list of added fields; the
protocol's version changes only for what an older peer cannot read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import functools
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, TypeVar

import msgpack

from actors.base.errors import WireError
from actors.wire.fieldchecks import MAX_ID, SCALARS, Check, exact, json_data, json_object, member
from actors.wire.fieldchecks import wire_id as _wire_id

__all__ = [
    "ADDED", "CHECK", "Codec", "Natural", "Shape", "added", "plain", "shape_of",
]  # fmt: skip

CHECK = "loopd.wire.check"  # field metadata: how the field's msgpack value is read
ADDED = "loopd.wire.added"  # field metadata: when the field was added (see added())

Natural = Annotated[int, _wire_id]
"""An int from 0 to 2**63 - 1: a request id or a count."""

T = TypeVar("T")


def added(default: T, when: str) -> T:
    """A field added after its message was first sent (or its record first written).

    ``when`` says when, for the protocol's document. A message or record without the field
    reads as ``default``, so that older peers and older logs keep working.
    """
    return dataclasses.field(default=default, metadata={ADDED: when})


class _Bad(Exception):
    """What is wrong with one map: ``field`` (None: the map as a whole) and ``text``."""

    def __init__(self, field: str | None, text: str) -> None:
        super().__init__(text)
        self.field, self.text = field, text


# --- each type's wire form ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Form:
    """How one type goes on the wire and back.

    ``read``/``write`` return the Python/msgpack value or raise TypeError saying what they
    expected. ``fast_read``/``fast_write``: a value of exactly this type is already right,
    so the codec skips the call (most fields are text and numbers). ``nullable``: nil
    reads as None without the call (``X | None``).
    """

    read: Check
    write: Check
    fast_read: type | None = None
    fast_write: type | None = None
    nullable: bool = False


def _scalar(t: type) -> _Form:
    check = exact(t)

    def write(v: Any) -> Any:
        return check(v.value if isinstance(v, enum.Enum) else v)  # a StrEnum in a str field

    return _Form(check, write, t, t)


def _number(v: Any) -> float:
    return float(exact(float, int)(v))


def _utc(v: Any) -> dt.datetime:
    if not isinstance(v, dt.datetime) or v.tzinfo is None:
        raise TypeError(f"expected a UTC timestamp, got {type(v).__name__}")
    return v


def _enum(kind: type[enum.Enum]) -> _Form:
    check = member(kind)
    return _Form(check, lambda v: check(v).value)


def _optional(inner: _Form) -> _Form:
    read, write = inner.read, inner.write
    return _Form(
        lambda v: None if v is None else read(v),
        lambda v: None if v is None else write(v),
        inner.fast_read,
        inner.fast_write,
        nullable=True,
    )


def _array(inner: _Form, item: str) -> _Form:
    read, write, fast = inner.read, inner.write, inner.fast_read

    def read_all(v: Any) -> tuple[Any, ...]:
        if type(v) is not list:
            raise TypeError(f"expected a list, got {type(v).__name__}")
        if not v:
            return ()
        if fast is None:
            try:
                return tuple([read(x) for x in v])
            except TypeError:
                pass  # the loop below says which item
        elif all(type(x) is fast for x in v):
            return tuple(v)
        out = []
        for i, x in enumerate(v):
            try:
                out.append(x if type(x) is fast else read(x))
            except TypeError as e:
                raise TypeError(f"{item} {i}: {e}") from None
        return tuple(out)

    fast_write = inner.fast_write

    def write_all(v: Any) -> list[Any]:
        if not isinstance(v, tuple | list):
            raise TypeError(f"expected a tuple, got {type(v).__name__}")
        return [x if type(x) is fast_write else write(x) for x in v]

    return _Form(read_all, write_all)


def plain(value: Any) -> Any:
    """``value`` as JSON-shaped data: Mappings become dicts, tuples lists, enums their values.

    Also orjson's ``default`` for the Mapping types records hold. TypeError for anything
    that is not data.
    """
    t = type(value)
    if t in SCALARS:
        return value
    if t is dict or isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if t is list or t is tuple:
        return [plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"{t.__name__} is not JSON data")


def _json(check: Callable[[Any], Any]) -> _Form:
    def write(v: Any) -> Any:
        try:
            return check(v)  # it only looks: usually the value is already plain
        except TypeError:
            return check(plain(v))

    return _Form(check, write)


def _form(hint: Any, where: str) -> _Form:
    """The wire form of a type hint (see the module's table)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Annotated:
        base, refine = _form(args[0], where), args[1]
        base_write, fast = base.write, base.fast_write

        def write(v: Any) -> Any:
            return refine(v if type(v) is fast else base_write(v))

        return _Form(refine, write)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return _optional(_form(rest[0], where))
    if hint in (str, bytes, bool, int):
        return _scalar(hint)
    if hint is float:
        return _Form(_number, _number, float, float)
    if hint is dt.datetime:  # msgpack reads its timestamps as UTC datetimes: only a write checks
        return _Form(_utc, _utc, fast_read=dt.datetime)
    if hint is Any:
        return _json(json_data)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return shape_of(typing.cast(type[Any], hint)).form
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        inner: type[Any] = args[0]
        item = shape_of(inner).label if dataclasses.is_dataclass(inner) else "item"
        return _array(_form(inner, where), item)
    if origin in (dict, Mapping) and args[0] is str and args[1] is Any:
        return _json(json_object)
    raise TypeError(
        f"{where}: {hint!r} has no wire form; use a type of actors.wire.codec's table or "
        f"say how to read it with field(metadata={{CHECK: ...}})"
    )


# --- a dataclass's wire form ------------------------------------------------------------


def _same(value: T) -> T:
    return value


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Shape:
    """The wire form of one dataclass: its kind, its fields and how each is read and written.

    Built once per class (:func:`shape_of`). Reading is the hot path (a log of 100,000
    records is read whole on every open), so a shape compiles its reader: a function with
    one line per field, made from the same table (see :meth:`_compile`).
    """

    def __init__(self, cls: type[Any]) -> None:
        hints = typing.get_type_hints(cls, include_extras=True)
        self.cls = cls
        self.kind: str = getattr(cls, "KIND", None) or _snake(cls.__name__)
        self.label = self.kind.replace("_", " ")  # in errors: "tool call 0: ..."
        fields = dataclasses.fields(cls)
        self.names = tuple(f.name.rstrip("_") for f in fields)
        self._defaults: list[Callable[[], Any] | None] = []
        reading: list[tuple[str, type | None, Check, bool]] = []
        writing = []
        added_ = []
        for f, wire in zip(fields, self.names, strict=True):
            where = f"{cls.__name__}.{f.name}"
            form = _form(hints[f.name], where)
            if CHECK in f.metadata:
                reading.append((wire, None, f.metadata[CHECK], False))
            else:
                reading.append((wire, form.fast_read, form.read, form.nullable))
            writing.append((wire, f.name, form.fast_write, form.write))
            self._defaults.append(_default(f, where) if ADDED in f.metadata else None)
            if ADDED in f.metadata:
                added_.append((wire, f.default, f.metadata[ADDED]))
        self._writing = tuple(writing)
        self.added: tuple[tuple[str, Any, str], ...] = tuple(added_)
        self.inner = tuple(shape_of(c) for c in _dataclasses_in(hints[f.name] for f in fields))
        self.read: Callable[[dict[Any, Any], frozenset[str]], Any]
        self.careful: Callable[[dict[Any, Any], frozenset[str]], Any]
        self.read, self.careful = self._compile(reading)
        self.form = _Form(self._read_nested, self._write_nested)

    # reading

    def _compile(
        self, reading: list[tuple[str, type | None, Check, bool]]
    ) -> tuple[Callable[..., Any], Callable[..., Any]]:
        """``read(body, envelope)``: the instance a map holds, or _Bad naming the field;
        ``envelope``: the other keys the map may have (``v``, ``kind``). And ``careful``.

        Generated because a loop over the fields, calling the dataclass's frozen
        ``__init__``, cost twice as much. The code only looks things up in the table.

        Two functions: ``careful`` reads field after field and names the first that is
        wrong; ``read``, for a map that is exactly right (every field there, each of its
        type: what loopd writes), looks the fields up, compares their types all at once and
        builds the instance; anything else it hands to ``careful``, so that a map is refused
        by one function only, in one set of words.
        """
        n = len(reading)
        env: dict[str, Any] = {
            "Bad": _Bad, "unknown": self._refuse_unknown, "missing": self._missing,
        }  # fmt: skip
        lines = [  # a map of another size was looked over for unknown keys once, here
            "def careful(body, envelope):",
            f"    looked = len(body) != {n} + len(envelope)",
            "    if looked:",
            "        unknown(body, envelope)",
        ]
        for i, (wire, fast, check, nullable) in enumerate(reading):
            env[f"fast{i}"], env[f"check{i}"] = fast, check
            unless = f"v{i} is not None and " if nullable else ""  # nil: None, no call
            lines += [
                "    try:",
                f"        v{i} = body[{wire!r}]",
                "    except KeyError:",
                f"        v{i} = missing(body, envelope, {i}, looked)",
                "    else:",
                f"        if {unless}type(v{i}) is not fast{i}:",
                "            try:",
                f"                v{i} = check{i}(v{i})",
                "            except (TypeError, RecursionError) as e:",
                f"                raise Bad({wire!r}, str(e)) from None",
            ]
        values = ", ".join(f"v{i}" for i in range(n))
        setters = _slot_setters(self.cls)
        if setters is None:  # the class's own checks may refuse: its refusal is a _Bad too
            env["cls"] = self.cls
            lines += [
                "    try:",
                f"        return cls({values})",
                "    except (TypeError, ValueError) as e:",
                "        raise Bad(None, str(e)) from None",
                "read = careful",
            ]
        else:
            build = self._build(env, setters)
            lines += build
            lines += self._happy(reading, env) + build
        code = compile("\n".join(lines), f"<reader of {self.cls.__qualname__}>", "exec")
        exec(code, env)  # the source above: field names and the table's entries, nothing else
        return env["read"], env["careful"]

    def _happy(
        self, reading: list[tuple[str, type | None, Check, bool]], env: dict[str, Any]
    ) -> list[str]:
        """``read`` up to the building (see :meth:`_compile`): it hands the map to
        ``careful`` where that one could find something wrong, and calls the checks that
        convert (an enum's member, a nested record) as ``careful`` does."""
        n = len(reading)
        lines = [
            "def read(body, envelope, type=type):",
            f"    if len(body) != {n} + len(envelope):",
            "        return careful(body, envelope)",
        ]
        if reading:
            lines += [
                "    try:",
                *(f"        v{i} = body[{wire!r}]" for i, (wire, *_) in enumerate(reading)),
                "    except KeyError:",
                "        return careful(body, envelope)",
            ]
        plain = [i for i, (_, fast, _, nullable) in enumerate(reading) if fast and not nullable]
        if plain:
            env["FAST"] = tuple(reading[i][1] for i in plain)
            types = "".join(f"type(v{i}), " for i in plain)
            lines += [f"    if ({types}) != FAST:", "        return careful(body, envelope)"]
        for i, (_, fast, _, nullable) in enumerate(reading):
            if i in plain:
                continue
            if fast is None:  # a check that converts: called as careful calls it
                call = [
                    "    try:",
                    f"        v{i} = check{i}(v{i})",
                    "    except (TypeError, RecursionError):",
                    "        return careful(body, envelope)",
                ]
                if nullable:
                    call = [f"    if v{i} is not None:", *("    " + c for c in call)]
                lines += call
            else:
                unless = f"v{i} is not None and " if nullable else ""
                lines += [
                    f"    if {unless}type(v{i}) is not fast{i}:",
                    "        return careful(body, envelope)",
                ]
        return lines

    def _build(self, env: dict[str, Any], setters: list[Callable[[Any, Any], None]]) -> list[str]:
        """The end of a reader: the instance of the fields ``v0``, ``v1``... (see _twin)."""
        env["new"], env["cls"] = object.__new__, self.cls
        twin = _twin(self.cls)
        if twin is not None:
            env["twin"] = twin
            names = [f.name for f in dataclasses.fields(self.cls)]
            return [
                "    o = new(twin)",
                *(f"    o.{name} = v{i}" for i, name in enumerate(names)),
                "    o.__class__ = cls",
                "    return o",
            ]
        # what the frozen __init__ does, without its object.__setattr__ per field
        lines = ["    o = new(cls)"]
        for i, setter in enumerate(setters):
            env[f"set{i}"] = setter
            lines.append(f"    set{i}(o, v{i})")
        return [*lines, "    return o"]

    def _refuse_unknown(self, body: dict[Any, Any], envelope: frozenset[str]) -> None:
        unknown = body.keys() - self.names - envelope
        if unknown:
            names = ", ".join(sorted(str(k) for k in unknown))
            raise _Bad(None, f"unknown field(s) {names:.200}")

    def _missing(
        self, body: dict[Any, Any], envelope: frozenset[str], i: int, looked: bool
    ) -> Any:
        """The default of field ``i``, missing from ``body``: an added field's, else _Bad.
        An unknown key is named first: ``looked``, ``careful`` found none already (a map
        from an older peer, without the added fields, is looked over once, not per field)."""
        if not looked:
            self._refuse_unknown(body, envelope)
        default = self._defaults[i]
        if default is None:
            raise _Bad(self.names[i], "missing")
        return default()

    def _read_nested(self, v: Any) -> Any:
        if type(v) is not dict:
            raise TypeError(f"expected a map, got {type(v).__name__}")
        try:
            return self.read(v, _NO_ENVELOPE)
        except _Bad as e:
            if e.text == "missing" or e.text.startswith("unknown field"):
                raise TypeError(self._exactly()) from None
            raise TypeError(e.text if e.field is None else f"{e.text} (in {e.field})") from None

    def _exactly(self) -> str:
        optional = [wire for wire, _, _ in self.added]
        text = f"fields must be exactly {', '.join(self.names) or 'none'}"
        return f"{text} ({', '.join(optional)} may be left out)" if optional else text

    def from_map(self, v: Any) -> Any:
        """The instance a map holds; TypeError says what is wrong (an event's data)."""
        return self._read_nested(v)

    # writing

    def write(self, value: Any, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the fields of ``value`` added, checked; raises _Bad naming the field."""
        for wire, attr, fast, write in self._writing:
            v = getattr(value, attr)
            if type(v) is not fast:
                try:
                    v = write(v)
                except (TypeError, ValueError, RecursionError) as e:
                    raise _Bad(wire, str(e)) from None
            body[wire] = v
        return body

    def _write_nested(self, v: Any) -> dict[str, Any]:
        if type(v) is not self.cls:
            raise TypeError(f"expected a {self.cls.__name__}, got {type(v).__name__}")
        try:
            return self.write(v, {})
        except _Bad as e:
            raise TypeError(f"{e.text} (in {e.field})") from None


_NO_ENVELOPE: frozenset[str] = frozenset()


def _dataclasses_in(hints: Iterable[Any]) -> list[type[Any]]:
    """The dataclasses type hints name, inside ``X | None`` and ``tuple[X, ...]`` too."""
    found: list[type[Any]] = []
    for hint in hints:
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            found.append(hint)
        else:
            found += _dataclasses_in(typing.get_args(hint))
    return found


def _default(f: dataclasses.Field[Any], where: str) -> Callable[[], Any]:
    if f.default is not dataclasses.MISSING:
        return functools.partial(_same, f.default)
    assert f.default_factory is not dataclasses.MISSING, f"{where}: added needs a default"
    return f.default_factory


def _slot_setters(cls: type[Any]) -> list[Callable[[Any, Any], None]] | None:
    """The slot setters of a dataclass's fields, in order; None when an instance needs its
    ``__init__`` (no slots, a ``__post_init__``, a field outside ``__init__``)."""
    if hasattr(cls, "__post_init__"):
        return None
    setters = []
    for f in dataclasses.fields(cls):
        slot = cls.__dict__.get(f.name)
        if not f.init or type(slot) is not types.MemberDescriptorType:
            return None
        setters.append(slot.__set__)
    return setters


def _twin(cls: type[Any]) -> type[Any] | None:
    """A plain class with the slots of the frozen dataclass ``cls``, or None when there can
    be none (its slots are not just its fields, it has a base of its own).

    A reader fills an instance of the twin with plain attribute stores, then makes it a
    ``cls`` by assigning ``__class__`` (Python allows it between classes of the same slots):
    a frozen class refuses plain stores, and calling a slot's setter per field costs three
    times as much. Every field is set before the instance becomes a ``cls``, as its
    ``__init__`` would; the twin is never seen outside the reader.
    """
    names = tuple(f.name for f in dataclasses.fields(cls))
    if cls.__bases__ != (object,) or getattr(cls, "__slots__", None) != names:
        return None
    twin = type(f"{cls.__name__}Reading", (), {"__slots__": names, "__module__": __name__})
    try:  # the same layout, checked once here rather than by a reader on its first record
        probe: Any = object.__new__(twin)
        probe.__class__ = cls
    except TypeError:
        return None
    return twin


_SHAPES: dict[type[Any], Shape] = {}


def shape_of(cls: type[Any]) -> Shape:
    """The wire form of a dataclass (built once; built twice by two threads is harmless)."""
    shape = _SHAPES.get(cls)
    if shape is None:
        shape = _SHAPES[cls] = Shape(cls)
    return shape


# --- a codec: a list of kinds --------------------------------------------------------------


class Codec:
    """Encodes and decodes the messages of one protocol (or the records of the log).

    ``version``: the ``v`` every message carries (None: none, the log's records).
    ``noun``: what one is called in errors (``message``, ``record``). ``timestamps``: the
    msgpack timestamp extension for ``datetime`` fields (the log). ``max_frame``: the
    largest frame :meth:`decode` reads unless told otherwise.
    """

    def __init__(
        self,
        name: str,
        classes: Iterable[type[Any]],
        *,
        version: int | None,
        max_frame: int,
        noun: str = "message",
        timestamps: bool = False,
        max_array: int = 100_000,
        max_map: int = 50_000,
    ) -> None:
        self.name, self.version, self.noun, self.max_frame = name, version, noun, max_frame
        self.shapes = {cls: shape_of(cls) for cls in classes}
        self.kinds: dict[type[Any], str] = {cls: s.kind for cls, s in self.shapes.items()}
        self.by_kind = {s.kind: s for s in self.shapes.values()}
        assert len(self.by_kind) == len(self.shapes), f"{name}: two classes of one kind"
        self._envelope = frozenset({"kind"} if version is None else {"v", "kind"})
        self._head: dict[str, Any] = {} if version is None else {"v": version}
        self._timestamps = timestamps
        self._unpack: dict[str, Any] = {
            "max_array_len": max_array, "max_map_len": max_map, "strict_map_key": True,
        }  # fmt: skip
        if timestamps:
            self._unpack["timestamp"] = 3  # datetime, UTC
        self.decode_whole = self._whole_decoder()

    def kind_of(self, msg: Any) -> str:
        """The kind a message (or record) goes by."""
        return self.kinds[type(msg)]

    def to_map(self, msg: Any) -> dict[str, Any]:
        """The checked map of a message, as it goes into msgpack."""
        shape = self.shapes.get(type(msg))
        if shape is None:
            raise WireError(f"cannot encode {type(msg).__name__}: not a {self.name} {self.noun}")
        try:
            return shape.write(msg, {**self._head, "kind": shape.kind})
        except _Bad as e:
            raise WireError(f"{shape.kind}.{e.field}: {e.text}") from None

    def encode(self, msg: Any) -> bytes:
        """The frame of one message; WireError if a field cannot go on the wire."""
        body = self.to_map(msg)
        try:
            return msgpack.packb(body, datetime=self._timestamps)
        except (TypeError, ValueError, OverflowError) as e:  # e.g. text with lone surrogates
            raise WireError(f"{body['kind']}: cannot encode: {e}") from None

    def decode(self, frame: bytes, max_bytes: int | None = None) -> Any:
        """One message from a frame; WireError says what is wrong with it."""
        if type(frame) is not bytes and not isinstance(frame, bytes | bytearray | memoryview):
            raise WireError(f"a frame must be bytes, got {type(frame).__name__}")
        limit = self.max_frame if max_bytes is None else max_bytes
        if len(frame) > limit:
            raise WireError(f"frame of {len(frame)} bytes is over the limit of {limit} bytes")
        try:
            body = msgpack.unpackb(frame, **self._unpack)
        except Exception as e:  # msgpack raises many unrelated types for bad input
            raise WireError(f"not a msgpack {self.noun}: {type(e).__name__}: {e}") from None
        if type(body) is not dict:
            raise WireError(
                f"not a msgpack {self.noun}: a {self.noun} must be a msgpack map, "
                f"got {type(body).__name__}"
            )
        if self.version is not None:
            version = body.get("v")
            if version != self.version or type(version) is not int:
                raise WireError(
                    f"protocol version {version!r:.20} is not supported (this side speaks "
                    f"{self.name} {self.version}); run the same loopd version on both ends",
                    _id_of(body),
                )
        kind = body.get("kind")
        shape = self.by_kind.get(kind) if type(kind) is str else None
        if shape is None:
            known = ", ".join(self.by_kind)
            raise WireError(f"unknown {self.noun} kind {kind!r:.40}; known: {known}", _id_of(body))
        try:
            return shape.read(body, self._envelope)
        except _Bad as e:
            where = kind if e.field is None else f"{kind}.{e.field}"
            raise WireError(f"{where}: {e.text}", _id_of(body)) from None

    def _whole_decoder(self) -> Callable[[Any], Any]:
        """:meth:`decode` for a frame whose size was checked already (a log's record).

        The same steps with the same options, without the layers that only name what is
        wrong: anything that does not decode cleanly is decoded again by :meth:`decode`,
        whose WireError says what is wrong (it never returns otherwise: the steps are the
        same). Opening a long log decodes each record through this.
        """
        unpackb, envelope, version = msgpack.unpackb, self._envelope, self.version
        options = dict(self._unpack)  # decode()'s, each passed on below
        max_array, max_map = options.pop("max_array_len"), options.pop("max_map_len")
        timestamp = options.pop("timestamp", 0)  # 0: msgpack's default
        assert options == {"strict_map_key": True}, f"{self.name}: pass on {options}"
        readers = {kind: shape.read for kind, shape in self.by_kind.items()}
        decode = self.decode

        def decode_whole(frame: Any) -> Any:
            try:
                body = unpackb(
                    frame, max_array_len=max_array, max_map_len=max_map, strict_map_key=True,
                    timestamp=timestamp,
                )  # fmt: skip
                # A map of a known kind: anything else fails here (not a map: TypeError or
                # AttributeError; another kind: KeyError).
                if version is None or _is_int(body["v"], version):
                    return readers[body["kind"]](body, envelope)
            except Exception:  # decode() below says what is wrong
                pass
            return decode(frame)

        return decode_whole

    def added(self) -> list[tuple[str, str, Any, str]]:
        """Every field added later, in the messages and the maps inside them: (kind, field,
        default, when), for the documents' tests."""
        found, todo, seen = [], list(self.shapes.values()), set()
        while todo:
            shape = todo.pop(0)
            if shape.cls not in seen:
                seen.add(shape.cls)
                found += [(shape.kind, *entry) for entry in shape.added]
                todo += shape.inner
        return found


def _is_int(v: Any, n: int) -> bool:
    return type(v) is int and v == n


def _id_of(body: dict[Any, Any]) -> int | None:
    """The message's ``id`` if it is one, for an error's answer (None: it could not be read)."""
    raw = body.get("id")
    return raw if type(raw) is int and 0 <= raw <= MAX_ID else None
