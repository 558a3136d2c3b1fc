"""Cutting text to a limit without splitting a character: the one routine every cap uses.

The session caps a tool result in characters (``loop.tool_result_cap``); a tool host caps
output and frames in UTF-8 bytes (``tools.max_output_bytes``, ``tools.max_frame_bytes``).
Each caller writes its own note (what was cut and how to read on); the cut itself is here.
"""

from __future__ import annotations

import codecs
from typing import Literal

__all__ = ["cut"]


def cut(text: str | bytes, limit: int, unit: Literal["chars", "bytes"]) -> tuple[str, int, int]:
    """``(kept, kept_size, total_size)``: the longest prefix of at most ``limit`` units.

    Sizes are in ``unit``. Bytes are UTF-8: given bytes are decoded with bad sequences
    replaced, and ``kept_size`` counts the given bytes kept (where a reader goes on from); a
    str is cut as it is (a lone surrogate stays one). A character is never split, so
    ``kept_size`` may be up to 3 bytes under ``limit`` (an unfinished character), never more.
    """
    limit = max(0, limit)
    if unit == "chars":
        s = text if isinstance(text, str) else text.decode("utf-8", "replace")
        return s[:limit], min(len(s), limit), len(s)
    if isinstance(text, bytes):
        data, errors = text, "replace"
    else:
        data, errors = text.encode("utf-8", "surrogatepass"), "surrogatepass"
    if len(data) <= limit:
        return data.decode("utf-8", errors), len(data), len(data)
    # The decoder holds back only the bytes of a character the limit would split (at most 3);
    # bytes that are no character at all are replaced and counted as kept.
    decoder = codecs.getincrementaldecoder("utf-8")(errors)
    kept = decoder.decode(memoryview(data)[:limit], final=False)
    held, _ = decoder.getstate()
    return kept, limit - len(held), len(data)
