"""Where a command's sessions run: the one choice between the daemon and this process.

A session keeps the workspace it was made with (:mod:`actors.session.workspace`): a command
naming a session and given no ``--workspace`` runs it there, and says so when that is not
the config's; one given another is refused before anything starts (exit 2).

Then: ``local`` (``--local``) runs in this process; so does a command when no daemon
answers. Flags that describe a world of the command's own (``--url``, ``--workspace``,
``--log-dir``: ``own``) keep it here too, and it says so when a daemon is running, since
this starts a second model server (and tool hosts) beside the daemon's. A daemon serves one
workspace (its ``status``): a session whose workspace is another runs here instead (said);
a new session is told the daemon's, unless the command's workspace is ``fixed`` (an
editor's project, ``loopd acp``): then the daemon is used only when it serves that one.

:func:`place` makes the choice, :func:`start` acts on it, :func:`choose` does both: a
command that needs less than a world when it runs here (an elided ``loopd compact``) asks
:func:`place` and starts no world.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from actors.base.config import Config
from actors.base.errors import UsageError
from actors.base.rules import RuleBook
from actors.daemon.address import may_answer
from actors.log.file import check_free
from actors.log.sessiondir import kept_workspace, session_path
from actors.service.types import SessionService
from actors.session.workspace import other_workspace

if TYPE_CHECKING:  # the daemon's client and protocol load only when a daemon may answer
    from actors.daemon.client import Client
    from actors.service.remote import RemoteService

__all__ = ["Here", "choose", "place", "start"]


@dataclass(frozen=True, slots=True)
class Here:
    """The choice to run in this process, with the config the session runs with there."""

    config: Config


def choose(
    config: Config, say: Callable[[str], None], *, session: str | None = None,
    local: bool = False, own: Sequence[str] = (), workspace_given: bool = False,
    fixed: bool = False, approve: RuleBook | None = None,
) -> SessionService:  # fmt: skip
    """The session service a command runs ``session`` (or its sessions) with, its config
    the one the session runs with. ``own``: the flags given that make a world of the
    command's own; ``approve``: this command's allow rules, for a world started here (the
    daemon takes them with each turn)."""
    where = place(config, say, session=session, local=local, own=own,
                  workspace_given=workspace_given, fixed=fixed)
    return start(where, say, approve)


def start(where: RemoteService | Here, say: Callable[[str], None],
          approve: RuleBook | None = None) -> SessionService:
    """The session service of a choice :func:`place` made: the daemon's, or a world started
    in this process (its model server and tool hosts)."""
    if not isinstance(where, Here):
        return where
    from actors.service.local import LocalService  # pykka: only when the sessions run here

    return LocalService.start(where.config, say, approve)


def place(
    config: Config, say: Callable[[str], None], *, session: str | None = None,
    local: bool = False, own: Sequence[str] = (), workspace_given: bool = False,
    fixed: bool = False,
) -> RemoteService | Here:  # fmt: skip
    """Where ``session`` (or a command's sessions) runs: through the daemon (its service,
    connected) or :class:`Here`, nothing started yet (the flags as :func:`choose`'s)."""
    kept = kept_workspace(config, session) if session is not None else None
    if kept is not None and kept != config.workspace:
        if workspace_given:
            raise UsageError(other_workspace(session or "", kept, config.workspace))
        say(f"session {session} works on {kept}, the workspace it was made with")
        config = config.replace("tools", workspace=str(kept))
    client = None if local or not may_answer(config) else _find_daemon(config)
    if client is not None:
        from actors.service.remote import RemoteService

        through = _through(client, config, say, session, kept, own, fixed)
        if through is not None:
            return RemoteService(client, config, *through)
        client.close()
    if session is not None:  # said at once, not after the model server's start-up
        check_free(session_path(config, session), session)
    return Here(config)


def _find_daemon(config: Config) -> Client | None:
    from actors.daemon.client import find_daemon  # zmq and the protocol: a daemon may answer

    return find_daemon(config)


def _through(
    client: Client, config: Config, say: Callable[[str], None], session: str | None,
    kept: Path | None, own: Sequence[str], fixed: bool,
) -> tuple[Path, str] | None:  # fmt: skip
    """The workspace and, for the person, the place of the daemon ``client`` reaches when it
    runs the sessions; None: it does not (said)."""
    if own:
        say(f"a loopd daemon is running, but {own[0]} gives this command a world of its own: "
            "it starts its own model server and tool hosts beside the daemon's (--local "
            "says so quietly; leave the flag out to use the daemon)")
        return None
    status = client.status()
    where, theirs = f"the loopd daemon (pid {status.pid})", status.workspace
    if fixed:
        if theirs and Path(theirs) == config.workspace:
            return config.workspace, where
        say(f"the loopd daemon serves {theirs or 'another workspace'}, not {config.workspace}: "
            "running in this process")
        return None
    if not theirs:
        return config.workspace, where  # a daemon older than status.workspace
    if kept is not None and Path(theirs) != kept:
        say(f"the daemon works on {theirs}: session {session} runs in this process instead")
        return None
    if kept is None and session is not None and Path(theirs) != config.workspace:
        say(f"through the daemon: session {session} works on its workspace, {theirs}")
    return Path(theirs), where
