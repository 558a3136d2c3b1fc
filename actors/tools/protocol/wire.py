"""The tool wire, version 1: how a tool port (the session's side) talks to a tool host.

This docstring is the protocol document: a port or a host in any language can be written
from it. The Python port is :mod:`actors.tools.port`, the host :mod:`actors.tools.host`;
the codec (:mod:`actors.wire.codec`) reads the kinds and fields below from the dataclasses.

Transport
---------
ZeroMQ. The host binds a ROUTER socket (``ipc://PATH`` for a host loopd starts, or
``tcp://HOST:PORT`` with CURVE: the host admits only the client keys of its allow list);
a port connects a DEALER. One message is one frame holding one msgpack map: ``v`` (the
version, the integer 1), ``kind`` (text, below) and the kind's fields by name. A frame over
``tools.max_frame_bytes`` (4 MiB) is not read (ZeroMQ drops the connection). A frame of
more than one part, another version, an unknown kind, an unknown field, a missing field
(but those added later, below) or a field of the wrong type is refused: the host answers
``failed`` with the request's ``id`` when it could be read (else 0) and goes on. Integers
are msgpack integers (never booleans); an ``id`` is a non-negative 63-bit integer the port
chooses, unique among its calls in flight.

Messages
--------
==================== =========== ==========================================================
kind                 direction   fields
==================== =========== ==========================================================
``hello``            port->host  (none): on (re)connect; the host answers ``tools``
``tools``            host->port  ``tools`` list of maps, each exactly ``name`` text,
                                 ``description`` text, ``parameters`` map (the arguments'
                                 JSON schema), ``result_class`` text (``public``,
                                 ``internal`` or ``secret``), ``needs_approval`` bool,
                                 ``untrusted`` bool (results come from outside)
``request``          port->host  ``id``, ``session`` text, ``call`` int (the session's call
                                 number), ``tool`` text, ``arguments`` map (JSON data, at
                                 most 64 deep), ``approved`` bool (see below),
                                 ``landing`` text (see below), ``traceparent`` text
                                 (see below), ``ask_s`` float (see below),
                                 ``progress`` bool (see below)
``result``           host->port  ``id``, ``content`` text, ``class`` text (as
                                 ``result_class``), ``untrusted`` bool
``failed``           host->port  ``id``, ``message`` text (the call failed, or the message
                                 was refused)
``denied``           host->port  ``id``, ``reason`` text (e.g. a path outside the workspace)
``pending_approval`` host->port  ``id``, ``prompt`` text: the tool needs approval and the
                                 request was not approved; nothing ran. ``landing`` text:
                                 where a write would land; ``protected`` text: why it must
                                 be asked for whatever the rules say ("" when not)
``cancel``           port->host  ``id``: the caller gave up on that call; stop it (its
                                 answer is not wanted)
``ask``              host->port  ``id``, ``question`` int, ``server`` text, ``message``
                                 text, ``schema`` map: the running call asks the person
                                 (an MCP server's elicitation); sent only when the request's
                                 ``ask_s`` > 0, on the socket that sent the request
``reply``            port->host  ``id``, ``question`` int, ``action`` text (``accept``,
                                 ``decline`` or ``cancel``), ``content`` map (the answers,
                                 by field, when accepted; else empty)
``progress``         host->port  ``id``, ``done`` float, ``total`` float (0: unknown),
                                 ``message`` text: how far the running call is (an MCP
                                 server's progress notification); sent only when the
                                 request's ``progress`` is true, on the request's socket
``ping``             port->host  (none): a heartbeat every ``tools.heartbeat_s``
``pong``             host->port  (none): the answer to ``ping``; a host silent for three
                                 heartbeats is gone
``unhealthy``        host->port  ``reason`` text, in place of ``pong``: a worker did not
                                 come back; restart this host
==================== =========== ==========================================================

Every answer (``result``, ``failed``, ``denied``, ``pending_approval``) carries its
request's ``id``. A call of a tool whose ``needs_approval`` is true runs only when its
request says ``approved: true``: the person (or a rule) allowed it after the host answered
``pending_approval``. ``approved`` never loosens anything else the host checks.

Where a write lands: for a call with a ``path`` (``write_file``) the host walks the path as
the write would (every symlink followed, dangling ones and those in a parent directory too)
and answers ``pending_approval`` with ``landing``, the path it reaches relative to the
workspace: rules are decided on that, never on the words of ``path``. A landing inside any
``.git`` or at a ``loopd.toml`` is *protected*: the host answers ``pending_approval`` with
``protected`` set even to a tool its ``--allow`` names or an ``approved`` request, unless
the request's ``landing`` names exactly that landing (the person saw it and said yes). An
approved request with a ``landing`` runs only if the write still lands there; else the host
answers ``pending_approval`` again, and nothing was written.

Progress and the limit: a call the port wants progress of (``request.progress``) and that
sends some gets a whole limit again from each ``progress`` message, at the host and at the
port, up to ``PROGRESS_MAX_TIMES`` (10) times its limit in all.

A question mid-call: a tool that needs the person's answer while it runs (an MCP server's
elicitation) makes the host send ``ask`` with the call's ``id`` and a ``question`` number
unique within the call; the port asks the person and sends ``reply`` with both numbers.
The host waits at most ``ask_s`` seconds; with no reply by then, or when the call is
cancelled, the question counts as cancelled. The call's limit does not run while a
question waits (at the host and at the port): the person's time is not the tool's. A
request with ``ask_s`` 0 means nobody can answer: the host answers the question itself
(``tools.elicitation``) and sends no ``ask``.

Fields added later
------------------
A field added to a message that peers already send has a default, and a message without
it reads as that default, so an older peer keeps working under the same ``v``; the
version changes only for what an older peer cannot read.

- ``request.approved`` (default ``false``: not approved), added with approvals (22fd1a9).
  A port written before it sends no ``approved``: its calls of tools that need no
  approval run; the others are answered ``pending_approval``.
- ``request.landing`` (default ``""``: none named), ``pending_approval.landing`` and
  ``pending_approval.protected`` (default ``""``), added with where a write lands. An older
  port sends no landing: its protected writes are answered ``pending_approval`` every time.
- ``request.traceparent`` (default ``""``: not traced), added with traces: the W3C trace
  context (``00-TRACEID-SPANID-FLAGS``) of the call's ``execute_tool`` span, so the host's
  span of the run joins the turn's trace (docs/telemetry.md). A host that does not trace
  ignores it; an older port sends none.

- ``request.ask_s`` (default ``0.0``: nobody to ask) and the ``ask`` and ``reply`` kinds,
  added with questions mid-call. An older port sends no ``ask_s``, so an ``ask`` (a kind it
  would not read) is never sent to it.

- ``request.progress`` (default ``false``: no progress wanted) and the ``progress`` kind,
  added with progress: an older port asks for none, so it is sent none.

In Python, the answers (``Result``, ``Failed``, ``Denied``, ``PendingApproval``) default
their ``id`` to 0, so a :class:`~actors.tools.protocol.provider.ToolProvider` can build
them without knowing the wire id; the host fills it in.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, TypeAlias

from actors.base.errors import WireError
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.wire.codec import Codec, Natural, added

__all__ = [
    "ACTIONS",
    "CODEC",
    "DEFAULT_MAX_FRAME",
    "PROGRESS_MAX_TIMES",
    "VERSION",
    "Answer",
    "Ask",
    "Cancel",
    "Denied",
    "Failed",
    "Hello",
    "Message",
    "PendingApproval",
    "Ping",
    "Pong",
    "Progress",
    "Questions",
    "Reply",
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
# A call that keeps reporting progress may run this many times its limit in all (MCP lets
# a receiver reset its timeout on progress if it keeps a maximum): each progress message
# gives it a whole limit from then, at the host and at the port.
PROGRESS_MAX_TIMES = 10


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """Port -> host on (re)connect: please answer with your tools."""


@dataclasses.dataclass(frozen=True, slots=True)
class Tools:
    tools: tuple[ToolSpec, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolRequest:
    KIND: ClassVar[str] = "request"

    id: Natural
    session: str
    call: Natural
    tool: str
    arguments: Mapping[str, Any]
    # The person (or a rule) approved this call after the host answered PendingApproval:
    # the host runs it. It never loosens anything else the host checks.
    approved: bool = added(False, "approvals (22fd1a9)")
    # Where the approved write was seen to land (PendingApproval.landing): it runs only there.
    landing: str = added("", "where a write lands")
    # The W3C trace context of the session's execute_tool span ("" when not traced).
    traceparent: str = added("", "traces")
    # How long the session will wait for the person's answer to a question mid-call (an
    # MCP server's elicitation); 0: nobody can answer, the host answers for itself.
    ask_s: float = added(0.0, "questions mid-call")
    # The port wants the call's progress messages (an MCP server's progress notifications).
    progress: bool = added(False, "progress")


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    id: Natural = 0
    content: str = ""
    class_: ResultClass = ResultClass.PUBLIC
    untrusted: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    id: Natural = 0
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Denied:
    id: Natural = 0
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class PendingApproval:
    id: Natural = 0
    prompt: str = ""
    landing: str = added("", "where a write lands")  # relative to the workspace
    protected: str = added("", "where a write lands")  # why it is asked for every time


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
class Ask:
    """Host -> port: running call ``id`` asks the person ``message``, a form of ``schema``
    (JSON Schema of an object, flat) on behalf of ``server``."""

    id: Natural
    question: Natural
    server: str
    message: str
    schema: Mapping[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class Progress:
    """Host -> port: running call ``id`` is ``done`` of ``total`` (0: unknown), ``message``
    saying what it is at."""

    id: Natural
    done: float
    total: float = 0.0
    message: str = ""


ACTIONS = ("accept", "decline", "cancel")


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """Port -> host: the person's answer to ``question`` of call ``id``: ``action`` one of
    :data:`ACTIONS`; ``content`` the form's values when accepted."""

    id: Natural
    question: Natural
    action: str
    content: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Cancel:
    """Port -> host: the caller gave up on call ``id``; stop it (its answer is not wanted)."""

    id: Natural


@dataclasses.dataclass(frozen=True, slots=True)
class Questions:
    """Not a message: how a port hands a call's questions mid-call (``ask``) to the person.

    ``ask(question, deadline)`` gives (action, content) by ``deadline`` (a
    ``time.monotonic()`` value; None: nobody can answer); ``timeout_s`` is how long the
    person is given (0: as long as the call's limit)."""

    ask: Callable[[Ask, float], tuple[str, Mapping[str, Any]]] | None
    timeout_s: float = 0.0
    progress: Callable[[Progress], None] | None = None  # the call's progress, as it comes


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
    | Ask
    | Reply
    | Progress
)
Answer: TypeAlias = Result | Failed | Denied | PendingApproval

CODEC = Codec("tool wire", typing.get_args(Message), version=VERSION, max_frame=DEFAULT_MAX_FRAME)


def encode(msg: Message) -> bytes:
    """The frame of one message; WireError if a field cannot go on the wire."""
    return CODEC.encode(msg)


def decode(frame: bytes, max_bytes: int = DEFAULT_MAX_FRAME) -> Message:
    """One message from a frame; WireError says what is wrong with it."""
    msg: Message = CODEC.decode(frame, max_bytes)
    return msg
