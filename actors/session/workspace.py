"""A session keeps the workspace it was made with.

The file tools of a session work on one directory: the workspace of the command that made
the session. It is remembered beside the log (``log.dir/NAME/workspace``, in the session
directory, actors.log.sessiondir: the resolved path as text, written once when the session
is first opened) rather than in the log's Baseline record, so that the log's bytes and
every older loopd's reading of them stay as they are. A session older than this file
adopts the workspace of its next open.

A command given no ``--workspace`` runs a session on its own workspace (the CLI says so
when that is not the config's); a world whose workspace is another refuses the session
with :class:`~actors.base.errors.UsageError` naming both (:func:`keep_workspace`).
"""

from __future__ import annotations

from pathlib import Path

from actors.base.config import Config
from actors.base.durable import replace_file
from actors.base.errors import UsageError
from actors.log.sessiondir import WORKSPACE, kept_workspace

__all__ = ["keep_workspace", "other_workspace"]


def other_workspace(name: str, kept: Path, given: Path) -> str:
    """Why session ``name`` (made on ``kept``) does not run on ``given``, and what to do."""
    return (f"session {name} works on {kept} (the workspace it was made with), not {given}: "
            f"leave --workspace out (or give {kept}), or start a new session for {given} "
            "(--session NEW-NAME)")


def keep_workspace(config: Config, name: str) -> None:
    """Remember the workspace of session ``name`` at its first open; UsageError when it was
    made with another one than ``config``'s. Nothing to keep when no local tool uses one."""
    if not config.uses_workspace:
        return
    kept, here = kept_workspace(config, name), config.workspace
    if kept is None:
        replace_file(config.log_dir / name / WORKSPACE, f"{here}\n".encode())
    elif kept != here:
        raise UsageError(other_workspace(name, kept, here))
