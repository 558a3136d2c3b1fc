"""The session a command talks to: through the daemon or in this process, the same either way.

:func:`open_conversation` gives a :class:`Conversation` on session ``args.session``, on the
session service :func:`actors.service.choose.choose` picks from the command's flags: the
daemon when one answers (and not ``--local``), else a world of this process. Both show the
same events, the same outcome and the same errors; Ctrl-C cancels a turn either way,
``approver`` answers the calls that wait for approval (actors.cli.approvers), and the
``--approve`` rules go with every turn. Chat moves it to another session (``/new``) with
:meth:`Conversation.switch`.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from actors.base import config as cfg
from actors.base.errors import UsageError
from actors.base.events import Approver, Sink, TornTail
from actors.base.rules import RuleBook, parse_rules
from actors.log.file import read_log
from actors.log.sessiondir import check_name, session_path
from actors.service.choose import Here, place, start
from actors.service.types import CompactReport, Rewound, SessionService, TurnOutcome
from actors.session.limits import shown_tokens

if TYPE_CHECKING:  # the daemon's client: only when a daemon answers (service.choose)
    from actors.service.remote import RemoteService

__all__ = ["Conversation", "approved", "open_conversation", "place_for", "service_for",
           "shown_size"]


def approved(args: argparse.Namespace) -> RuleBook:
    """The ``--approve`` rules, checked like tools.allow (UsageError naming the flag)."""
    try:
        return RuleBook(parse_rules(args.approve))
    except ValueError as e:
        raise UsageError(f"--approve: {e}") from None


def shown_size(config: cfg.Config, name: str) -> int:
    """How full session ``name``'s prompt is, as its log file says now (0: no such session
    or not known): the last shown request's prompt and answer, or the estimate of the
    compaction that came after it (the last Usage record no longer counts then)."""
    path = session_path(config, name)
    if not path.is_file():
        return 0
    records, _ = read_log(path, name=name)
    return shown_tokens(records)


def place_for(args: argparse.Namespace, config: cfg.Config, say: Callable[[str], None],
              session: str | None = None) -> RemoteService | Here:
    """Where a command of the CLI runs its sessions, chosen from its flags: ``--local``;
    ``--url``, ``--workspace``, ``--log-dir`` (a world of its own)."""
    own = [flag for flag, given in (("--url", args.url), ("--workspace", args.workspace),
                                    ("--log-dir", args.log_dir)) if given]
    return place(config, say, session=session, local=args.local, own=own,
                 workspace_given=bool(args.workspace))


def service_for(args: argparse.Namespace, config: cfg.Config, say: Callable[[str], None],
                session: str | None = None) -> SessionService:
    """The session service of a command of the CLI (:func:`place_for`), with its
    ``--approve`` rules."""
    rules = approved(args)  # bad usage, said before anything starts
    return start(place_for(args, config, say, session), say, rules)


@contextlib.contextmanager
def open_conversation(
    args: argparse.Namespace, config: cfg.Config, status: Callable[[str], None], notice: Sink,
    approver: Approver,
) -> Iterator[Conversation]:
    """A conversation on session ``args.session``, its service ended when the block ends."""
    check_name(args.session)  # bad usage (exit 2), said before anything starts
    with served(service_for(args, config, status, args.session), args, approver,
                notice) as conversation:
        yield conversation


@contextlib.contextmanager
def served(service: SessionService, args: argparse.Namespace, approver: Approver,
           notice: Sink) -> Iterator[Conversation]:
    """A conversation on session ``args.session`` on ``service``, ended when the block ends."""
    try:
        yield Conversation(service, args.session, approver, tuple(args.approve), notice)
    finally:
        service.shutdown()


class Conversation:
    """One session at a time, on a service that stays up while the command runs; chat moves
    it to another session (``/new``) with :meth:`switch`."""

    def __init__(self, service: SessionService, name: str, approver: Approver,
                 approve: tuple[str, ...], notice: Sink) -> None:
        self.service, self.approver, self.approve, self.notice = service, approver, approve, notice
        self.name, self._context = "", 0
        self._open(name)

    @property
    def config(self) -> cfg.Config:
        """What the session runs with (its kept workspace: actors.service.choose)."""
        return self.service.config

    def _open(self, name: str) -> None:
        opened = self.service.open(name)
        self.name, self._context = name, opened.context
        if opened.cut_bytes:
            self.notice(TornTail(session=name, cut_bytes=opened.cut_bytes))

    def turn(self, message: str, sink: Sink) -> TurnOutcome:
        """One turn; Ctrl-C cancels it and waits for it to wind down."""
        outcome = self.service.turn(self.name, message, sink, self.approver,
                                    approve=self.approve)
        self._context = outcome.context or self._context
        return outcome

    def switch(self, name: str) -> None:
        """Leave this session (its log's lock let go: another process may open it), open
        (or make) ``name``."""
        check_name(name)
        old = self.name
        self._open(name)
        self.service.close(old)

    def context(self) -> int:
        """Tokens a slot of its model server holds; 0: not known."""
        return self._context

    def rewind(self, turns: int) -> Rewound:
        return self.service.rewind(self.name, turns)  # actors.session.fork

    def compact(self, sink: Sink) -> CompactReport:
        return self.service.compact(self.name, sink)  # actors.session.compactor
