"""The messages between a tool port (DEALER) and a tool host (ROUTER), and their codec.

A table of kinds for :class:`~actors.wire.codec.MessageCodec` (one frame, one msgpack map with
``v``, ``kind`` and the fields by name; ``class`` for :attr:`Result.class_`), which trusts
nothing it decodes and raises only :class:`~actors.base.errors.WireError`. ``ToolRequest``, the
most frequent message, has a fast path that skips the general loop when every field is
already plain.

The answers (``Result``, ``Failed``, ``Denied``, ``PendingApproval``) default their ``id`` to
0, so a :class:`~actors.tools.protocol.provider.ToolProvider` can build them without knowing
the wire id; the host fills it in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeAlias

from actors.base.errors import WireError
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.wire.codec import MessageCodec
from actors.wire.fieldchecks import SCALARS, Check, exact, json_object, member, wire_id

__all__ = [
    "CODEC",
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
    "Unhealthy",
    "WireError",
    "decode",
    "encode",
]

VERSION = 1
DEFAULT_MAX_FRAME = 4 * 1024 * 1024


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
    # The person (or a rule) approved this call after the host answered PendingApproval:
    # the host runs it. It never loosens anything else the host checks.
    approved: bool = False


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
class Unhealthy:
    """Host -> port, in place of ``Pong``: a worker did not come back; restart this host.

    A port that does not know this kind reads it as a bad frame and so sees no pong: after
    three heartbeats it gives the host up, the same ending, only later.
    """

    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Port -> host: the caller gave up on call ``id``; stop it (its answer is not wanted)."""

    id: int


Message: TypeAlias = (
    Hello
    | Tools
    | ToolRequest
    | Result
    | Failed
    | Denied
    | PendingApproval
    | Ping
    | Pong
    | Unhealthy
    | Cancel
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
    Unhealthy: "unhealthy",
    Cancel: "cancel",
}

_result_class = member(ResultClass)

_SPEC_FIELDS: dict[str, Check] = {
    "name": exact(str),
    "description": exact(str),
    "parameters": json_object,
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
        "id": ("id", wire_id),
        "session": ("session", _STR),
        "call": ("call", wire_id),
        "tool": ("tool", _STR),
        "arguments": ("arguments", json_object),
        "approved": ("approved", _BOOL),
    },
    "result": {
        "id": ("id", wire_id),
        "content": ("content", _STR),
        "class": ("class_", _result_class),
        "untrusted": ("untrusted", _BOOL),
    },
    "failed": {"id": ("id", wire_id), "message": ("message", _STR)},
    "denied": {"id": ("id", wire_id), "reason": ("reason", _STR)},
    "pending_approval": {"id": ("id", wire_id), "prompt": ("prompt", _STR)},
    "ping": {},
    "pong": {},
    "unhealthy": {"reason": ("reason", _STR)},
    "cancel": {"id": ("id", wire_id)},
}


def _plain(value: Any) -> Any:
    if type(value) in SCALARS:  # the usual case, before the slower isinstance checks
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


CODEC = MessageCodec(name="tool wire", version=VERSION, kinds=_KIND, fields=_FIELDS, plain=_plain)


def encode(msg: Message) -> bytes:
    """The frame of one message; WireError if a field cannot go on the wire."""
    if type(msg) is ToolRequest:  # the most frequent message, built without the general loop
        return _encode_request(msg)
    return CODEC.encode(msg)


def _encode_request(msg: ToolRequest) -> bytes:
    try:
        wire_id(msg.id)
        wire_id(msg.call)
        _STR(msg.session)
        _STR(msg.tool)
        json_object(msg.arguments)
        _BOOL(msg.approved)
    except TypeError:  # the general path says which field is wrong, or converts Mappings
        return CODEC.encode(msg)
    body = {
        "v": VERSION,
        "kind": "request",
        "id": msg.id,
        "session": msg.session,
        "call": msg.call,
        "tool": msg.tool,
        "arguments": msg.arguments,
        "approved": msg.approved,
    }
    return CODEC.pack("request", body)


def decode(frame: bytes, max_bytes: int = DEFAULT_MAX_FRAME) -> Message:
    """One message from a frame; WireError says what is wrong with it."""
    msg: Message = CODEC.decode(frame, max_bytes)
    return msg
