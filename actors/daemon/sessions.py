"""The daemon's open sessions: which client each is attached to, and whether a turn runs.

One client per session: a second client asking for an attached session gets
:class:`~actors.errors.SessionInUse`. A session's actor (:class:`~actors.session.SessionActor`,
the only writer of its log) lives while a client has it attached; it is stopped when the
client closes it or goes away, after the turn running on it, if any, has ended. The KV state
stays warm in the slot keeper either way, so reopening costs a read of the log, no prompt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import pykka

from actors.app import App
from actors.errors import SessionInUse, UsageError
from actors.records import Record
from actors.session import open_session

__all__ = ["Sessions"]

_STOP_S = 10.0


@dataclasses.dataclass(slots=True)
class _Entry:
    proxy: Any
    client: bytes
    busy: bool = False
    release: bool = False  # detach when the running turn ends (its client is gone)


class Sessions:
    """Session name -> its actor and the client it is attached to; thread-safe."""

    def __init__(self, app: App) -> None:
        self.app = app
        self._lock = threading.RLock()
        self._open: dict[str, _Entry] = {}

    def attach(self, client: bytes, name: str, create: bool) -> tuple[bool, int, int]:
        """Attach ``name`` to ``client`` (opening it); (created, records in its log, bytes of
        a torn tail that opening cut)."""
        with self._lock:  # held while opening: two clients cannot both open one session
            entry = self._open.get(name)
            if entry is not None:
                if entry.client != client:
                    raise SessionInUse(name)
                return False, len(entry.proxy.records().get(timeout=_STOP_S)), 0
            baseline = self.app.baseline() if create else None
            proxy = open_session(self.app.config, name, baseline=baseline)
            self._open[name] = _Entry(proxy, client)
            report = proxy.ready().get(timeout=_STOP_S)
            return report.created, report.records, report.cut_bytes

    def begin_turn(self, client: bytes, name: str) -> Any:
        """The actor of ``name`` for a turn of ``client`` (who must have it attached)."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client:
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
        _stop(entry.proxy)

    def is_attached(self, client: bytes, name: str) -> bool:
        with self._lock:
            entry = self._open.get(name)
            return entry is not None and entry.client == client

    def detach(self, client: bytes, name: str) -> None:
        """Detach ``name`` from ``client`` and close it; refused while a turn runs."""
        with self._lock:
            entry = self._open.get(name)
            if entry is None or entry.client != client:
                return
            if entry.busy:
                raise UsageError(f"a turn is running on session {name}; cancel it first")
            del self._open[name]
        _stop(entry.proxy)

    def release_client(self, client: bytes) -> None:
        """``client`` is gone: close its sessions now, or when their turn ends."""
        idle = []
        with self._lock:
            for name, entry in list(self._open.items()):
                if entry.client != client:
                    continue
                if entry.busy:
                    entry.release = True
                else:
                    idle.append(self._open.pop(name))
        for entry in idle:
            _stop(entry.proxy)

    def records(self, name: str) -> tuple[Record, ...] | None:
        """The records of an open session (its actor's view); None when it is not open."""
        with self._lock:
            entry = self._open.get(name)
        if entry is None:
            return None
        records: tuple[Record, ...] = entry.proxy.records().get(timeout=_STOP_S)
        return records

    def rows(self) -> list[dict[str, Any]]:
        with self._lock:
            return [{"name": n, "busy": e.busy} for n, e in sorted(self._open.items())]

    def close_all(self) -> None:
        with self._lock:
            entries = list(self._open.values())
            self._open.clear()
        for entry in entries:
            _stop(entry.proxy)


def _stop(proxy: Any) -> None:
    with contextlib.suppress(pykka.ActorDeadError):
        proxy.actor_ref.stop(timeout=_STOP_S)
