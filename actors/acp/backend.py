"""Where ``loopd acp`` runs its turns: the daemon when one answers for this workspace, else
a world of its own, exactly as ``loopd run`` decides (README, "Keep it running").

Both backends have one blocking interface (:class:`Backend`), called from worker threads:
open a session, read its records, fork one into a new one, run a turn with a sink, an
approver and a cancel token, close. The agent (:mod:`actors.acp.agent`) never knows which
one it has.

The workspace is the editor's: ``session/new``'s ``cwd``. A daemon serves one workspace
(its ``tools.workspace``, which ``status`` reports), so it is used only when that is the
session's ``cwd``; otherwise, or with ``--local``, ``--url`` or ``--log-dir`` (a world of
this command's own, as for ``loopd run``), the world is built in this process with the
``cwd`` as ``tools.workspace``.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.errors import SessionError
from actors.base.events import Approver, Sink
from actors.daemon.client import Client, find_daemon
from actors.log.outcome import TurnOutcome
from actors.log.records import Record

__all__ = ["Backend", "DaemonBackend", "ForkedInto", "LocalBackend", "Opened", "start_backend"]


@dataclasses.dataclass(frozen=True, slots=True)
class Opened:
    created: bool  # the session did not exist and was made
    cut_bytes: int  # a torn last record that opening cut (a crash's), 0: none


@dataclasses.dataclass(frozen=True, slots=True)
class ForkedInto:
    """What a fork made (actors.session.fork): the turn it was taken at, the records
    copied, the tokens of the source's KV state it starts from (0: none)."""

    at: int
    records: int
    state_tokens: int


class Backend(Protocol):
    workspace: Path
    where: str  # for the person: "the loopd daemon (pid N)" or "this process"

    def open(self, name: str, create: bool) -> Opened: ...

    def records(self, name: str) -> Sequence[Record]: ...

    def fork(self, source: str, name: str) -> ForkedInto: ...

    def turn(self, name: str, text: str, sink: Sink, approver: Approver,
             cancel: CancelToken) -> TurnOutcome: ...

    def close(self) -> None: ...


def start_backend(
    config: Config, cwd: Path, *, local: bool, say: Callable[[str], None]
) -> Backend:
    """The daemon when it answers and serves ``cwd`` (and not ``local``), else a world here."""
    config = config.replace("tools", workspace=str(cwd))
    if not local:
        client = find_daemon(config)
        if client is not None:
            status = client.status()
            if Path(status.workspace) == cwd:
                return DaemonBackend(client, cwd, f"the loopd daemon (pid {status.pid})")
            client.close()
            say(f"the loopd daemon serves {status.workspace or 'another workspace'}, not {cwd}: "
                "running in this process")
    return LocalBackend(config, say)


class DaemonBackend:
    """Turns in ``loopd serve``: one client connection, its sessions attached to it."""

    def __init__(self, client: Client, workspace: Path, where: str) -> None:
        self.client, self.workspace, self.where = client, workspace, where

    def open(self, name: str, create: bool) -> Opened:
        opened = self.client.open(name, create)
        return Opened(opened.created, opened.cut_bytes)

    def records(self, name: str) -> Sequence[Record]:
        return self.client.read_log(name)

    def fork(self, source: str, name: str) -> ForkedInto:
        forked = self.client.fork(source, name)  # the daemon saves the source's state first
        return ForkedInto(forked.at, forked.records, forked.state_tokens)

    def turn(self, name: str, text: str, sink: Sink, approver: Approver,
             cancel: CancelToken) -> TurnOutcome:
        remote = self.client.turn(name, text, approver)
        done = threading.Event()

        def forward_cancel() -> None:  # the daemon hears of a cancel set in this process
            while not done.is_set():
                if cancel.wait(0.05):
                    remote.cancel()
                    return

        watcher = threading.Thread(target=forward_cancel, name="loopd-acp-cancel", daemon=True)
        watcher.start()
        try:
            return remote.run(sink)
        finally:
            done.set()
            watcher.join()

    def close(self) -> None:
        self.client.close()  # the daemon detaches our sessions; it keeps their KV state


class LocalBackend:
    """Turns in this process: the world ``loopd run --local`` builds, kept for every session
    of this ``loopd acp``, and stopped (sessions, then KV state saved, then the server) at
    the end.

    At most ``daemon.max_sessions_per_client`` sessions are open at once (each is a thread,
    an open log and its lock): opening one more closes the one used least recently that runs
    no turn (its log and KV state stay; it is opened again when next used), and when every
    one runs a turn the open is refused with an error that names the key."""

    def __init__(self, config: Config, say: Callable[[str], None]) -> None:
        from actors.session.world import start_world

        self.workspace, self.where = config.workspace, "this process"
        self.cap = config.daemon.max_sessions_per_client
        self._stack = contextlib.ExitStack()
        self.world = self._stack.enter_context(start_world(config, say))
        self._sessions: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._turns: collections.Counter[str] = collections.Counter()  # sessions in a turn
        self._lock = threading.Lock()

    def open(self, name: str, create: bool) -> Opened:
        from actors.session.actor import session_path

        with self._lock:
            if name in self._sessions:
                self._sessions.move_to_end(name)
                return Opened(False, 0)
            if not create and not session_path(self.world.config, name).exists():
                raise SessionError(f"session {name} does not exist in "
                                   f"{self.world.config.log_dir}")
            self._make_room(name)
            proxy = self.world.session(name)
            self._sessions[name] = proxy
        report = proxy.ready().get()
        return Opened(report.created, report.cut_bytes)

    def _make_room(self, name: str) -> None:
        """Close the least recently used idle sessions until one more fits the cap."""
        while len(self._sessions) >= self.cap:
            idle = next((n for n in self._sessions if not self._turns[n]), None)
            if idle is None:
                raise SessionError(
                    f"{len(self._sessions)} sessions are open here and each is running a turn "
                    f"(daemon.max_sessions_per_client = {self.cap}); open {name} when one "
                    "ends, or raise the key")
            proxy = self._sessions.pop(idle)
            with contextlib.suppress(Exception):  # already stopped: nothing to close
                proxy.actor_ref.stop(timeout=self.world.stop_timeout_s)
            with contextlib.suppress(ValueError):
                self.world.sessions.remove(proxy)

    def _proxy(self, name: str) -> Any:
        with self._lock:
            proxy = self._sessions.get(name)
            if proxy is not None:
                self._sessions.move_to_end(name)
                return proxy
        self.open(name, False)  # closed to keep the cap: opened again from its log
        with self._lock:
            return self._sessions[name]

    def records(self, name: str) -> Sequence[Record]:
        records: Sequence[Record] = self._proxy(name).records().get()
        return records

    def fork(self, source: str, name: str) -> ForkedInto:
        report = self.world.fork(source, name)  # this world's keeper saves the state first
        tokens = report.state.tokens if report.state is not None else 0
        return ForkedInto(report.forked.at, report.records, tokens)

    def turn(self, name: str, text: str, sink: Sink, approver: Approver,
             cancel: CancelToken) -> TurnOutcome:
        runtime = self.world.runtime
        with self._lock:
            self._turns[name] += 1  # not closed to make room while it runs
        try:
            proxy = self._proxy(name)
            outcome: TurnOutcome = proxy.turn(runtime, text, sink, cancel, approver).get()
        finally:
            with self._lock:
                self._turns[name] -= 1
        return outcome

    def close(self) -> None:
        self._stack.close()
