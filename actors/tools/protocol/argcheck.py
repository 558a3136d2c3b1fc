"""A fast yes for the argument schemas most tools have; jsonschema decides everything else.

``jsonschema``'s ``is_valid`` costs ~8 us per call, a quarter of a whole socket round trip.
Most tool schemas are a flat object of typed properties (strings perhaps with a pattern),
so :func:`quick_check` turns such a schema into a plain function that answers True only
when the arguments are certainly valid. Any other schema gives None, and False means "not
sure": the host then asks the full validator, which stays the judge (and writes the error
message).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema

__all__ = ["ArgumentCheck", "quick_check"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),  # 1.0 is an integer to jsonschema too, but it is left to jsonschema
    "number": (int, float),
    "boolean": (bool,),
}
_NOTES = {"description", "title"}  # keys that do not constrain anything
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties"} | _NOTES


def quick_check(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool] | None:
    """A function that is True only for arguments ``schema`` accepts; None if out of reach."""
    if not set(schema) <= _OBJECT_KEYS or schema.get("type") != "object":
        return None
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if type(props) is not dict or type(required) is not list or type(extra) is not bool:
        return None
    types: dict[str, tuple[type, ...]] = {}
    patterns: dict[str, re.Pattern[str]] = {}  # jsonschema's "pattern": re.search
    for name, prop in props.items():
        if type(prop) is not dict or not set(prop) <= {"type", "pattern"} | _NOTES:
            return None
        kind = prop.get("type")
        t = _TYPES.get(kind) if type(kind) is str else None
        if t is None:
            return None
        types[name] = t
        if "pattern" in prop:
            if kind != "string" or type(prop["pattern"]) is not str:
                return None
            try:
                patterns[name] = re.compile(prop["pattern"])
            except re.error:
                return None
    if not all(type(r) is str for r in required):
        return None
    needed = frozenset(required)

    def check(arguments: Mapping[str, Any]) -> bool:
        if type(arguments) is not dict or not needed <= arguments.keys():
            return False
        for key, value in arguments.items():
            allowed = types.get(key)
            if allowed is None:
                if not extra:
                    return False
            elif type(value) not in allowed or (  # exact types: True is not an integer
                key in patterns and patterns[key].search(value) is None
            ):
                return False
        return True

    return check


class ArgumentCheck:
    """A tool's argument schema, compiled once: the quick yes, then jsonschema.

    Used by the tool host (the trust boundary) and by the session's dispatch (so the model
    hears about bad arguments without a round trip). Building one raises
    ``jsonschema.exceptions.SchemaError`` for an invalid schema.
    """

    __slots__ = ("_quick", "_validator")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        plain = dict(schema)
        cls = jsonschema.validators.validator_for(plain)
        cls.check_schema(plain)
        self._validator = cls(plain)
        self._quick = quick_check(plain)

    def problem(self, arguments: Mapping[str, Any]) -> tuple[str, str] | None:
        """None when ``arguments`` are valid, else (where, what is wrong) of the best error."""
        if (self._quick is not None and self._quick(arguments)) or self._validator.is_valid(
            arguments
        ):
            return None
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        return "/".join(str(p) for p in error.absolute_path) or "the arguments", error.message
