"""Field checks shared by loopd's msgpack codecs: log records and the wire protocols.

A check takes a decoded value and returns the Python value, or raises ``TypeError`` saying
what it expected; the codec adds the kind and the field to the message.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

import orjson

__all__ = [
    "MAX_DEPTH", "MAX_ID", "SCALARS", "Check", "exact", "json_data", "json_object", "member",
    "parse_json", "wire_id",
]  # fmt: skip

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


MAX_ID = 2**63 - 1
MAX_DEPTH = 64  # nesting of JSON data on a wire (tool arguments, schemas)
SCALARS = frozenset({str, int, float, bool, type(None)})


def wire_id(v: Any) -> int:
    """A request id or counter: a non-negative integer that fits in 63 bits."""
    if type(v) is not int or not 0 <= v <= MAX_ID:
        raise TypeError(f"expected a non-negative integer id, got {v!r:.40}")
    return v


def json_data(v: Any, depth: int = 0) -> Any:
    """``v`` itself, if it is JSON-shaped data nested at most MAX_DEPTH deep.

    It only looks (a copy per call cost more than the rest of a decode).
    """
    if depth > MAX_DEPTH:
        raise TypeError(f"nested deeper than {MAX_DEPTH} levels")
    t = type(v)
    if t is str or t is int or t is float or t is bool or v is None:
        return v
    if t is list:
        for x in v:
            if type(x) not in SCALARS:
                json_data(x, depth + 1)
        return v
    if t is dict:
        for k, x in v.items():
            if type(k) is not str:
                raise TypeError(f"map keys must be text, got {type(k).__name__}")
            if type(x) not in SCALARS:
                json_data(x, depth + 1)
        return v
    raise TypeError(f"{t.__name__} is not JSON data")


def json_object(v: Any) -> dict[str, Any]:
    """A map of JSON data (tool arguments, a JSON schema)."""
    if type(v) is not dict:
        raise TypeError(f"expected a map, got {type(v).__name__}")
    result: dict[str, Any] = json_data(v)
    return result


def parse_json(text: str) -> Any:
    """The JSON value in ``text`` (a model's tool-call arguments), nested at most MAX_DEPTH
    deep; ValueError says what is wrong.

    orjson, not json: it has no recursion to exhaust (100,000 nested brackets are its error,
    not RecursionError) and it refuses NaN and Infinity, which are not JSON.
    """
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise ValueError(str(e)) from None
    try:
        return json_data(value)
    except TypeError as e:
        raise ValueError(str(e)) from None
