"""The loopd client protocol, version 1: how a client talks to ``loopd serve``.

This docstring is the protocol document: a client in any language can be written from it.
The Python client is :mod:`actors.daemon.client`; the daemon's side is
:mod:`actors.daemon.server.loop`.

Transport
---------
ZeroMQ. The daemon binds a ROUTER socket; a client connects a DEALER. Where:

- ``ipc://RUNTIME_DIR/loopd.sock`` by default, ``RUNTIME_DIR`` being ``daemon.runtime_dir``
  or ``$XDG_RUNTIME_DIR/loopd`` or ``/tmp/loopd-UID``, a directory of mode 0700 (only its
  owner can reach the socket). ``RUNTIME_DIR/loopd.pid`` holds the daemon's pid.
- ``tcp://HOST:PORT`` only with CURVE (ZeroMQ's CurveZMQ): the daemon has a key pair made
  by ``loopd keys`` and admits the clients whose ``.key`` files are in its allow directory;
  a client with another key is refused in the handshake and gets nothing, not even an error.

One message is one ZeroMQ frame holding one msgpack map: ``v`` (the version, the integer
1), ``kind`` (text, below) and the kind's fields by name, exactly those: a missing field,
an unknown field, a field of the wrong type, an unknown kind, another version, a frame of
more than one part or over ``daemon.max_frame_bytes`` (4 MiB) is refused. The daemon
answers a refused message with ``error`` (with the message's ``id`` when it could be read,
else 0) and goes on; nothing a peer sends ends the daemon. Integers are msgpack integers
(never booleans), ``id`` a request id the client chooses: a non-negative 63-bit integer,
unique among the client's requests in flight. Every answer carries its request's ``id``.

Heartbeats
----------
The client sends ``ping`` at least every ``daemon.heartbeat_s`` (1 s) and the daemon
answers ``pong``. A client silent for three heartbeats is gone: its turns are cancelled
(as with ``cancel``) and its sessions detached. A daemon silent for three heartbeats is
gone for the client.

Sessions
--------
A session is attached to at most one client at a time. ``open`` attaches it (creating it
when ``create`` is true and it does not exist); ``turn`` on a session the client has not
opened opens it first. Another client asking for it gets an ``error`` whose ``error`` is
``SessionInUse``: "session NAME is in use by another client". ``close`` detaches it; a
client's ``bye``, or its silence, detaches all of its sessions.

Messages, client to daemon
--------------------------
==============  =============================================  ===============================
kind            fields                                         answer
==============  =============================================  ===============================
``ping``        (none)                                         ``pong``
``bye``         (none): the client leaves (its turns are       (none)
                cancelled, its sessions detached)
``open``        ``id``, ``session`` text, ``create`` bool      ``opened``
``close``       ``id``, ``session``                            ``ok``
``turn``        ``id``, ``session``, ``text``, ``approve``     ``event``... then ``done``
                list of text (allow rules for this turn
                only, like ``tools.allow`` entries)
``cancel``      ``id`` (of the turn)                           the turn ends: ``error``
                                                               ``Cancelled``
``approve``     ``id`` (of the turn), ``call`` int,            (the turn goes on)
                ``choice`` text, ``reason`` text,
                ``by`` text
``sessions``    ``id``                                         ``session_list``
``read_log``    ``id``, ``session``, ``start`` int             ``log``
``status``      ``id``                                         ``status_reply``
``stop``        ``id``                                         ``ok``, then the daemon stops
==============  =============================================  ===============================

Messages, daemon to client
--------------------------
- ``pong``: (none).
- ``opened``: ``id``, ``session``, ``created`` bool, ``records`` int (in its log),
  ``cut_bytes`` int (a torn last record, left by a crash, that opening cut; 0: none. A
  ``turn`` that opens its session sends this as a ``torn_tail`` event instead).
- ``ok``: ``id``.
- ``event``: ``id`` (of the turn), ``event`` text, ``data`` map: one event of the turn as it
  happens, the same as ``loopd run --json`` prints (``event`` is its name, ``data`` its
  fields): ``queued``, ``waiting``, ``progress``, ``reasoning``, ``content``,
  ``thinking_capped``, ``retrying``, ``tool_call_started``, ``tool_result``, ``cache_loss``,
  ``torn_tail``, ``approval_requested`` and ``approval_decided`` (see ``actors/base/events.py``
  for each one's fields; a new event is a new protocol version).
- ``done``: ``id``, ``content`` text (the answer), ``iterations`` int, ``tool_calls`` int,
  ``cut`` bool (the answer stopped at ``loop.max_tokens``), ``usage`` bin (the turn's last
  ``Usage`` record in the log's own encoding, docs/log.md#encoding: a msgpack map with
  ``kind`` and ``time`` as msgpack's timestamp extension), ``restored`` map or nil (what the
  slot keeper restored: ``server``, ``slot``, ``state``, ``restored``, ``restore_ms``,
  ``reason``).
- ``error``: ``id``, ``error`` text (the error's class: ``SessionInUse``, ``Cancelled``,
  ``TurnLimit``, ``SessionFull``, ``InferError``, ``WireError``...), ``message`` text (for
  the person), ``exit_code`` int (what ``loopd`` exits with for it).
- ``session_list``: ``id``, ``names`` list of text.
- ``log``: ``id``, ``records`` list of bin (each a record in the log's encoding, from number
  ``start``, 0 being the Baseline), ``next`` int (the ``start`` of the next page),
  ``done`` bool (no more records). Pages stay under half the frame limit.
- ``status_reply``: ``id``, ``pid`` int, ``endpoint`` text, ``uptime_s`` float, ``clients`` int,
  ``sessions`` list of maps ``{"name": text, "busy": bool}`` (the attached sessions),
  ``workspace`` text (the root of its file tools, an absolute path: a client that works in
  another directory, like ``loopd acp`` for an editor's project, runs in its own process).
- ``approval``: ``id`` (of the turn), ``call`` int, ``tool`` text, ``arguments`` text (the
  call's arguments as JSON), ``prompt`` text, ``rule`` text (what a ``session`` or
  ``always`` answer grants; "" when only ``once`` or ``deny`` apply), ``timeout_s`` float
  (how long the turn waits; 0: no limit). A tool call needs the person's approval
  (docs/approval.md): the turn waits for the client's ``approve`` of that ``call``: ``choice``
  ``once`` (this call), ``session`` (calls the rule matches, for the rest of the session),
  ``always`` (saved in the rules file), ``deny`` (``reason``: for the model), or ``never``
  (denied, and saved in the rules file as a deny rule); ``by``: who answered (``person``,
  or e.g. ``no terminal`` when the client had nobody to ask). No answer within
  ``timeout_s`` is a denial that says so. A client gone, or a ``cancel``, while the turn
  waits cancels the turn: the call does not run. The same question also arrives as an
  ``approval_requested`` event, for views.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeAlias

from actors.base import events as ev
from actors.base.errors import WireError
from actors.base.events import Choice
from actors.log.records import SlotUse, check_slot_use
from actors.tools.protocol.wire import Ping, Pong  # the heartbeat of both protocols
from actors.wire.codec import MessageCodec
from actors.wire.fieldchecks import Check, exact, json_data, json_object, member, wire_id

__all__ = [
    "CODEC", "VERSION", "Approval", "Approve", "Bye", "Cancel", "Close", "Done", "Error",
    "EventMessage", "Log", "Message", "Ok", "Open", "Opened", "Ping", "Pong", "ReadLog",
    "SessionList", "Sessions", "Status", "StatusReply", "Stop", "Turn", "decode",
    "decode_event", "encode", "encode_event",
]  # fmt: skip

VERSION = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Bye:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Open:
    id: int
    session: str
    create: bool = True


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    id: int
    session: str
    created: bool
    records: int
    cut_bytes: int  # a torn last record cut when the daemon opened the log (0: none)


@dataclasses.dataclass(frozen=True, slots=True)
class Close:
    id: int
    session: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ok:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    id: int
    session: str
    text: str
    approve: tuple[str, ...] = ()  # allow rules for this turn only (loopd run --approve)


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class Approve:
    id: int
    call: int
    choice: Choice
    reason: str = ""
    by: str = "person"


@dataclasses.dataclass(frozen=True, slots=True)
class Sessions:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class SessionList:
    id: int
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReadLog:
    id: int
    session: str
    start: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Log:
    id: int
    records: tuple[bytes, ...]
    next: int
    done: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Status:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class StatusReply:
    id: int
    pid: int
    endpoint: str
    uptime_s: float
    clients: int
    sessions: tuple[Mapping[str, Any], ...]
    workspace: str = ""  # the file tools' root (tools.workspace, resolved) of the daemon


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    id: int


@dataclasses.dataclass(frozen=True, slots=True)
class EventMessage:
    id: int
    event: str
    data: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    id: int
    content: str
    iterations: int
    tool_calls: int
    cut: bool
    usage: bytes
    restored: SlotUse | None


@dataclasses.dataclass(frozen=True, slots=True)
class Error:
    id: int
    error: str
    message: str
    exit_code: int


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    id: int
    call: int
    tool: str
    arguments: str
    prompt: str
    rule: str
    timeout_s: float


Message: TypeAlias = Any  # one of the classes above

_KINDS: dict[type[Any], str] = {
    Ping: "ping", Pong: "pong", Bye: "bye", Open: "open", Opened: "opened", Close: "close",
    Ok: "ok", Turn: "turn", Cancel: "cancel", Approve: "approve", Sessions: "sessions",
    SessionList: "session_list", ReadLog: "read_log", Log: "log", Status: "status",
    StatusReply: "status_reply", Stop: "stop", EventMessage: "event", Done: "done", Error: "error",
    Approval: "approval",
}  # fmt: skip

_STR, _BOOL, _INT = exact(str), exact(bool), exact(int)


def _number(v: Any) -> float:
    return float(exact(float, int)(v))


def _texts(v: Any) -> tuple[str, ...]:
    if type(v) is not list:
        raise TypeError(f"expected a list of text, got {type(v).__name__}")
    return tuple(_STR(x) for x in v)


def _blobs(v: Any) -> tuple[bytes, ...]:
    if type(v) is not list:
        raise TypeError(f"expected a list of bin, got {type(v).__name__}")
    return tuple(exact(bytes)(x) for x in v)


def _session_rows(v: Any) -> tuple[Mapping[str, Any], ...]:
    if type(v) is not list:
        raise TypeError(f"expected a list of maps, got {type(v).__name__}")
    rows = []
    for row in v:
        if type(row) is not dict or set(row) != {"name", "busy"}:
            raise TypeError("a session row is a map of exactly name and busy")
        rows.append({"name": _STR(row["name"]), "busy": _BOOL(row["busy"])})
    return tuple(rows)


def _restored(v: Any) -> SlotUse | None:
    return None if v is None else check_slot_use(v)


def _f(**checks: Check) -> dict[str, tuple[str, Check]]:
    return {name: (name, check) for name, check in checks.items()}


_FIELDS: dict[str, dict[str, tuple[str, Check]]] = {
    "ping": {},
    "pong": {},
    "bye": {},
    "open": _f(id=wire_id, session=_STR, create=_BOOL),
    "opened": _f(id=wire_id, session=_STR, created=_BOOL, records=wire_id, cut_bytes=wire_id),
    "close": _f(id=wire_id, session=_STR),
    "ok": _f(id=wire_id),
    "turn": _f(id=wire_id, session=_STR, text=_STR, approve=_texts),
    "cancel": _f(id=wire_id),
    "approve": _f(id=wire_id, call=wire_id, choice=member(Choice), reason=_STR, by=_STR),
    "sessions": _f(id=wire_id),
    "session_list": _f(id=wire_id, names=_texts),
    "read_log": _f(id=wire_id, session=_STR, start=wire_id),
    "log": _f(id=wire_id, records=_blobs, next=wire_id, done=_BOOL),
    "status": _f(id=wire_id),
    "status_reply": _f(
        id=wire_id, pid=wire_id, endpoint=_STR, uptime_s=_number, clients=wire_id,
        sessions=_session_rows, workspace=_STR,
    ),
    "stop": _f(id=wire_id),
    "event": _f(id=wire_id, event=_STR, data=json_object),
    "done": _f(
        id=wire_id, content=_STR, iterations=wire_id, tool_calls=wire_id, cut=_BOOL,
        usage=exact(bytes), restored=_restored,
    ),
    "error": _f(id=wire_id, error=_STR, message=_STR, exit_code=_INT),
    "approval": _f(
        id=wire_id, call=wire_id, tool=_STR, arguments=_STR, prompt=_STR, rule=_STR,
        timeout_s=_number,
    ),
}


def _plain(value: Any) -> Any:
    t = type(value)
    if t is str or t is int or t is float or t is bool or t is bytes or value is None:
        return value
    if isinstance(value, SlotUse):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "value"):  # an enum
        return value.value
    return value


CODEC = MessageCodec(
    name="loopd client protocol", version=VERSION, kinds=_KINDS, fields=_FIELDS, plain=_plain,
    max_array=1_000_000,
)


def encode(msg: Message) -> bytes:
    """The frame of one message; WireError if a field cannot go on the wire."""
    return CODEC.encode(msg)


def decode(frame: bytes, max_bytes: int) -> Message:
    """One message from a frame; WireError says what is wrong with it."""
    return CODEC.decode(frame, max_bytes)


# --- events: the turn's events by their --json names ---------------------------------------

_ANNOTATION_CHECKS: dict[str, Check] = {
    "str": _STR, "int": _INT, "bool": _BOOL, "float": _number,
    "str | None": lambda v: None if v is None else _STR(v),
    "int | None": lambda v: None if v is None else _INT(v),
    "Mapping[str, Any]": json_object, "dict[str, Any]": json_object, "Any": json_data,
}  # fmt: skip


def _event_table() -> dict[str, tuple[type[Any], dict[str, tuple[str, Check]]]]:
    """Event name -> (class, its fields by --json name with their checks)."""
    table = {}
    for cls in typing.get_args(ev.Event):
        fields = {}
        for f in dataclasses.fields(cls):
            check = _ANNOTATION_CHECKS.get(str(f.type))
            assert check is not None, f"{cls.__name__}.{f.name}: no check for {f.type}"
            fields[f.name.rstrip("_")] = (f.name, check)
        table[ev.event_name(_sample(cls))] = (cls, fields)
    return table


def _sample(cls: type[Any]) -> Any:
    """An instance of event ``cls`` (its name is a function of the instance's class)."""
    return object.__new__(cls)


_EVENTS = _event_table()


def encode_event(turn: int, event: ev.Event) -> EventMessage:
    data = ev.to_json(event)
    return EventMessage(id=turn, event=data.pop("event"), data=data)


def decode_event(msg: EventMessage) -> ev.Event:
    """The event an ``event`` message carries; WireError when it is not a known, valid one."""
    entry = _EVENTS.get(msg.event)
    if entry is None:
        raise WireError(f"event: unknown event {msg.event!r:.40}", msg.id)
    cls, fields = entry
    if set(msg.data) != set(fields):
        raise WireError(
            f"event {msg.event}: fields must be exactly {', '.join(fields) or 'none'}", msg.id
        )
    try:
        values = {attr: check(msg.data[name]) for name, (attr, check) in fields.items()}
    except TypeError as e:
        raise WireError(f"event {msg.event}: {e}", msg.id) from None
    event: ev.Event = cls(**values)
    return event
