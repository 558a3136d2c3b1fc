"""The session a command talks to: through the daemon or in this process, the same either way.

:func:`open_conversation` gives a :class:`Conversation` on session ``args.session``:
through the daemon when one answers (and not ``--local``; see :mod:`actors.cli.where`),
else in a world of this process. Both show the same events, the same outcome and the same
errors; Ctrl-C cancels a turn either way, ``approver`` answers the calls that wait for
approval (actors.cli.approvers), and the ``--approve`` rules go with every turn. Chat
moves it to another session (``/new``) with :meth:`Conversation.switch`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import pykka

from actors.base import config as cfg
from actors.base.cancel import CancelToken, wait_out
from actors.base.errors import UsageError
from actors.base.events import Approver, Compacted, TornTail
from actors.base.rules import RuleBook, parse_rules
from actors.cli.where import place
from actors.log.file import check_free, read_log
from actors.log.outcome import TurnOutcome
from actors.log.records import Usage
from actors.session.actor import check_name, session_path
from actors.session.limits import shown_usage

__all__ = ["Conversation", "approved", "last_usage", "open_conversation"]


class Conversation(Protocol):
    """One session at a time, on a world that stays up while the command runs."""

    name: str

    @property
    def config(self) -> cfg.Config: ...  # what the session runs with (where.py: its workspace)

    def turn(self, message: str, sink: Any) -> TurnOutcome: ...

    def switch(self, name: str) -> None: ...  # leave this session, open (or make) ``name``

    def context(self) -> int: ...  # tokens a slot of its model server holds; 0: not known

    def rewind(self, turns: int) -> tuple[tuple[int, ...], tuple[int, ...]]: ...  # the turns
    # taken back, the turns left (actors.session.fork)

    def compact(self, sink: Any) -> Compacted: ...  # now (actors.session.compactor)


def approved(args: argparse.Namespace) -> RuleBook:
    """The ``--approve`` rules, checked like tools.allow (UsageError naming the flag)."""
    try:
        return RuleBook(parse_rules(args.approve))
    except ValueError as e:
        raise UsageError(f"--approve: {e}") from None


def last_usage(config: cfg.Config, name: str) -> Usage | None:
    """The last Usage record of session ``name`` the conversation still shows, as its log
    file says now (None: no such session, no answer yet, or rewound past a compaction): how
    full its prompt was after its last request."""
    path = session_path(config, name)
    if not path.is_file():
        return None
    records, _ = read_log(path, name=name)
    return shown_usage(records)


@contextlib.contextmanager
def open_conversation(
    args: argparse.Namespace, config: cfg.Config, status: Callable[[str], None], notice: Any,
    approver: Approver,
) -> Iterator[Conversation]:
    """A conversation on session ``args.session``, its world stopped when the block ends."""
    check_name(args.session)  # bad usage (exit 2), said before anything starts
    config, client = place(args, config, status)
    if client is not None:
        approved(args)  # a bad --approve is refused here, as in-process
        with client:
            yield _Remote(client, config, args.session, approver, tuple(args.approve), notice)
        return
    from actors.session.world import start_world

    check_free(session_path(config, args.session), args.session)  # before the server starts
    with start_world(config, status, approved(args)) as app:
        yield _Local(app, args.session, approver, notice)


class _Remote:
    """Through the daemon (actors.daemon.client)."""

    def __init__(self, client: Any, config: cfg.Config, name: str, approver: Approver,
                 approve: tuple[str, ...], notice: Any) -> None:
        self.client, self.config, self.approver, self.approve = client, config, approver, approve
        self.notice = notice
        self.name, self._context = "", 0
        self._open(name)

    def _open(self, name: str) -> None:
        opened = self.client.open(name)
        self.name, self._context = name, opened.context
        if opened.cut_bytes:
            self.notice(TornTail(session=name, cut_bytes=opened.cut_bytes))

    def turn(self, message: str, sink: Any) -> TurnOutcome:
        outcome: TurnOutcome = self.client.turn(
            self.name, message, self.approver, self.approve).run(sink)
        self._context = outcome.context or self._context
        return outcome

    def switch(self, name: str) -> None:
        check_name(name)
        self.client.close_session(self.name)
        self._open(name)

    def context(self) -> int:
        return self._context

    def rewind(self, turns: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        answer = self.client.rewind(self.name, turns)
        return answer.taken, answer.left

    def compact(self, sink: Any) -> Compacted:
        a = self.client.compact(self.name)
        done = Compacted(why="person", tokens_before=a.tokens_before,
                         tokens_after=a.tokens_after, turns_kept=a.turns_kept, ms=a.ms)
        sink(done)
        return done


class _Local:
    """In this process: a world of its own (actors.session.world)."""

    def __init__(self, app: Any, name: str, approver: Approver, notice: Any) -> None:
        self.app, self.approver, self.notice = app, approver, notice
        self.name, self.session = "", None
        self._open(name)

    @property
    def config(self) -> cfg.Config:
        config: cfg.Config = self.app.config
        return config

    def _open(self, name: str) -> None:
        session = self.app.session(name)
        self.name, self.session = name, session
        cut = session.ready().get().cut_bytes
        if cut:
            self.notice(TornTail(session=name, cut_bytes=cut))

    def turn(self, message: str, sink: Any) -> TurnOutcome:
        """Run one turn on the session actor; Ctrl-C cancels it and waits for it to wind
        down (also while a call waits for approval: ``approver`` sees the cancel, nothing
        runs). SIGTERM does the same, then ends the command once the turn has wound down."""
        assert self.session is not None
        cancel = CancelToken()
        future = self.session.turn(self.app.runtime, message, sink, cancel, self.approver)

        def step() -> TurnOutcome | None:
            try:
                outcome: TurnOutcome = future.get(timeout=0.2)  # short: Ctrl-C reaches us
            except pykka.Timeout:
                if getattr(sink, "closed", False):  # stdout's reader went away (JsonView)
                    cancel.cancel()
                return None
            return outcome

        return wait_out(step, cancel.cancel)

    def switch(self, name: str) -> None:
        check_name(name)
        old = self.session
        self._open(name)
        if old is not None:  # its log's lock is let go: another process may open it
            self.app.sessions.remove(old)
            with contextlib.suppress(pykka.ActorDeadError):
                old.actor_ref.stop()

    def context(self) -> int:
        context: int = self.app.runtime.inference.context(self.name)
        return context

    def rewind(self, turns: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        assert self.session is not None
        report = self.session.rewind(turns).get()
        return report.taken, report.left

    def compact(self, sink: Any) -> Compacted:
        assert self.session is not None
        done: Compacted = self.session.compact(self.app.runtime, sink).get()
        return done
