"""The session actor: the only owner and writer of one session's log.

The log is opened in ``on_start`` so that its file and lock belong to the actor's thread.
pykka only logs an error raised in ``on_start`` (and stops the actor), so the error is kept
instead and raised to whoever asks next; :func:`open_session` asks at once and stops the
actor again, which turns "open elsewhere" or "corrupt" into an exception for the caller.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import pykka

from actors.base.config import Config
from actors.log.file import OpenReport, SessionLog
from actors.log.records import Baseline, Record
from actors.log.sessiondir import check_name, session_path
from actors.session.workspace import keep_workspace

if TYPE_CHECKING:
    from actors.base.cancel import CancelToken
    from actors.base.events import Approver, Compacted, Sink
    from actors.session.fork import RewindReport
    from actors.session.turn import Runtime, TurnOutcome

__all__ = ["SessionActor", "open_session"]

class SessionActor(pykka.ThreadingActor):
    """Owns ``config.log_dir / name / log.bin``; answers reads and appends in order."""

    log: SessionLog

    def __init__(self, config: Config, name: str, baseline: Baseline | None = None) -> None:
        super().__init__()
        self.config = config
        self.name = check_name(name)
        self._baseline = baseline
        self._report: OpenReport | None = None
        self._error: Exception | None = None

    @property
    def path(self) -> Path:
        return session_path(self.config, self.name)

    def on_start(self) -> None:
        try:
            self.log, self._report = SessionLog.open(
                self.path, fsync=self.config.log.fsync, baseline=self._baseline, name=self.name
            )
        except Exception as e:  # kept for the first ask: pykka would only log it
            self._error = e

    def on_stop(self) -> None:
        self._close()

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._close()

    def _close(self) -> None:
        if self._error is None and hasattr(self, "log"):
            self.log.close()

    def _open_log(self) -> SessionLog:
        if self._error is not None:
            raise self._error
        return self.log

    # --- messages ---------------------------------------------------------------------

    def ready(self) -> OpenReport:
        """What opening found; raises the open error (SessionLocked, LogCorrupt...) if any."""
        self._open_log()
        assert self._report is not None
        return self._report

    def records(self) -> tuple[Record, ...]:
        return self._open_log().records

    def append(self, record: Record) -> None:
        self._open_log().append(record)

    def sync(self) -> None:
        self._open_log().sync()

    def next_call(self) -> int:
        return self._open_log().next_call()

    def rewind(self, turns: int = 1) -> RewindReport:
        """Take back the last ``turns`` turns still in the conversation: a Rewind record
        (actors.session.fork); they stay in the log. Here, so that no turn runs meanwhile."""
        from actors.session.fork import rewind_target

        log = self._open_log()
        report = rewind_target(self.name, log.records, turns)
        log.append(report.rewind)
        return report

    def compact(self, runtime: Runtime, sink: Sink, cancel: CancelToken | None = None
                ) -> Compacted:
        """Compact the conversation now (``loopd compact``, ``/compact``, the daemon's
        ``compact``): a Compaction record (actors.session.compactor); the keeper may save
        the slot's new state after it, as after a turn."""
        from actors.session.compactor import compact_session

        try:
            return compact_session(self._open_log(), runtime.config, runtime.inference, sink,
                                   cancel)
        finally:
            runtime.inference.turn_ended(self.name)

    def turn(
        self, runtime: Runtime, content: str, sink: Sink, cancel: CancelToken | None = None,
        approver: Approver | None = None,
    ) -> TurnOutcome:
        """Run one turn (actors.session.turn.run_turn) in this actor: only it writes the log.

        A call waiting for approval blocks this actor in ``approver`` (actors.approval.gate);
        the approval and the call's result are written here like every other record.
        """
        from actors.session.turn import run_turn

        outcome = run_turn(self._open_log(), runtime, content, sink, cancel, approver)
        return dataclasses.replace(outcome, context=runtime.inference.context(self.name))


def open_session(
    config: Config, name: str, baseline: Baseline | None = None, *, timeout: float | None = 120.0
) -> pykka.ActorProxy[SessionActor]:
    """Start the actor of session ``name`` and wait until its log is open.

    Creates the session when it does not exist and ``baseline`` is given. An open error
    (SessionLocked, LogCorrupt, ...) is raised here, and the actor is stopped again; so is
    a UsageError when the session was made with another workspace than ``config``'s
    (:mod:`actors.session.workspace`).
    """
    ref = SessionActor.start(config, name, baseline)
    proxy = ref.proxy()
    try:
        proxy.ready().get(timeout=timeout)
        keep_workspace(config, name)  # under the log's lock: one writer of the file
    except BaseException:
        ref.stop(timeout=timeout)
        raise
    return proxy
