"""The messages between a tool port (DEALER) and a tool host (ROUTER), and their codec.

One message is one ZeroMQ frame holding one msgpack map: ``v`` (the protocol version),
``kind``, and the message's fields by name (``class`` for :attr:`Result.class_`). The peer
on the other side may be buggy, old, or hostile, so :func:`decode` trusts nothing: the frame
size is checked before msgpack sees it, msgpack runs with small container limits, and every
field's type is checked, unknown fields included. Anything wrong raises :class:`WireError`
with what was wrong (and the request id when one could be read), never another exception.

The answers (``Result``, ``Failed``, ``Denied``, ``PendingApproval``) default their ``id`` to
0, so a :class:`~actors.tools.protocol.provider.ToolProvider` can build them without knowing
the wire id; the host fills it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeAlias

import msgpack

from actors.checks import Check, exact, member
from actors.errors import WireError
from actors.tools.protocol.spec import ResultClass, ToolSpec

__all__ = [
    "DEFAULT_MAX_FRAME",
    "VERSION",
    "Answer",
    "Cancel",
    "Denied",
    "Failed",
    "Hello",
    "Message",
    "PendingApproval",
    "Ping",
    "Pong",
    "Result",
    "ToolRequest",
    "Tools",
    "WireError",
    "decode",
    "encode",
]

VERSION = 1
DEFAULT_MAX_FRAME = 4 * 1024 * 1024
MAX_DEPTH = 64  # nesting of arguments and schemas
_MAX_ARRAY = 100_000
_MAX_MAP = 50_000
_MAX_ID = 2**63 - 1


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """Port -> host on (re)connect: please answer with your tools."""


@dataclasses.dataclass(frozen=True, slots=True)
class Tools:
    tools: tuple[ToolSpec, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolRequest:
    id: int
    session: str
    call: int
    tool: str
    arguments: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    id: int = 0
    content: str = ""
    class_: ResultClass = ResultClass.PUBLIC
    untrusted: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    id: int = 0
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Denied:
    id: int = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingApproval:
    id: int = 0
    prompt: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Port -> host: the caller gave up on call ``id``; stop it (its answer is not wanted)."""

    id: int


Message: TypeAlias = (
    Hello | Tools | ToolRequest | Result | Failed | Denied | PendingApproval | Ping | Pong | Cancel
)
Answer: TypeAlias = Result | Failed | Denied | PendingApproval

_KIND: dict[type[Any], str] = {
    Hello: "hello",
    Tools: "tools",
    ToolRequest: "request",
    Result: "result",
    Failed: "failed",
    Denied: "denied",
    PendingApproval: "pending_approval",
    Ping: "ping",
    Pong: "pong",
    Cancel: "cancel",
}
_BY_KIND = {k: cls for cls, k in _KIND.items()}

# --- field checks: each returns the Python value or raises TypeError ---------------------

def _id(v: Any) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_ID:
        raise TypeError(f"expected a non-negative integer id, got {v!r:.40}")
    return v


def _json(v: Any, depth: int = 0) -> Any:
    """Check that ``v`` is JSON-shaped data (what a tool argument or schema may hold).

    Returns ``v`` itself: it only looks (a copy per call cost more than the rest of decode).
    """
    if depth > MAX_DEPTH:
        raise TypeError(f"nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if t is list:
        for x in v:
            if type(x) not in _SCALARS:
                _json(x, depth + 1)
        return v
    if t is dict:
        for k, x in v.items():
            if type(k) is not str:
                raise TypeError(f"map keys must be text, got {type(k).__name__}")
            if type(x) not in _SCALARS:
                _json(x, depth + 1)
        return v
    raise TypeError(f"{t.__name__} is not JSON data")


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _object(v: Any) -> dict[str, Any]:
    if type(v) is not dict:
        raise TypeError(f"expected a map, got {type(v).__name__}")
    result: dict[str, Any] = _json(v)
    return result


_result_class = member(ResultClass)

_SPEC_FIELDS: dict[str, Check] = {
    "name": exact(str),
    "description": exact(str),
    "parameters": _object,
    "result_class": _result_class,
    "needs_approval": exact(bool),
    "untrusted": exact(bool),
}


def _tools(v: Any) -> tuple[ToolSpec, ...]:
    if type(v) is not list:
        raise TypeError(f"expected a list of tools, got {type(v).__name__}")
    specs = []
    for i, item in enumerate(v):
        if type(item) is not dict:
            raise TypeError(f"tool {i}: expected a map, got {type(item).__name__}")
        if set(item) != set(_SPEC_FIELDS):
            raise TypeError(f"tool {i}: fields must be exactly {', '.join(_SPEC_FIELDS)}")
        try:
            specs.append(ToolSpec(**{k: check(item[k]) for k, check in _SPEC_FIELDS.items()}))
        except TypeError as e:
            raise TypeError(f"tool {i}: {e}") from None
    return tuple(specs)


_STR, _BOOL = exact(str), exact(bool)

# wire name -> (attribute name, check), per kind
_FIELDS: dict[str, dict[str, tuple[str, Check]]] = {
    "hello": {},
    "tools": {"tools": ("tools", _tools)},
    "request": {
        "id": ("id", _id),
        "session": ("session", _STR),
        "call": ("call", _id),
        "tool": ("tool", _STR),
        "arguments": ("arguments", _object),
    },
    "result": {
        "id": ("id", _id),
        "content": ("content", _STR),
        "class": ("class_", _result_class),
        "untrusted": ("untrusted", _BOOL),
    },
    "failed": {"id": ("id", _id), "message": ("message", _STR)},
    "denied": {"id": ("id", _id), "reason": ("reason", _STR)},
    "pending_approval": {"id": ("id", _id), "prompt": ("prompt", _STR)},
    "ping": {},
    "pong": {},
    "cancel": {"id": ("id", _id)},
}


def _plain(value: Any) -> Any:
    if type(value) in _SCALARS:  # the usual case, before the slower isinstance checks
        return value
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, ResultClass):
        return value.value
    if isinstance(value, ToolSpec):
        return {
            "name": value.name,
            "description": value.description,
            "parameters": _plain(value.parameters),
            "result_class": ResultClass(value.result_class).value,
            "needs_approval": value.needs_approval,
            "untrusted": value.untrusted,
        }
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def encode(msg: Message) -> bytes:
    """The frame of one message; WireError if a field cannot go on the wire."""
    if type(msg) is ToolRequest:  # the most frequent message, built without the loop below
        return _encode_request(msg)
    kind = _KIND.get(type(msg))
    if kind is None:
        raise WireError(f"cannot encode {type(msg).__name__}: not a wire message")
    return _encode_fields(kind, msg)


