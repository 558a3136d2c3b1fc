"""Cutting text to a limit without splitting a character: the one routine every cap uses.

The session caps a tool result in characters (``loop.tool_result_cap``); a tool host caps
output and frames in UTF-8 bytes (``tools.max_output_bytes``, ``tools.max_frame_bytes``).
Each caller writes its own note (what was cut and how to read on); the cut itself is here.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["cut"]


def cut(text: str | bytes, limit: int, unit: Literal["chars", "bytes"]) -> tuple[str, int, int]:
    """``(kept, kept_size, total_size)``: the longest prefix of at most ``limit`` units.

    Sizes are in ``unit``. Bytes are UTF-8 (given bytes are decoded, bad sequences replaced);
    a character is never split, so ``kept_size`` may be a little under ``limit``.
    """
    limit = max(0, limit)
    if unit == "chars":
        s = text if isinstance(text, str) else text.decode("utf-8", "replace")
        return s[:limit], min(len(s), limit), len(s)
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return data.decode("utf-8", "replace"), len(data), len(data)
    end = limit
    while end > 0 and (data[end] & 0xC0) == 0x80:  # data[end] continues a character
        end -= 1
    return data[:end].decode("utf-8", "replace"), end, len(data)
