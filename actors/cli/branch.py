"""``loopd sessions fork``, ``loopd rewind`` and ``/undo`` in chat: a branch costs nothing, an
undo loses nothing.

Both go through the session service (actors.service.choose): the daemon when one answers
(its slot keeper saves the source's KV state first, and a rewind obeys its rule that a
session attached to another client is not touched), else here, starting no model server: a
fork only reads the source and writes the new session (actors.session.fork), a rewind
opens the session (refused while another process has it open) and appends its record.
``--log-dir`` (a world of the command's own) keeps them here; a rewind runs no tool, so it
runs on the session's own workspace whatever ``--workspace`` says. ``/undo [N]`` rewinds
the chat's own session, wherever its turns run.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.markup import escape

from actors.base import config as cfg
from actors.base.errors import UsageError
from actors.cli.chat import Chat
from actors.log.sessiondir import check_name
from actors.service.choose import choose
from actors.service.types import SessionService

__all__ = ["fork", "rewind", "rewound_text", "undo_in_chat"]


def _service(args: argparse.Namespace, config: cfg.Config,
             session: str | None = None) -> SessionService:
    """The daemon, or this process (none answers, or --local / --log-dir); said nothing."""
    own = ["--log-dir"] if args.log_dir else []
    return choose(config, lambda _: None, session=session,
                  local=getattr(args, "local", False), own=own)


def fork(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    check_name(args.source)
    check_name(args.name)
    if args.at is not None and args.at < 0:
        raise UsageError(f"--at is a turn of {args.source} (1, 2, ...; 0: only its start), "
                         f"not {args.at}")
    service = _service(args, config)
    try:
        forked = service.fork(args.source, args.name, args.at)
    finally:
        service.shutdown()
    at, records, tokens = forked.at, forked.records, forked.state_tokens
    state = (f"it starts from {args.source}'s saved KV state ({tokens:,} tokens): its first "
             "message is processed alone" if tokens else
             f"{args.source} has no saved KV state: its first message processes the whole "
             "conversation")
    if _compacted_after(config, args.source, records):  # its state holds the compacted one
        state = (f"{args.source} was compacted after turn {at}, so its saved KV state holds "
                 f"the compacted conversation: {args.name}'s first message reuses only the "
                 f"system prompt and tools and processes the conversation up to turn {at} "
                 "again")
    err.print(escape(f"session {args.name}: forked from {args.source} at turn {at} ({records} "
                     f"records copied; {args.source} is unchanged); {state}"), highlight=False)
    return 0


def _compacted_after(config: cfg.Config, source: str, copied: int) -> bool:
    """Whether ``source`` has a Compaction past the ``copied`` records a fork took."""
    from actors.log.file import read_log
    from actors.log.records import Compaction
    from actors.log.sessiondir import session_path

    records, _ = read_log(session_path(config, source), name=source)
    return any(isinstance(r, Compaction) for r in records[copied:])


def rewound_text(session: str, taken: tuple[int, ...], left: tuple[int, ...]) -> str:
    """What a rewind did, for the person."""
    turns = ", ".join(map(str, taken))
    back = (f"the next message follows turn {left[-1]}" if left else
            "the next message starts the conversation afresh")
    return (f"session {session}: took back turn{'s' if len(taken) > 1 else ''} {turns} (kept in "
            f"its log: loopd log show {session}); {back}")


def rewind(args: argparse.Namespace, config: cfg.Config, err: Console) -> int:
    check_name(args.session)
    if args.turns < 1:
        raise UsageError(f"--turns is how many turns to take back: 1 or more, not {args.turns}")
    service = _service(args, config, args.session)  # on the session's own workspace
    try:
        rewound = service.rewind(args.session, args.turns)
    finally:
        service.shutdown()
    err.print(escape(rewound_text(args.session, rewound.taken, rewound.left)), highlight=False)
    return 0


def undo_in_chat(chat: Chat, argument: str) -> None:
    """``/undo [N]``: take back the last turn (or N)."""
    if argument and not argument.isdigit():
        chat.say(f"/undo takes a number of turns (/undo, /undo 2), not {argument!r}", "yellow")
        return
    turns = int(argument or 1)
    rewound = chat.conversation.rewind(turns)
    chat.say(rewound_text(chat.session, rewound.taken, rewound.left))
