"""The session service over the daemon's wire: :class:`RemoteService` on one
:class:`~actors.daemon.client.Client` connection; its sessions are attached to it.

The daemon runs each operation with the same in-process service a command would
(:class:`actors.service.local.LocalService`), so the results, the events and the errors are
the same; only the turn's waiting differs: Ctrl-C here cancels the turn there.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from actors.base.cancel import CancelToken
from actors.base.config import Config
from actors.base.events import Approver, Compacted, Sink
from actors.daemon import protocol as p
from actors.daemon.client import Client
from actors.log.records import Record
from actors.service.types import (
    CompactReport,
    Forked,
    McpServer,
    Opened,
    Rewound,
    SessionState,
    TurnOutcome,
)

__all__ = ["RemoteService"]


class RemoteService:
    """Sessions in ``loopd serve``, through ``client`` (closed by :meth:`shutdown`)."""

    def __init__(self, client: Client, config: Config, workspace: Path, where: str) -> None:
        self.client, self._config, self._workspace, self.where = client, config, workspace, where

    @property
    def config(self) -> Config:
        return self._config

    @property
    def workspace(self) -> Path:
        return self._workspace

    def open(self, name: str, create: bool = True,
             servers: tuple[McpServer, ...] = ()) -> Opened:
        return self.client.open(name, create, servers)  # they run in the daemon

    def records(self, name: str) -> tuple[Record, ...]:
        return tuple(self.client.read_log(name))

    def turn(
        self, name: str, text: str, sink: Sink, approver: Approver,
        cancel: CancelToken | None = None, approve: tuple[str, ...] = (),
    ) -> TurnOutcome:  # fmt: skip
        """The turn's events to ``sink`` as they come; Ctrl-C (in the calling thread) or
        ``cancel`` (set in any thread) cancels it in the daemon, and it is waited out."""
        remote = self.client.turn(name, text, approver, approve)
        if cancel is None:
            return remote.run(sink)
        done = threading.Event()

        def forward_cancel() -> None:  # the daemon hears of a cancel set in this process
            while not done.is_set():
                if cancel.wait(0.05):
                    remote.cancel()
                    return

        watcher = threading.Thread(target=forward_cancel, name="loopd-cancel", daemon=True)
        watcher.start()
        try:
            return remote.run(sink)
        finally:
            done.set()
            watcher.join()

    def rewind(self, name: str, turns: int = 1) -> Rewound:
        return self.client.rewind(name, turns)

    def fork(self, source: str, name: str, at: int | None = None) -> Forked:
        return self.client.fork(source, name, at)  # the daemon saves the source's state first

    def compact(self, name: str, sink: Sink) -> CompactReport:
        """Compact ``name`` in the daemon; ``sink`` sees the Compacted event of it (the
        daemon's own compaction events stay there)."""
        done = self.client.compact(name)
        sink(Compacted(why="person", tokens_before=done.tokens_before,
                       tokens_after=done.tokens_after, turns_kept=done.turns_kept, ms=done.ms))
        return done

    def status(self, name: str) -> SessionState:
        return self.client.call(lambda rid: p.SessionStatus(rid, name), SessionState)

    def list(self) -> tuple[str, ...]:
        return tuple(self.client.sessions())

    def remove(self, name: str) -> None:
        self.client.remove(name)

    def close(self, name: str) -> None:
        self.client.close_session(name)

    def shutdown(self) -> None:
        self.client.close()  # the daemon detaches our sessions; it keeps their KV state

    def __enter__(self) -> RemoteService:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown()
