"""The session service's protocol and its results: the one seam between a command and the
place its sessions run (docs/daemon.md#one-session-service).

Both implementations return these very types: the in-process one
(:mod:`actors.service.local`, which the daemon's server calls too) and the one over the
daemon's wire (:mod:`actors.service.remote`). Each result that travels is the fields of its
wire message after ``id``, in the same order (:func:`actors.daemon.protocol.reply` and
:func:`~actors.daemon.protocol.result` carry it across, no field by hand). Nothing here
imports pykka: a client of the daemon loads none of the world it would otherwise build.

A new operation is one method here, one message pair (:mod:`actors.daemon.protocol`), one
arm in the daemon's server, and the method in each implementation; the contract suite
(``tests/service/``) runs it on both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.events import Approver, Sink
from actors.log.records import Record, SlotUse, Usage

__all__ = [
    "CompactReport", "Forked", "McpServer", "Opened", "Rewound", "SessionService", "SessionState",
    "TurnOutcome",
]  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class TurnOutcome:
    """What a turn that answered gives back: the turn (:mod:`actors.session.turn`) makes it,
    either implementation returns it as it is, the daemon's ``done`` carries its fields."""

    content: str
    usage: Usage
    iterations: int  # model responses that asked for tools
    tool_calls: int
    cut: bool  # the answer was cut: usage.finish_reason says how (types.CUT)
    restored: SlotUse | None = None  # the turn's restore of saved KV state, if any
    context: int = 0  # tokens the session's slot holds (its n_ctx); 0: not known
    compactions: int = 0  # compactions the turn made (actors/session/compactor.py)


@dataclasses.dataclass(frozen=True, slots=True)
class McpServer:
    """An MCP server a client gives one session (an editor's ``mcpServers`` in ACP): over
    stdio (``command``, ``env`` as ``NAME=value``) or streamable HTTP (``url``, ``headers``
    as ``Name: value``). Its tools are that session's only, while the client has it open."""

    name: str
    command: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    url: str = ""
    headers: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    """A session attached to this service's client: made now (``created``) or opened.
    ``servers``, ``tools``: the client's MCP servers started for it and their tools (by the
    names the model calls them); ``notes``: one line per server that did not start, or tool
    renamed, naming it and the fix."""

    session: str
    created: bool
    records: int  # in its log when it was opened
    cut_bytes: int = 0  # a torn last record (a crash's) that opening cut; 0: none
    context: int = 0  # tokens a slot of its model server holds; 0: not known
    servers: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Forked:
    """What a fork made (actors.session.fork): the source's turns copied (``at``), the
    records copied, the tokens of the source's KV state it starts from (0: none)."""

    session: str
    source: str
    at: int
    records: int
    state_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class Rewound:
    """A rewind's Rewind record (``to_turn``), the turns it took back and those still shown."""

    session: str
    to_turn: int
    taken: tuple[int, ...]
    left: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class CompactReport:
    """A compaction made by hand (docs/rendering.md#compaction): about ``tokens_after`` of
    ``tokens_before`` tokens are sent next, the last ``turns_kept`` turns word for word."""

    session: str
    tokens_before: int
    tokens_after: int
    turns_kept: int
    ms: float


@dataclasses.dataclass(frozen=True, slots=True)
class SessionState:
    """One session as it is now: the records of its log and its turns (User records), whether
    a client has it attached and a turn runs on it, the workspace it was made with ("": not
    known)."""

    session: str
    records: int
    turns: int
    attached: bool
    busy: bool
    workspace: str


class SessionService(Protocol):
    """Sessions by name, for one client: this command (or one client of the daemon).

    A session is attached to one client at a time (:class:`~actors.base.errors.SessionInUse`
    for another); ``turn`` attaches (and makes) it when it is not yet. Every method blocks;
    any thread may call them. Errors are the LoopdErrors of :mod:`actors.base.errors`, the
    same from either implementation.
    """

    @property
    def config(self) -> Config: ...  # what this command's sessions run with

    @property
    def workspace(self) -> Path: ...  # the root of the file tools of the sessions it runs

    @property
    def where(self) -> str: ...  # for the person: "this process", "the loopd daemon (pid N)"

    def open(self, name: str, create: bool = True,
             servers: tuple[McpServer, ...] = ()) -> Opened: ...
    # ``servers``: the session's own MCP servers from now on (they replace those it had
    # here; () stops them), stopped when it is closed or its client goes

    def records(self, name: str) -> tuple[Record, ...]: ...  # every record, Baseline first

    def turn(
        self, name: str, text: str, sink: Sink, approver: Approver,
        cancel: CancelToken | None = None, approve: tuple[str, ...] = (),
    ) -> TurnOutcome: ...  # fmt: skip  # ``approve``: allow rules for this turn only

    def rewind(self, name: str, turns: int = 1) -> Rewound: ...

    def fork(self, source: str, name: str, at: int | None = None) -> Forked: ...

    def compact(self, name: str, sink: Sink) -> CompactReport: ...

    def status(self, name: str) -> SessionState: ...

    def list(self) -> tuple[str, ...]: ...  # the sessions of its log directory, sorted

    def remove(self, name: str) -> None: ...  # its log and its saved KV state

    def close(self, name: str) -> None: ...  # detach it (its KV state stays warm)

    def shutdown(self) -> None: ...  # detach everything; stop what this service started
