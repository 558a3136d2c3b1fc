"""The chat commands of ``loopd chat``, one table: a line ``/NAME ...`` runs ``NAME``'s
function, ``/help`` lists them. A new command is one row here and its function beside
its kind of work."""

from __future__ import annotations

from actors.cli.branch import undo_in_chat
from actors.cli.chat import Command, new_session, show_help
from actors.cli.compact import compact_in_chat

__all__ = ["COMMANDS"]

COMMANDS = {c.name: c for c in (
    Command("help", "/help", "list the chat commands", show_help),
    Command("new", "/new [NAME]", "start a new session (this one is kept) and chat there",
            new_session),
    Command("undo", "/undo [N]",
            "take back the last turn (or N): kept in the log, no longer sent", undo_in_chat),
    Command("compact", "/compact",
            "shorten the conversation now: a summary and the last turns (the log keeps it all)",
            compact_in_chat),
)}  # fmt: skip
