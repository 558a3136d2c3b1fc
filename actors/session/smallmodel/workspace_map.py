"""The workspace map: a new session's view of its folder, the file names and sizes.

A small model asked "What files are here?" or "When is the launch?" does better when it
already knows what the folder holds, as other agents give their models the environment's
context. :func:`workspace_map` takes the map when a session is made; it goes into the
session's Baseline (its system prompt), so it stays the same for the session's whole life
(the log, and with it the prompt, only grows) however the folder changes later: the file
tools give the current state.

The map has at most ``limit`` entries, breadth first (the top level first), shown sorted
by path; what the file tools would refuse or the search skips (loopd's own places,
symlinks, special files, ``.git`` and the like) is left out, by the file tools' own rule
(:meth:`actors.tools.protocol.workspace.Workspace.tree`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from actors.base.errors import UsageError
from actors.tools.protocol.workspace import Entry, Workspace

__all__ = ["MAP_HEADER", "render_map", "workspace_map"]

MAP_HEADER = "The files in the workspace (path and size in bytes; a folder ends with /):"


def workspace_map(root: Path, hidden: Iterable[str], limit: int) -> str:
    """The map of ``root`` for a system prompt; "" when ``limit`` is 0 or there is no
    such directory (the file tools will say so)."""
    if limit <= 0:
        return ""
    try:
        entries, more = Workspace(root, hidden=hidden).tree(limit)
    except (UsageError, OSError):
        return ""
    return render_map(entries, more)


def render_map(entries: Sequence[Entry], more: bool) -> str:
    """The map's text: a line per entry (``path  size``, a folder ``path/``), sorted by path,
    and a last line when some entries were left out."""
    if not entries:
        return "The workspace is empty."
    lines = [e.path + "/" if e.size is None else f"{e.path}  {e.size}"
             for e in sorted(entries, key=lambda e: e.path)]
    if more:
        lines.append(f"(only the first {len(entries)} entries are shown; list_dir shows a "
                     "folder's files)")
    return "\n".join((MAP_HEADER, *lines))
