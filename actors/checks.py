"""Field checks shared by loopd's two msgpack codecs: log records and tool wire messages.

A check takes a decoded value and returns the Python value, or raises ``TypeError`` saying
what it expected; the codec adds the kind and the field to the message.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

__all__ = ["Check", "exact", "member"]

Check: TypeAlias = Callable[[Any], Any]
E = TypeVar("E", bound=enum.Enum)


def exact(*types: type) -> Check:
    """The value itself if its type is exactly one of ``types``."""

    def check(v: Any) -> Any:
        # bool is an int subclass: an int field must not accept True, nor a bool field 1.
        if type(v) not in types:
            names = " or ".join(t.__name__ for t in types)
            raise TypeError(f"expected {names}, got {type(v).__name__}")
        return v

    return check


def member(kind: type[E]) -> Callable[[Any], E]:
    """The member of ``kind`` whose value ``v`` is (or ``v`` itself, a member already)."""
    by_value: dict[Any, E] = {m.value: m for m in kind}
    allowed = ", ".join(str(m.value) for m in kind)

    def check(v: Any) -> E:
        try:
            return by_value[v]  # a dict look-up costs less than calling the enum
        except (KeyError, TypeError):  # TypeError: an unhashable value
            raise TypeError(f"expected one of {allowed}, got {v!r:.40}") from None

    return check
