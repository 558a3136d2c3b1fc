"""The entry of the session's last listing that a question names by its place.

"What files are in the workspace?" then "What does the third one say?": the embedded model
cannot count (it read the fourth file), so the turn finds the file itself
(:func:`actors.session.smallmodel.decision_word.place_named` gives the place) and holds the
read to it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from actors.log.records import Assistant, Record, ToolCall, ToolResult

__all__ = ["listed_entry"]


def listed_entry(records: Sequence[Record], place: int) -> str | None:
    """The path of entry ``place`` (1 the first, -1 the last) of the last ``list_dir``
    result in ``records`` that listed a folder, or None (no such listing or entry). The
    result is the standard tool's: a line per entry, ``name  size`` for a file, ``name/``
    for a folder, in name order."""
    listed: dict[str, str] = {}  # call id -> the folder it listed
    last: tuple[str, str] | None = None
    for record in records:
        if isinstance(record, Assistant):
            for call in record.tool_calls:
                if call.tool == "list_dir":
                    listed[call.id] = _folder(call)
        elif isinstance(record, ToolResult) and record.tool_call_id in listed:
            last = listed[record.tool_call_id], record.content
    if last is None:
        return None
    folder, content = last
    entries = [line.split("  ")[0] for line in content.splitlines() if line.strip()]
    if not -len(entries) <= (place - 1 if place > 0 else place) < len(entries):
        return None
    name = entries[place - 1 if place > 0 else place]
    return name if folder in ("", ".") else f"{folder.rstrip('/')}/{name}"


def _folder(call: ToolCall) -> str:
    """The folder a list_dir call (by name or through call_tool) listed ("." by default)."""
    try:
        arguments = json.loads(call.arguments)
        if call.name == "call_tool":
            arguments = arguments.get("arguments", {})
        path = arguments.get("path", ".")
    except (ValueError, AttributeError):
        return "."
    return path.removeprefix("./") if isinstance(path, str) else "."
