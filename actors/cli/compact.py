"""``loopd compact SESSION`` and ``/compact`` in chat: compact a conversation now.

A Compaction record (docs/rendering.md#compaction): the turns that do not fit
``session.compact_keep`` of the context are summarised (``session.compaction``), the last
ones stay word for word, the log keeps everything. Through the daemon when one answers
(its ``compact`` request: refused while another client has the session), else here.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from actors.base import config as cfg
from actors.cli.approvers import NoTerminal
from actors.cli.chat import Chat, command
from actors.cli.conversation import open_conversation
from actors.cli.view import LiveView

__all__ = ["compact"]


def compact(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    live = LiveView(err)
    with open_conversation(args, config, lambda s: err.print(f"[dim]{escape(s)}[/]"), live,
                           NoTerminal()) as conversation:
        conversation.compact(live)
    live.finish()
    return 0


@command("compact", "/compact", "shorten the conversation now: a summary and the last turns "
         "(the log keeps it all)")
def _compact(chat: Chat, argument: str) -> None:
    live = LiveView(chat.out)
    chat.conversation.compact(live)
    live.finish()
