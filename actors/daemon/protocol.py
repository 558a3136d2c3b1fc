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
1), ``kind`` (text, below) and the kind's fields by name, exactly those: a missing field
(but those added later, at the end), an unknown field, a field of the wrong type, an
unknown kind, another version, a frame of more than one part or over
``daemon.max_frame_bytes`` (4 MiB) is refused. The daemon answers a refused message with
``error`` (with the message's ``id`` when it could be read, else 0) and goes on; nothing a
peer sends ends the daemon. Integers are msgpack integers (never booleans), ``id`` a
request id the client chooses: a non-negative 63-bit integer, unique among the client's
requests in flight. Every answer carries its request's ``id``.

One exception, daemon to client, asked for by the client: a ``turn`` with ``batch`` true
gets its messages (``event``, ``approval``, then ``done`` or ``error``) in ZeroMQ
multipart messages, each part one message as above, in order (at most 64 parts and 512 KiB
a multipart message; a larger part goes alone): the messages the turn made while the
daemon was busy sending leave together. A client reads every part of what it receives.

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
``open``        ``id``, ``session`` text, ``create`` bool,     ``opened``
                ``servers`` list of maps (the session's own
                MCP servers, below)
``close``       ``id``, ``session``                            ``ok``
``turn``        ``id``, ``session``, ``text``, ``approve``     ``event``... then ``done``
                list of text (allow rules for this turn
                only, like ``tools.allow`` entries),
                ``traceparent`` text (the client's W3C
                trace context: the turn's spans join it),
                ``batch`` bool (its answers may come
                several to a multipart message: above)
``cancel``      ``id`` (of the turn)                           the turn ends: ``error``
                                                               ``Cancelled``
``approve``     ``id`` (of the turn), ``call`` int,            (the turn goes on)
                ``choice`` text, ``reason`` text,
                ``by`` text
``sessions``    ``id``                                         ``session_list``
``read_log``    ``id``, ``session``, ``start`` int             ``log``
``status``      ``id``                                         ``status_reply``
``stop``        ``id``                                         ``ok``, then the daemon stops
``fork``        ``id``, ``source`` text, ``session`` text      ``forked``
                (the new one), ``at`` int or nil (the
                source's turn to fork at; nil: all)
``rewind``      ``id``, ``session``, ``turns`` int (how many   ``rewound``
                turns to take back, 1 or more)
``compact``     ``id``, ``session``                            ``compacted``
``remove``      ``id``, ``session``                            ``ok``
``state``       ``id``, ``session``                            ``session_state``
==============  =============================================  ===============================

Messages, daemon to client
--------------------------
- ``pong``: (none).
- ``opened``: ``id``, ``session``, ``created`` bool, ``records`` int (in its log),
  ``cut_bytes`` int (a torn last record, left by a crash, that opening cut; 0: none. A
  ``turn`` that opens its session sends this as a ``torn_tail`` event instead),
  ``context`` int (the tokens a slot of the session's model server holds; 0: not known),
  ``servers`` list of text (the session's own MCP servers started), ``tools`` list of text
  (their tools, by the names the model calls them), ``notes`` list of text (one line per
  server that did not start, or tool offered under another name: the server and the fix).
- ``ok``: ``id``.
- ``event``: ``id`` (of the turn), ``event`` text, ``data`` map: one event of the turn as it
  happens, the same as ``loopd run --json`` prints (``event`` is its name, ``data`` its
  fields): ``queued``, ``waiting``, ``progress``, ``reasoning``, ``content``,
  ``thinking_capped``, ``retrying``, ``tool_call_started``, ``tool_result``, ``cache_loss``,
  ``torn_tail``, ``approval_requested``, ``approval_decided``, ``compacting``,
  ``compacted``, ``answer_cut``, ``agent_started`` and ``agent_done`` (see
  ``actors/base/events.py`` for each one's fields; a new event is a new protocol version,
  but for those listed under "Fields added later"). An event of a child agent's turn is
  the event itself with one more field, ``agent`` (the child's session; docs/agents.md).
- ``done``: ``id``, ``content`` text (the answer), ``iterations`` int, ``tool_calls`` int,
  ``cut`` bool (the answer stopped at ``loop.max_tokens``), ``usage`` bin (the turn's last
  ``Usage`` record in the log's own encoding, docs/log.md#encoding: a msgpack map with
  ``kind`` and ``time`` as msgpack's timestamp extension), ``restored`` map or nil (what the
  slot keeper restored: ``server``, ``slot``, ``state``, ``restored``, ``restore_ms``,
  ``reason``), ``context`` int (the tokens the session's slot holds, to say how full the
  conversation is; 0: not known), ``compactions`` int (how many times the turn compacted
  the conversation; docs/rendering.md#compaction).
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
  another directory, like ``loopd acp`` for an editor's project, runs in its own process),
  ``model`` text (what answers: the model and its server, for the person).
- ``forked``: ``id``, ``session`` (the new one), ``source``, ``at`` int (the source's turns
  copied), ``records`` int (copied), ``state_tokens`` int (tokens of the source's saved KV
  state that the new session starts from; 0: none, its first request re-processes).
  A fork reads the source whatever client it is attached to (only whole records: one
  running a turn is forked as far as it has written), saves the source's KV state first when
  it changed, and never opens either session; a ``session`` that exists is refused.
- ``rewound``: ``id``, ``session``, ``to_turn`` int (the ``Rewind`` record's),
  ``taken`` list of int (the turns taken back), ``left`` list of int (the turns the
  conversation still shows). A rewind is refused on a session attached to another client
  (``SessionInUse``) and while a turn runs on it; one not attached is opened for it and
  closed again.
- ``compacted``: ``id``, ``session``, ``tokens_before`` int, ``tokens_after`` int (about),
  ``turns_kept`` int, ``ms`` float: the conversation was compacted
  (docs/rendering.md#compaction: a ``Compaction`` record; the summary is the model's or
  elided, as ``session.compaction`` says). Nothing to compact (the conversation is one
  turn) is ``error`` ``UsageError``. The same rule as ``rewind``: refused on a session
  attached to another client (``SessionInUse``) and while a turn runs on it; one not
  attached is opened for it and closed again.
- ``session_state``: ``id``, ``session``, ``records`` int (in its log now), ``turns`` int
  (its User records), ``attached`` bool (a client has it open), ``busy`` bool (a turn runs
  on it), ``workspace`` text (the workspace it was made with; "": not known). A session
  that does not exist is ``error`` ``SessionError``.
- ``ok`` to ``remove``: the session's log directory and its saved KV state are deleted.
  Refused on a session attached to any client (``SessionInUse``; close it first), and
  (``SessionLocked``) while another process has it open.
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

Fields added later
------------------
A field added to a message that peers already send has a default, and a message without
it reads as that default, so an older peer keeps working under the same ``v``; the version
changes only for what an older peer cannot read. Added to version 1:

- ``opened.cut_bytes`` (default 0: nothing was cut), when a torn tail cut by the daemon
  came to be shown to the client (9b06d21);
- ``turn.approve`` (default an empty list: no rules for this turn), with ``loopd run
  --approve`` through the daemon (e06167b);
- ``status_reply.workspace`` (default "": not said; a client cannot tell where the daemon's
  tools work), with ``loopd acp`` (6e179f4);
- ``status_reply.model`` (default "": not said), when ``loopd status`` came to show it;
- ``opened.context`` (default 0: not known) and ``done.context`` (default 0: not known),
  when chat came to say how full a session is;
- ``done.compactions`` (default 0: none), with compaction;
- ``turn.traceparent`` (default "": the turn's trace starts in the daemon), with traces
  (docs/telemetry.md): the ``00-TRACEID-SPANID-FLAGS`` of the client's current span;
- ``turn.batch`` (default false: one message a ZeroMQ message), when a turn's events came
  to leave together (each had crossed the socket and two threads on either side alone);
- ``open.servers`` (default an empty list: none), ``opened.servers`` (default an empty
  list), ``opened.tools`` (default an empty list) and ``opened.notes`` (default an empty
  list), with a session's own MCP servers (an editor's, through ``loopd acp``,
  docs/acp.md): each server a map ``name`` text, ``command`` list of text (stdio), ``env``
  list of ``NAME=value`` text, ``url`` text (streamable HTTP), ``headers`` list of
  ``Name: value`` text. They run in the daemon as tool hosts of that session alone,
  replace those it had (an empty list stops them), and stop when it is closed or its
  client goes;
- ``approval.child`` (default "": the turn's own call), with agents (docs/agents.md): the
  child agent session whose call asks, its ``call`` number being that session's own.

``fork``, ``forked``, ``rewind`` and ``rewound`` are new messages of version 1 (fork and rewind): a
daemon from before answers them ``error`` (an unknown kind).
``remove``, ``state`` and ``session_state`` are new messages of version 1 (the
session service): a daemon from before answers them ``error`` (an unknown kind).
``compact`` and ``compacted`` are new messages of version 1 (compaction), like ``fork``; the
events ``compacting`` and ``compacted`` are new in version 1 too: a client from
before ends a turn that compacts with a WireError (an unknown event). So does the event
``answer_cut``, new in version 1 with the runaway-text limit, for a turn whose answer loopd
cut (``done.usage`` says why in its ``cut``).
The events ``agent_started`` and ``agent_done``, and the ``agent`` field of a child's
events, are new in version 1 with the agent tool: a client from before ends a turn that
starts agents with a WireError (an unknown event); a turn without agents sends none.

``approve`` and ``approval`` took their present fields when approvals first travelled to
clients (3286a6d); before, the daemon never sent ``approval``. The ``approve`` choice
``never`` came later (6e179f4): a daemon from before refuses it (an unknown value).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias, TypeVar

from actors.base import events as ev
from actors.base.errors import WireError
from actors.base.events import Choice
from actors.log.records import SlotUse
from actors.service import types as svc
from actors.wire.codec import CHECK, Codec, Natural, added, shape_of

__all__ = [
    "CODEC", "VERSION", "Approval", "Approve", "Bye", "Cancel", "Close", "Compact",
    "CompactReply", "Done", "Error",
    "EventMessage", "Fork", "ForkReply", "Log", "Message", "Ok", "Open", "Opened", "Ping",
    "Pong", "ReadLog", "Remove", "Rewind", "Rewound", "SessionList", "SessionState",
    "SessionStatus", "Sessions", "Status",
    "StatusReply", "Stop", "Turn", "decode",
    "decode_event", "encode", "encode_event", "reply", "result",
]  # fmt: skip

VERSION = 1
MAX_FRAME = 4 * 1024 * 1024  # daemon.max_frame_bytes's default; both ends pass theirs


def _session_rows(v: Any) -> tuple[Mapping[str, Any], ...]:
    if type(v) is not list:
        raise TypeError(f"expected a list of maps, got {type(v).__name__}")
    rows = []
    for row in v:
        if type(row) is not dict or set(row) != {"name", "busy"}:
            raise TypeError("a session row is a map of exactly name and busy")
        if type(row["name"]) is not str or type(row["busy"]) is not bool:
            raise TypeError("a session row's name is text, its busy a bool")
        rows.append(row)
    return tuple(rows)


@dataclasses.dataclass(frozen=True, slots=True)
class Ping:
    """Client -> daemon at least every ``daemon.heartbeat_s``: still here."""


@dataclasses.dataclass(frozen=True, slots=True)
class Pong:
    """Daemon -> client, the answer to ``Ping``: still here too."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bye:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Open:
    id: Natural
    session: str
    create: bool = True
    servers: tuple[svc.McpServer, ...] = added((), "a session's own MCP servers (loopd acp)")


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    id: Natural
    session: str
    created: bool
    records: Natural
    cut_bytes: Natural = added(0, "a torn tail shown through the daemon (9b06d21)")
    context: Natural = added(0, "how full a session is, in chat")
    servers: tuple[str, ...] = added((), "a session's own MCP servers (loopd acp)")
    tools: tuple[str, ...] = added((), "a session's own MCP servers (loopd acp)")
    notes: tuple[str, ...] = added((), "a session's own MCP servers (loopd acp)")


@dataclasses.dataclass(frozen=True, slots=True)
class Close:
    id: Natural
    session: str


@dataclasses.dataclass(frozen=True, slots=True)
class Ok:
    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    id: Natural
    session: str
    text: str
    approve: tuple[str, ...] = added((), "loopd run --approve through the daemon (e06167b)")
    traceparent: str = added("", "traces")  # the client's span: the turn's trace joins it
    batch: bool = added(False, "a turn's messages in multipart messages")


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class Approve:
    id: Natural
    call: Natural
    choice: Choice
    reason: str = ""
    by: str = "person"


@dataclasses.dataclass(frozen=True, slots=True)
class Sessions:
    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class SessionList:
    id: Natural
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ReadLog:
    id: Natural
    session: str
    start: Natural = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Log:
    id: Natural
    records: tuple[bytes, ...]
    next: Natural
    done: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Status:
    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class StatusReply:
    id: Natural
    pid: Natural
    endpoint: str
    uptime_s: float
    clients: Natural
    sessions: tuple[Mapping[str, Any], ...] = dataclasses.field(
        metadata={CHECK: _session_rows}
    )
    # the file tools' root (tools.workspace, resolved) of the daemon
    workspace: str = added("", "loopd acp (6e179f4)")
    model: str = added("", "loopd status shows the model")  # and its server


@dataclasses.dataclass(frozen=True, slots=True)
class Stop:
    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class Fork:
    id: Natural
    source: str
    session: str
    at: Natural | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ForkReply:
    KIND: ClassVar[str] = "forked"

    id: Natural
    session: str
    source: str
    at: Natural
    records: Natural
    state_tokens: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class Rewind:
    id: Natural
    session: str
    turns: Natural = 1


@dataclasses.dataclass(frozen=True, slots=True)
class Rewound:
    id: Natural
    session: str
    to_turn: Natural
    taken: tuple[int, ...]
    left: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Compact:
    id: Natural
    session: str


@dataclasses.dataclass(frozen=True, slots=True)
class CompactReply:
    KIND: ClassVar[str] = "compacted"

    id: Natural
    session: str
    tokens_before: Natural
    tokens_after: Natural
    turns_kept: Natural
    ms: float


@dataclasses.dataclass(frozen=True, slots=True)
class Remove:
    id: Natural
    session: str


@dataclasses.dataclass(frozen=True, slots=True)
class SessionStatus:
    KIND: ClassVar[str] = "state"

    id: Natural
    session: str


@dataclasses.dataclass(frozen=True, slots=True)
class SessionState:
    id: Natural
    session: str
    records: Natural
    turns: Natural
    attached: bool
    busy: bool
    workspace: str


@dataclasses.dataclass(frozen=True, slots=True)
class EventMessage:
    KIND: ClassVar[str] = "event"

    id: Natural
    event: str
    data: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    id: Natural
    content: str
    iterations: Natural
    tool_calls: Natural
    cut: bool
    usage: bytes
    restored: SlotUse | None
    context: Natural = added(0, "how full a session is, in chat")
    compactions: Natural = added(0, "compaction")


@dataclasses.dataclass(frozen=True, slots=True)
class Error:
    id: Natural
    error: str
    message: str
    exit_code: int


@dataclasses.dataclass(frozen=True, slots=True)
class Approval:
    id: Natural
    call: Natural
    tool: str
    arguments: str
    prompt: str
    rule: str
    timeout_s: float
    child: str = added("", "agents: a child's call number is its own session's")


Message: TypeAlias = Any  # one of MESSAGES

MESSAGES = (
    Ping, Pong, Bye, Open, Opened, Close, Ok, Turn, Cancel, Approve, Sessions, SessionList,
    ReadLog, Log, Status, StatusReply, Stop, EventMessage, Done, Error, Approval, Fork,
    ForkReply, Rewind, Rewound, Compact, CompactReply, Remove, SessionStatus, SessionState,
)  # fmt: skip
"""Every message of the protocol; a new one is its dataclass above, its name here and its
row in the document."""

CODEC = Codec(
    "loopd client protocol", MESSAGES, version=VERSION, max_frame=MAX_FRAME,
    max_array=1_000_000,
)  # fmt: skip


# --- the session service's results: each is its answer's fields after ``id`` -------------

R = TypeVar("R")

REPLIES: dict[type[Any], type[Any]] = {
    svc.Opened: Opened, svc.Forked: ForkReply, svc.Rewound: Rewound,
    svc.CompactReport: CompactReply, svc.SessionState: SessionState,
}  # fmt: skip
"""A result of :class:`actors.service.types.SessionService` -> the message that carries it."""


def _names(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


for _result, _message in REPLIES.items():  # a field added to one and not the other fails here
    if _names(_message) != ["id", *_names(_result)]:
        raise TypeError(f"{_message.__name__} must be id + the fields of {_result.__name__}")


def reply(rid: int, done: Any) -> Message:
    """The answer to request ``rid`` that carries the service's result ``done``."""
    return REPLIES[type(done)](rid, *(getattr(done, n) for n in _names(type(done))))


def result(kind: type[R], msg: Message) -> R:
    """The service's result of type ``kind`` that the answer ``msg`` carries."""
    if not isinstance(msg, REPLIES[kind]):
        raise WireError(f"the daemon answered {type(msg).__name__}, not {REPLIES[kind].__name__}")
    return kind(*(getattr(msg, n) for n in _names(kind)))


def encode(msg: Message) -> bytes:
    """The frame of one message; WireError if a field cannot go on the wire."""
    return CODEC.encode(msg)


def decode(frame: bytes, max_bytes: int) -> Message:
    """One message from a frame; WireError says what is wrong with it."""
    return CODEC.decode(frame, max_bytes)


# --- events: the turn's events by their --json names ---------------------------------------

_EVENTS = {ev.event_name(object.__new__(cls)): shape_of(cls) for cls in typing.get_args(ev.Event)
           if cls is not ev.AgentEvent}  # a child's event: its own, with an ``agent`` field


def encode_event(turn: int, event: ev.Event) -> EventMessage:
    data = ev.to_json(event)
    return EventMessage(id=turn, event=data.pop("event"), data=data)


def decode_event(msg: EventMessage) -> ev.Event:
    """The event an ``event`` message carries; WireError when it is not a known, valid one."""
    shape = _EVENTS.get(msg.event)
    if shape is None:
        raise WireError(f"event: unknown event {msg.event!r:.40}", msg.id)
    data = dict(msg.data)
    own = msg.event in ("agent_started", "agent_done")  # ``agent`` is a field of theirs
    agent = None if own else data.pop("agent", None)
    try:
        event: ev.Event = shape.from_map(data)
    except TypeError as e:
        raise WireError(f"event {msg.event}: {e}", msg.id) from None
    if agent is None:
        return event
    if not isinstance(agent, str):
        raise WireError(f"event {msg.event}: agent must be a string", msg.id)
    return ev.AgentEvent(agent, event)  # a child's event (docs/agents.md)
