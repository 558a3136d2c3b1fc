"""How full a conversation is, and the ways on from the wall: said alike by chat and run.

After a turn the prompt's tokens are set against the slot's context (:func:`fullness`);
from :data:`WARN_AT` on the person is told (:func:`size_note`), with the ways on, and a
turn refused for a full context is followed by the same ways on (:func:`ways_on`). The
ways named are those that exist where the person is: a chat lists its commands (``/new``,
``/undo``, ``/compact`` as they are registered), a command line the commands (``loopd
rewind``, ``loopd compact``).
"""

from __future__ import annotations

from collections.abc import Collection

__all__ = ["WARN_AT", "fullness", "size_note", "ways_on"]

WARN_AT = 0.75  # of the context: from here on the person is told how full it is

# What each way on does, by the name of the chat command (or ``loopd`` command) that takes it.
_IN_CHAT = {
    "new": "/new starts a new session here (session {session} stays as it is)",
    "undo": "/undo takes back the last turn (kept in the log; no longer sent)",
    "compact": "/compact shortens this one and keeps going",
}
_ON_THE_COMMAND_LINE = {
    "rewind": "loopd rewind {session} takes back the last turn (kept in the log)",
    "compact": "loopd compact {session} shortens it",
}
_LARGER = ("give the model a larger context (embedded.ctx_size, or your server's -c) and "
           "come back: the session's saved state is kept")


def fullness(used: int, context: int) -> float | None:
    """The share of the context the conversation's prompt takes (None: context not known)."""
    return used / context if context > 0 else None


def ways_on(session: str, present: Collection[str], *, chat: bool) -> str:
    """What the person can do when session ``session`` is (nearly) full, naming only the
    chat commands (``chat``) or ``loopd`` commands in ``present``."""
    if chat:
        ways = [way for name, way in _IN_CHAT.items() if name in present]
    else:
        ways = ["--session NEW-NAME starts a new session (session {session} stays as it is)"]
        ways += [way for name, way in _ON_THE_COMMAND_LINE.items() if name in present]
    ways.append(("or " if ways else "") + _LARGER)
    return "Ways on: " + "; ".join(way.format(session=session) for way in ways) + "."


def size_note(session: str, used: int, context: int, present: Collection[str], *, chat: bool,
              opened: bool = False) -> str | None:
    """What to say of ``used`` tokens of ``context`` (None: nothing worth saying yet);
    ``opened``: the session was just opened (its last turn left it so)."""
    share = fullness(used, context)
    if share is None or share < WARN_AT:
        return None
    state = "is nearly full" if share >= 0.9 else "is filling up"
    where = f"session {session} " if opened or not chat else "the conversation "
    return (f"{where}{state}: {used:,} of {context:,} tokens ({share:.0%}); a message that "
            "does not fit is refused. " + ways_on(session, present, chat=chat))
