"""The session service in this process (:class:`LocalService`), on a World: what ``loopd
run --local`` and ``loopd acp`` use, and what the daemon's server calls for each client.

:class:`SessionTable` holds the open sessions: which client each is attached to, and
whether a turn runs. A command in this process is its one client; the daemon's clients are
known by their routing ids. One client per session: a second client asking for an attached
session gets :class:`~actors.base.errors.SessionInUse`; one client has at most
``daemon.max_sessions_per_client`` open (each is a thread and an open log), and one more
is a LimitError. A session's actor (:class:`~actors.session.actor.SessionActor`,
the only writer of its log) lives while a client has it attached; it is stopped when the
client closes it or goes away, after the turn running on it, if any, has ended. The KV state
stays warm in the slot keeper either way, so reopening costs a read of the log, no prompt.
A session is free for another client once its actor has stopped (and let go of its log):
opening one whose actor is still stopping waits for that, rather than finding it locked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import pykka

from actors.approval.rulesfile import RuleStore
from actors.base import telemetry
from actors.base.cancel import CancelToken, wait_out
from actors.base.config import Config, HostConfig
from actors.base.errors import DaemonError, LimitError, SessionError, SessionInUse, UsageError
from actors.base.events import Approver, Sink, TornTail
from actors.base.rules import Rule, RuleBook, parse_rules
from actors.log.file import read_records
from actors.log.records import Record, User
from actors.log.sessiondir import kept_workspace, list_sessions, session_path
from actors.service.types import (
    CompactReport,
    Forked,
    McpServer,
    Opened,
    Rewound,
    SessionState,
    TurnOutcome,
)
from actors.session.actor import SessionActor, open_session
from actors.session.fork import RewindReport, fork_session
from actors.session.world import World, start_world
from actors.tools.registry import Registry
from actors.tools.session_hosts import SessionHosts

__all__ = ["LocalService", "SessionTable", "TurnRules", "Worlds", "remove_session"]

log = logging.getLogger("loopd.service")

Proxy = pykka.ActorProxy[SessionActor]
T = TypeVar("T")

_STOP_S = 10.0


@dataclasses.dataclass(slots=True)
class _Entry:
    proxy: Proxy | None  # None while the log is being opened
    client: bytes
    records: int = 0  # in the log when it was opened
    busy: bool = False
    release: bool = False  # detach when the running turn ends (its client is gone)
    used: int = 0  # when its client last opened it or ran a turn on it (a count)
    hosts: SessionHosts | None = None  # its own tool hosts: the client's MCP servers
    servers: tuple[McpServer, ...] = ()  # what ``hosts`` were started from


class Worlds:
    """The World a table's sessions run on: the daemon's (given), or a command's own, started
    on first need (a fork, a rewind or a listing starts no model server)."""

    def __init__(self, config: Config, world: World | None = None, *,
                 start: Callable[[], World] | None = None) -> None:
        self.config, self._world, self._start = config, world, start
        self._lock = threading.Lock()

    def get(self) -> World:
        with self._lock:
            if self._world is None:
                assert self._start is not None, "a Worlds with no world has a start"
                self._world = self._start()
            return self._world

    def started(self) -> World | None:
        with self._lock:
            return self._world


class SessionTable:
    """Session name -> its actor and the client it is attached to; thread-safe."""

    def __init__(self, worlds: Worlds, per_client: int = 32, *, evict: bool = False) -> None:
        self.worlds = worlds
        self.config = worlds.config
        self.per_client = per_client  # daemon.max_sessions_per_client
        # at the cap: close the client's least recently used idle session (a command's own
        # table: it is opened again from its log when next used), rather than refuse
        self.evict = evict
        self._uses = itertools.count(1)
        self._lock = threading.RLock()
        self._open: dict[str, _Entry] = {}
        self._closing: dict[str, threading.Event] = {}  # set once the actor has stopped
        # sessions closed to make room that had MCP servers of their own, and whose: a turn
        # that opens one again starts them again
        self._evicted: dict[str, tuple[bytes, tuple[McpServer, ...]]] = {}

    def _close(self, entries: list[tuple[str, _Entry]]) -> None:
        """Stop the actors of ``entries`` (already taken out of the table, under the lock);
        their names stay closing until then."""
        done = threading.Event()
        with self._lock:
            for name, _ in entries:
                self._closing[name] = done
        try:
            for _, entry in entries:
                if entry.proxy is not None:
                    _stop(entry.proxy)
                if entry.hosts is not None:  # after its turn: no call of it is left
                    entry.hosts.close()
        finally:
            with self._lock:
                for name, _ in entries:
                    if self._closing.get(name) is done:
                        del self._closing[name]
            done.set()

    def attach(self, client: bytes, name: str, create: bool) -> tuple[bool, int, int]:
        """Attach ``name`` to ``client`` (opening it); (created, records in its log when it
        was opened, bytes of a torn tail that opening cut)."""
        while True:
            with self._lock:
                stopping = self._closing.get(name)
            if stopping is None:
                break
            log.info("session %s: waiting for its last actor to let go of its log", name)
            stopping.wait(_STOP_S)
        with self._lock:
            entry = self._open.get(name)
            if entry is not None:
                if entry.client != client:
                    raise SessionInUse(name)
                if entry.proxy is None:
                    raise UsageError(f"session {name} is being opened; wait for that to end")
                entry.used = next(self._uses)
                return False, entry.records, 0
            evicted = self._make_room(client, name)
            # Claimed before the log is read, outside the lock: a long log (or a slow disk)
            # holds up only this request, and a second client is refused at once.
            entry = self._open[name] = _Entry(None, client, used=next(self._uses))
        if evicted:
            self._close(evicted)
        try:
            baseline = self.worlds.get().baseline() if create else None
            proxy = open_session(self.config, name, baseline=baseline)
            report = proxy.ready().get(timeout=_STOP_S)
        except BaseException:
            with self._lock:
                self._open.pop(name, None)
            raise
        with self._lock:
            entry.proxy, entry.records = proxy, report.records
            kept = self._open.get(name) is entry and not entry.release
            if not kept and self._open.get(name) is entry:
                del self._open[name]
        if not kept:  # the client went, or the daemon began to stop, while it opened
            self._close([(name, entry)])
            raise DaemonError(f"session {name} was closed while it opened")
        return report.created, report.records, report.cut_bytes

    def _make_room(self, client: bytes, name: str) -> list[tuple[str, _Entry]]:
        """Room for one more session of ``client`` (under the lock): the entries taken out
        to close (evict), or LimitError / SessionError naming the key."""
        mine = [(n, e) for n, e in self._open.items() if e.client == client]
        if len(mine) < self.per_client:
            return []
        if not self.evict:
            raise LimitError(
                f"this client has {len(mine)} sessions open, the most one client may "
                f"(daemon.max_sessions_per_client); close one to open {name}"
            )
        idle = [(e.used, n) for n, e in mine if not e.busy and e.proxy is not None]
        if not idle:
            raise SessionError(
                f"{len(mine)} sessions are open here and each is running a turn "
                f"(daemon.max_sessions_per_client = {self.per_client}); open {name} when one "
                "ends, or raise the key")
        victim = min(idle)[1]
        entry = self._open.pop(victim)
        if entry.servers:
            self._evicted[victim] = (client, entry.servers)
        return [(victim, entry)]

    def begin_turn(self, client: bytes, name: str) -> Proxy:
        """The actor of ``name`` for a turn of ``client`` (who must have it attached)."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client or entry.proxy is None:
                raise UsageError(f"session {name} is not open for this client; open it first")
            if entry.busy:
                raise UsageError(
                    f"a turn is already running on session {name}; wait for it or cancel it"
                )
            entry.busy, entry.used = True, next(self._uses)
            return entry.proxy

    def end_turn(self, name: str) -> None:
        with self._lock:
            entry = self._open.get(name)
            if entry is None:
                return
            entry.busy = False
            if not entry.release:
                return
            del self._open[name]
        self._close([(name, entry)])

    def rewind(self, client: bytes, name: str, turns: int) -> RewindReport:
        """Take back ``name``'s last ``turns`` turns for ``client`` (:meth:`alone`)."""
        report: RewindReport = self.alone(
            client, name, lambda proxy: proxy.rewind(turns).get(timeout=_STOP_S))
        return report

    def alone(self, client: bytes, name: str, work: Callable[[Proxy], T]) -> T:
        """``work(proxy)`` on ``name``'s actor for ``client``, as a turn would have it:
        SessionInUse when another client has it attached, refused while a turn runs on it;
        one not attached is opened for the work and closed again."""
        with self._lock:
            entry = self._open.get(name)
            if entry is not None and entry.client != client:
                raise SessionInUse(name)
        opened = entry is None
        if opened:
            self.attach(client, name, create=False)
        try:
            proxy = self.begin_turn(client, name)
            try:
                return work(proxy)
            finally:
                self.end_turn(name)
        finally:
            if opened:
                self.detach(client, name)

    def own_hosts(self, client: bytes, name: str, servers: tuple[McpServer, ...],
                  start: Callable[[], SessionHosts]) -> SessionHosts | None:
        """``name``'s own tool hosts from now on (``client`` has it attached): kept when
        ``servers`` are those it has, else its old ones stopped and ``start()``'s started
        (none for no servers). Started outside the lock: it takes a server's start-up."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client or entry.proxy is None:
                raise UsageError(f"session {name} is not open for this client; open it first")
            self._evicted.pop(name, None)
            if entry.servers == servers:
                return entry.hosts
            if entry.busy:
                raise UsageError(f"a turn is running on session {name}; its MCP servers "
                                 "change when it has ended")
            old, entry.hosts, entry.servers = entry.hosts, None, ()
        if old is not None:
            old.close()
        hosts = start() if servers else None
        with self._lock:
            if self._open.get(name) is entry and entry.hosts is None:
                entry.hosts, entry.servers = hosts, servers
                return hosts
        if hosts is not None:  # closed (or given others) while they started
            hosts.close()
        raise UsageError(f"session {name} was closed while its MCP servers started")

    def evicted_servers(self, client: bytes, name: str) -> tuple[McpServer, ...]:
        """The MCP servers ``name`` had when it was closed to make room for another of
        ``client``'s sessions ((): none, or it was not)."""
        with self._lock:
            kept = self._evicted.get(name)
            return kept[1] if kept is not None and kept[0] == client else ()

    def registry(self, name: str) -> Registry | None:
        """The tools of ``name``'s turns when it has hosts of its own (None: the world's)."""
        with self._lock:
            entry = self._open.get(name)
            hosts = entry.hosts if entry is not None else None
            return hosts.registry if hosts is not None else None

    def is_attached(self, client: bytes, name: str) -> bool:
        with self._lock:
            entry = self._open.get(name)
            return entry is not None and entry.client == client

    def detach(self, client: bytes, name: str) -> None:
        """Detach ``name`` from ``client`` and close it; refused while a turn runs."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client or entry.proxy is None:
                return
            if entry.busy:
                raise UsageError(f"a turn is running on session {name}; cancel it first")
            del self._open[name]
        self._close([(name, entry)])

    def release_client(self, client: bytes) -> None:
        """``client`` is gone: close its sessions now, or when their turn ends."""
        idle: list[tuple[str, _Entry]] = []
        with self._lock:
            for name in [n for n, (c, _) in self._evicted.items() if c == client]:
                del self._evicted[name]
            for name, entry in list(self._open.items()):
                if entry.client != client:
                    continue
                if entry.busy or entry.proxy is None:
                    entry.release = True
                else:
                    idle.append((name, self._open.pop(name)))
        self._close(idle)

    def holder(self, name: str) -> bytes | None:
        """The client ``name`` is attached to; None: none."""
        with self._lock:
            entry = self._open.get(name)
            return None if entry is None else entry.client

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": n, "busy": e.busy} for n, e in sorted(self._open.items())]

    def close_all(self) -> None:
        with self._lock:
            entries = [(n, e) for n, e in self._open.items() if e.proxy is not None]
            self._open.clear()
            self._evicted.clear()
        self._close(entries)


def _stop(proxy: Proxy) -> None:
    try:
        proxy.actor_ref.stop(timeout=_STOP_S)
    except pykka.ActorDeadError:
        pass
    except pykka.Timeout:  # told to stop: it does when its current work ends
        log.warning("a session actor was still busy after %g s; not waiting for it", _STOP_S)


def _host_of(server: McpServer) -> tuple[HostConfig, dict[str, str]]:
    """A client's MCP server as a ``[[tools.hosts]]`` entry, and its stdio server's variables."""
    env = dict(v.partition("=")[::2] for v in server.env)
    return HostConfig(name=server.name, kind="mcp", command=server.command, url=server.url,
                      headers=server.headers), env


def remove_session(config: Config, name: str) -> None:
    """Delete session ``name``: its saved KV state files, then its directory
    (actors.log.sessiondir.remove_session: refused while a process has it open)."""
    from actors.inference.slots.files import remove_session_files, slot_dirs
    from actors.log import sessiondir

    sessiondir.remove_session(
        config, name, lambda path: remove_session_files(slot_dirs(config), path))


class TurnRules(RuleStore):
    """The world's rules (its rules file, shared by every session) and one turn's
    ``--approve`` rules on top; an "always" or "never" answer is saved in the shared store."""

    def __init__(self, shared: RuleStore, texts: tuple[str, ...]) -> None:
        try:
            self.extra = RuleBook(parse_rules(texts))
        except ValueError as e:
            raise UsageError(f"--approve: {e}") from None
        self.shared = shared

    def current(self) -> tuple[RuleBook, str]:
        book, problem = self.shared.current()
        return book + self.extra, problem

    def save(self, rule: Rule, *, deny: bool = False) -> None:
        self.shared.save(rule, deny=deny)


class LocalService:
    """The session service in this process, for one client of ``table`` (this command, or
    one client of the daemon: its server makes one per request)."""

    where = "this process"

    def __init__(self, table: SessionTable, client: bytes = b"this process",
                 on_shutdown: Callable[[], None] = lambda: None) -> None:
        self.table, self.client, self._on_shutdown = table, client, on_shutdown

    @classmethod
    def start(cls, config: Config, say: Callable[[str], None] = lambda _: None,
              approve: RuleBook | None = None) -> LocalService:
        """A service with a World of its own (:func:`actors.session.world.start_world`),
        started on first need and stopped by :meth:`shutdown`: the sessions first, then the
        keeper's saves, then the model server."""
        stack = contextlib.ExitStack()
        worlds = Worlds(config, start=lambda: stack.enter_context(
            start_world(config, say, approve)))
        # its one client (an editor's, through loopd acp) keeps at most the daemon's number of
        # sessions open (each is a thread, an open log and its lock): the least recently
        # used idle one is closed for another
        table = SessionTable(worlds, config.daemon.max_sessions_per_client, evict=True)

        def shutdown() -> None:
            try:
                table.close_all()
            finally:
                stack.close()

        return cls(table, on_shutdown=shutdown)

    @property
    def config(self) -> Config:
        return self.table.config

    @property
    def workspace(self) -> Path:
        return self.config.workspace

    def open(self, name: str, create: bool = True,
             servers: tuple[McpServer, ...] = ()) -> Opened:
        created, records, cut = self.table.attach(self.client, name, create)
        context = self.table.worlds.get().runtime.inference.context(name)
        hosts = self._own_hosts(name, servers)
        if hosts is None:
            return Opened(name, created, records, cut, context)
        return Opened(name, created, records, cut, context, hosts.started, hosts.tools,
                      hosts.notes)

    def _own_hosts(self, name: str, servers: tuple[McpServer, ...]) -> SessionHosts | None:
        shared = self.table.worlds.get().runtime.registry
        return self.table.own_hosts(self.client, name, servers, lambda: SessionHosts.start(
            self.config, [_host_of(s) for s in servers], shared))

    def records(self, name: str) -> tuple[Record, ...]:
        path = session_path(self.config, name)  # read like `loopd log show` does: a
        if not path.is_file():  # reader never waits for a session's turn to end
            raise SessionError(f"session {name} does not exist ({path})")
        return read_records(path, name=name)

    def turn(
        self, name: str, text: str, sink: Sink, approver: Approver,
        cancel: CancelToken | None = None, approve: tuple[str, ...] = (),
    ) -> TurnOutcome:  # fmt: skip
        """One turn on the session's actor; Ctrl-C (in the main thread) or ``cancel``
        cancels it, and it is waited for to wind down (also while a call waits for approval:
        ``approver`` sees the cancel, nothing runs). SIGTERM does the same, then ends the
        command once the turn has wound down. A sink whose reader went away (``closed``,
        the JSON view's stdout) cancels it too."""
        token = cancel if cancel is not None else CancelToken()
        if self.table.holder(name) != self.client:
            _, _, cut = self.table.attach(self.client, name, create=True)
            if cut:
                sink(TornTail(session=name, cut_bytes=cut))
            if servers := self.table.evicted_servers(self.client, name):
                self._own_hosts(name, servers)  # closed to make room: its servers again
        proxy = self.table.begin_turn(self.client, name)
        try:
            runtime = self.table.worlds.get().runtime
            if (own := self.table.registry(name)) is not None:  # its client's MCP servers
                runtime = dataclasses.replace(runtime, registry=own)
            if approve:
                runtime = dataclasses.replace(runtime, rules=TurnRules(runtime.rules, approve))
            if parent := telemetry.traceparent():  # the caller's span (a daemon client's)
                runtime = dataclasses.replace(runtime, traceparent=parent)
            future = proxy.turn(runtime, text, sink, token, approver)

            def step() -> TurnOutcome | None:
                try:
                    outcome: TurnOutcome = future.get(timeout=0.2)  # short: Ctrl-C reaches us
                except pykka.Timeout:
                    if getattr(sink, "closed", False):
                        token.cancel()
                    return None
                return outcome

            return wait_out(step, token.cancel)
        finally:
            self.table.end_turn(name)

    def rewind(self, name: str, turns: int = 1) -> Rewound:
        report = self.table.rewind(self.client, name, turns)
        return Rewound(name, report.rewind.to_turn, report.taken, report.left)

    def fork(self, source: str, name: str, at: int | None = None) -> Forked:
        """A fork (actors.session.fork); the source's KV state saved first when a slot of
        this process's world holds it changed (no world started: nothing to save)."""
        world = self.table.worlds.started()
        save = world.save_state if world is not None else None
        report = fork_session(self.config, source, name, at, save=save)
        tokens = report.state.tokens if report.state is not None else 0
        return Forked(name, source, report.forked.at, report.records, tokens)

    def compact(self, name: str, sink: Sink) -> CompactReport:
        runtime = self.table.worlds.get().runtime
        wait = self.config.inference.timeout_s + 30
        done = self.table.alone(self.client, name, lambda proxy: proxy.compact(
            runtime, sink).get(timeout=wait))
        return CompactReport(name, done.tokens_before, done.tokens_after, done.turns_kept,
                             done.ms)

    def status(self, name: str) -> SessionState:
        records = self.records(name)
        busy = {row["name"]: row["busy"] for row in self.table.rows()}
        return SessionState(name, len(records), sum(isinstance(r, User) for r in records),
                            name in busy, busy.get(name, False),
                            str(kept_workspace(self.config, name) or ""))

    def list(self) -> tuple[str, ...]:
        return tuple(list_sessions(self.config))

    def remove(self, name: str) -> None:
        """Delete ``name`` (closed first when this client has it); SessionInUse while another
        client has it attached, SessionLocked while another process has it open."""
        holder = self.table.holder(name)
        if holder == self.client:
            self.table.detach(self.client, name)
        elif holder is not None:
            raise SessionInUse(name)
        remove_session(self.config, name)
        if (world := self.table.worlds.started()) is not None:
            world.forget_state(name)  # the slot keeper's entry for it

    def close(self, name: str) -> None:
        self.table.detach(self.client, name)

    def shutdown(self) -> None:
        self._on_shutdown()

    def __enter__(self) -> LocalService:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
