"""A session keeps the workspace it was made with.

The file tools of a session work on one directory: the workspace of the command that made
the session. It is remembered beside the log (``log.dir/NAME/workspace``, the resolved
path as text, written once when the session is first opened) rather than in the log's
Baseline record, so that the log's bytes and every older loopd's reading of them stay as
they are. A session older than this file adopts the workspace of its next open.

A command given no ``--workspace`` runs a session on its own workspace (the CLI says so
when that is not the config's); a world whose workspace is another refuses the session
with :class:`~actors.base.errors.UsageError` naming both (:func:`keep_workspace`).
"""

from __future__ import annotations

from pathlib import Path

from actors.base.config import Config
from actors.base.durable import replace_file
from actors.base.errors import UsageError

__all__ = ["FILE", "keep_workspace", "kept_workspace", "other_workspace"]

FILE = "workspace"


def kept_workspace(config: Config, name: str) -> Path | None:
    """The workspace session ``name`` was made with; None when none is known (no such
    session yet, or one made before sessions kept theirs)."""
    try:
        text = (config.log_dir / name / FILE).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, NotADirectoryError, UnicodeDecodeError):
        return None
    return Path(text) if text else None


def other_workspace(name: str, kept: Path, given: Path) -> str:
    """Why session ``name`` (made on ``kept``) does not run on ``given``, and what to do."""
    return (f"session {name} works on {kept} (the workspace it was made with), not {given}: "
            f"leave --workspace out (or give {kept}), or start a new session for {given} "
            "(--session NEW-NAME)")


def keep_workspace(config: Config, name: str) -> None:
    """Remember the workspace of session ``name`` at its first open; UsageError when it was
    made with another one than ``config``'s. Nothing to keep when no local tool uses one."""
    from actors.tools.toolbox import uses_workspace  # the world's process only, not the CLI's

    if not uses_workspace(config):
        return
    kept, here = kept_workspace(config, name), config.workspace
    if kept is None:
        replace_file(config.log_dir / name / FILE, f"{here}\n".encode())
    elif kept != here:
        raise UsageError(other_workspace(name, kept, here))
