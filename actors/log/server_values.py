"""The numbers a model server sends, checked before they reach a record.

``usage`` and ``timings`` are bookkeeping: the answer does not depend on them, but the log
keeps them and later turns compute with them (the cache check, the summary line). A value
of the wrong type or out of range (a string, a bool, a negative count, a count above
2**63 - 1, NaN, infinity, a nested object) is left out here, so the answer is kept and no
later turn trips over it. :func:`timings` also runs when a log is read, so a log that an
older loopd wrote with such a value still opens and runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_COUNT", "MAX_FIELDS", "MAX_WORD", "all_kept", "count", "number", "timings", "usage",
    "word",
]  # fmt: skip

MAX_COUNT = 2**63 - 1  # what a log record's integer holds (msgpack int64)
MAX_FIELDS = 64  # timings entries kept: llama-server sends about ten
_MAX_KEY = 64  # characters of a timings key
MAX_WORD = 64  # characters of a finish_reason ("stop", "length", "tool_calls")


def count(value: Any) -> int | None:
    """``value`` if it is a token count (an int from 0 to MAX_COUNT), else None."""
    if type(value) is int and 0 <= value <= MAX_COUNT:
        return value
    return None


def word(value: Any) -> str | None:
    """``value`` if it is a short text (a finish_reason), else None."""
    return value if type(value) is str and len(value) <= MAX_WORD else None


def number(value: Any) -> int | float | None:
    """``value`` if it is a count or a finite, non-negative float (a duration, a rate)."""
    if type(value) is float:
        return value if math.isfinite(value) and value >= 0 else None
    return count(value)


def timings(obj: Any) -> dict[str, int | float]:
    """The well-formed entries of a ``timings`` object (text keys, numbers); {} for a non-map."""
    if type(obj) is not dict and not isinstance(obj, Mapping):
        return {}
    # One comprehension, not a loop calling number(): this runs for every Usage record of
    # a log that is opened.
    kept = {
        key: value
        for key, value in obj.items()
        if type(key) is str and len(key) <= _MAX_KEY and (
            (type(value) is int and 0 <= value <= MAX_COUNT)
            or (type(value) is float and 0.0 <= value < math.inf)  # NaN compares False
        )
    }  # fmt: skip
    if len(kept) > MAX_FIELDS:
        kept = dict(itertools.islice(kept.items(), MAX_FIELDS))
    return kept


def all_kept(obj: dict[Any, Any]) -> bool:
    """True when :func:`timings` would keep every entry of ``obj`` (a log's Usage is read
    as it is then, without a copy)."""
    if len(obj) > MAX_FIELDS:
        return False
    for key, value in obj.items():
        if type(key) is not str or len(key) > _MAX_KEY:
            return False
        t = type(value)
        if t is int:
            if not 0 <= value <= MAX_COUNT:
                return False
        elif t is not float or not 0.0 <= value < math.inf:  # NaN compares False
            return False
    return True


def usage(obj: Any) -> dict[str, Any]:
    """The token counts of a ``usage`` object that are counts; the rest is left out."""
    if not isinstance(obj, Mapping):
        return {}
    kept: dict[str, Any] = {}
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        if (n := count(obj.get(key))) is not None:
            kept[key] = n
    for key, inner in (("completion_tokens_details", "reasoning_tokens"),
                       ("prompt_tokens_details", "cached_tokens")):
        details = obj.get(key)
        if isinstance(details, Mapping) and (n := count(details.get(inner))) is not None:
            kept[key] = {inner: n}
    return kept