def _encode_fields(kind: str, msg: Message) -> bytes:
    body: dict[str, Any] = {"v": VERSION, "kind": kind}
    for wire_name, (attr, check) in _FIELDS[kind].items():
        value = _plain(getattr(msg, attr))
        try:
            check(value)
        except TypeError as e:
            raise WireError(f"{kind}.{wire_name}: {e}") from None
        body[wire_name] = value
    try:
        return msgpack.packb(body)
    except (TypeError, ValueError, OverflowError) as e:  # e.g. text with lone surrogates
        raise WireError(f"{kind}: cannot encode: {e}") from None


def _encode_request(msg: ToolRequest) -> bytes:
    try:
        _id(msg.id)
        _id(msg.call)
        _STR(msg.session)
        _STR(msg.tool)
        _object(msg.arguments)
    except TypeError:  # the general path says which field is wrong, or converts Mappings
        return _encode_fields("request", msg)
    body = {
        "v": VERSION,
        "kind": "request",
        "id": msg.id,
        "session": msg.session,
        "call": msg.call,
        "tool": msg.tool,
        "arguments": msg.arguments,
    }
    try:
        return msgpack.packb(body)
    except (TypeError, ValueError, OverflowError) as e:  # e.g. text with lone surrogates
        raise WireError(f"request: cannot encode: {e}") from None


def decode(frame: bytes, max_bytes: int = DEFAULT_MAX_FRAME) -> Message:
    """One message from a frame; WireError says what is wrong with it."""
    if not isinstance(frame, bytes | bytearray | memoryview):
        raise WireError(f"a frame must be bytes, got {type(frame).__name__}")
    if len(frame) > max_bytes:
        raise WireError(f"frame of {len(frame)} bytes is over the limit of {max_bytes} bytes")
    try:
        body = msgpack.unpackb(
            frame,
            max_array_len=_MAX_ARRAY,
            max_map_len=_MAX_MAP,
            strict_map_key=True,
        )
    except Exception as e:  # msgpack raises many unrelated types for bad input
        raise WireError(f"not a msgpack message: {type(e).__name__}: {e}") from None
    if type(body) is not dict:
        raise WireError(f"a message must be a msgpack map, got {type(body).__name__}")
    raw_id = body.get("id")
    known_id = raw_id if type(raw_id) is int and 0 <= raw_id <= _MAX_ID else None
    version = body.get("v")
    if version != VERSION or type(version) is not int:
        raise WireError(
            f"protocol version {version!r:.20} is not supported (this side speaks {VERSION}); "
            "run the same loopd version on both ends",
            known_id,
        )
    kind = body.get("kind")
    fields = _FIELDS.get(kind) if type(kind) is str else None
    if fields is None:
        raise WireError(f"unknown message kind {kind!r:.40}; known: {', '.join(_FIELDS)}", known_id)
    if len(body) != len(fields) + 2 or not body.keys() >= fields.keys():  # the usual case: no
        unknown = set(body) - set(fields) - {"v", "kind"}
        if unknown:
            names = ", ".join(sorted(str(k) for k in unknown))
            raise WireError(f"{kind}: unknown field(s) {names:.200}", known_id)
    values: dict[str, Any] = {}
    for wire_name, (attr, check) in fields.items():
        if wire_name not in body:
            raise WireError(f"{kind}.{wire_name}: missing", known_id)
        try:
            values[attr] = check(body[wire_name])
        except (TypeError, RecursionError) as e:
            raise WireError(f"{kind}.{wire_name}: {e}", known_id) from None
    msg: Message = _BY_KIND[str(kind)](**values)
    return msg
