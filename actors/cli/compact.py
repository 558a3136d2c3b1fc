"""``loopd compact SESSION`` and ``/compact`` in chat: compact a conversation now.

A Compaction record (docs/rendering.md#compaction): the turns that do not fit
``session.compact_keep`` of the context are summarised (``session.compaction``), the last
ones stay word for word, the log keeps everything. Where, the one chooser says
(:func:`actors.service.choose.place`): through the daemon (its ``compact`` request: refused
while another client has the session), or here: on
the embedded model an elided compaction (``session.compaction`` not "summary") works on the
session's log alone, no model server and no tool hosts (the context is its ctx_size; token
counts are estimated).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from actors.base import config as cfg
from actors.base.cancel import CancelToken
from actors.base.events import Event
from actors.cli.approvers import NoTerminal
from actors.cli.chat import Chat
from actors.cli.conversation import approved, place_for, served
from actors.cli.view import LiveView
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind
from actors.log.sessiondir import check_name, session_path
from actors.service.choose import Here, start

__all__ = ["compact", "compact_in_chat"]


def compact(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    live = LiveView(err)

    def say(text: str) -> None:
        err.print(f"[dim]{escape(text)}[/]")

    check_name(args.session)  # bad usage (exit 2), said before anything starts
    rules = approved(args)
    where = place_for(args, config, say, args.session)
    if isinstance(where, Here) and config.embedded_model \
            and config.session.compaction != "summary":
        _elide_here(args.session, where.config, live)  # no model server, no tool hosts
    else:
        with served(start(where, say, rules), args, NoTerminal(), live) as conversation:
            conversation.compact(live)
    live.finish()
    return 0


class _Offline:
    """The model as an elided compaction needs it: the context, known without a server for
    the embedded model (its ctx_size); counts estimated; never asked to complete."""

    def __init__(self, config: cfg.Config) -> None:
        self.n_ctx = config.embedded.ctx_size

    def context(self, session: str) -> int:
        return self.n_ctx

    def tokens(self, session: str, text: str) -> int:
        raise InferError(InferErrorKind.CONNECT, "no model server: counted by estimate")

    def complete(self, request: ChatRequest, sink: Callable[[Event], None],
                 cancel: CancelToken) -> Completion:
        raise InferError(InferErrorKind.CONNECT, "no model server: elided")


def _elide_here(name: str, config: cfg.Config, sink: Callable[[Event], None]) -> None:
    """Compact session ``name`` by elision in this process: its log, no world (the summary
    needs no model; an elide started llama-server and three tool hosts for nothing)."""
    from actors.log.file import SessionLog
    from actors.session.compactor import compact_session

    log, _ = SessionLog.open(session_path(config, name), fsync=config.log.fsync, name=name)
    try:
        compact_session(log, config.replace("session", compaction="elide"), _Offline(config),
                        sink)
    finally:
        log.close()


def compact_in_chat(chat: Chat, argument: str) -> None:
    """``/compact``: compact the chat's conversation now."""
    live = LiveView(chat.out)
    chat.conversation.compact(live)
    live.finish()
