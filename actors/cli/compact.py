"""``loopd compact SESSION`` and ``/compact`` in chat: compact a conversation now.

A Compaction record (docs/rendering.md#compaction): the turns that do not fit
``session.compact_keep`` of the context are summarised (``session.compaction``), the last
ones stay word for word, the log keeps everything. Through the daemon when one answers
(its ``compact`` request: refused while another client has the session), else here: on
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
from actors.cli.chat import Chat, command
from actors.cli.conversation import open_conversation
from actors.cli.view import LiveView
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind

__all__ = ["compact"]


def compact(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    live = LiveView(err)
    if config.embedded_model and config.session.compaction != "summary" and _here(args, config):
        _elide_here(args.session, config, live)  # no model server, no tool hosts
    else:
        with open_conversation(args, config, lambda s: err.print(f"[dim]{escape(s)}[/]"),
                               live, NoTerminal()) as conversation:
            conversation.compact(live)
    live.finish()
    return 0


def _here(args: argparse.Namespace, config: cfg.Config) -> bool:
    """Whether this command compacts in its own process (no daemon answers, or it is told
    to keep to itself)."""
    if args.local or args.url or args.workspace or args.log_dir:
        return True
    from actors.daemon.client import find_daemon

    client = find_daemon(config)
    if client is not None:
        client.close()
    return client is None


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
    from actors.log.sessiondir import check_name, session_path
    from actors.session.compactor import compact_session

    check_name(name)
    log, _ = SessionLog.open(session_path(config, name), fsync=config.log.fsync, name=name)
    try:
        compact_session(log, config.replace("session", compaction="elide"), _Offline(config),
                        sink)
    finally:
        log.close()


@command("compact", "/compact", "shorten the conversation now: a summary and the last turns "
         "(the log keeps it all)")
def _compact(chat: Chat, argument: str) -> None:
    live = LiveView(chat.out)
    chat.conversation.compact(live)
    live.finish()
