"""The daemon's open sessions: which client each is attached to, and whether a turn runs.

One client per session: a second client asking for an attached session gets
:class:`~actors.base.errors.SessionInUse`; one client has at most
``daemon.max_sessions_per_client`` open (each is a thread and an open log), and one more
is a LimitError. A session's actor (:class:`~actors.session.actor.SessionActor`,
the only writer of its log) lives while a client has it attached; it is stopped when the
client closes it or goes away, after the turn running on it, if any, has ended. The KV state
stays warm in the slot keeper either way, so reopening costs a read of the log, no prompt.
A session is free for another client once its actor has stopped (and let go of its log):
opening one whose actor is still stopping waits for that, rather than finding it locked.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

import pykka

from actors.base.errors import DaemonError, LimitError, SessionInUse, UsageError
from actors.session.actor import open_session
from actors.session.fork import RewindReport
from actors.session.world import World

__all__ = ["Sessions"]

log = logging.getLogger("loopd.daemon")

_STOP_S = 10.0


@dataclasses.dataclass(slots=True)
class _Entry:
    proxy: Any  # None while the log is being opened
    client: bytes
    records: int = 0  # in the log when it was opened
    busy: bool = False
    release: bool = False  # detach when the running turn ends (its client is gone)


class Sessions:
    """Session name -> its actor and the client it is attached to; thread-safe."""

    def __init__(self, app: World, per_client: int = 32) -> None:
        self.app = app
        self.per_client = per_client  # daemon.max_sessions_per_client
        self._lock = threading.RLock()
        self._open: dict[str, _Entry] = {}
        self._closing: dict[str, threading.Event] = {}  # set once the actor has stopped

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
                return False, entry.records, 0
            held = sum(1 for e in self._open.values() if e.client == client)
            if held >= self.per_client:
                raise LimitError(
                    f"this client has {held} sessions open, the most one client may "
                    f"(daemon.max_sessions_per_client); close one to open {name}"
                )
            # Claimed before the log is read, outside the lock: a long log (or a slow disk)
            # holds up only this request, and a second client is refused at once.
            entry = self._open[name] = _Entry(None, client)
        try:
            baseline = self.app.baseline() if create else None
            proxy = open_session(self.app.config, name, baseline=baseline)
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

    def begin_turn(self, client: bytes, name: str) -> Any:
        """The actor of ``name`` for a turn of ``client`` (who must have it attached)."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client or entry.proxy is None:
                raise UsageError(f"session {name} is not open for this client; open it first")
            if entry.busy:
                raise UsageError(
                    f"a turn is already running on session {name}; wait for it or cancel it"
                )
            entry.busy = True
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

    def alone(self, client: bytes, name: str, work: Callable[[Any], Any]) -> Any:
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
            for name, entry in list(self._open.items()):
                if entry.client != client:
                    continue
                if entry.busy or entry.proxy is None:
                    entry.release = True
                else:
                    idle.append((name, self._open.pop(name)))
        self._close(idle)

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": n, "busy": e.busy} for n, e in sorted(self._open.items())]

    def close_all(self) -> None:
        with self._lock:
            entries = [(n, e) for n, e in self._open.items() if e.proxy is not None]
            self._open.clear()
        self._close(entries)


def _stop(proxy: Any) -> None:
    try:
        proxy.actor_ref.stop(timeout=_STOP_S)
    except pykka.ActorDeadError:
        pass
    except pykka.Timeout:  # told to stop: it does when its current work ends
        log.warning("a session actor was still busy after %g s; not waiting for it", _STOP_S)
