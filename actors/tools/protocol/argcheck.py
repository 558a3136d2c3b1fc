"""A fast yes for the argument schemas most tools have; jsonschema decides everything else.

``jsonschema``'s ``is_valid`` costs ~8 us per call, a quarter of a whole socket round trip.
Most tool schemas are a flat object of typed properties (strings perhaps with a pattern,
numbers perhaps with bounds), so :func:`quick_check` turns such a schema into a plain
function that answers True only when the arguments are certainly valid. Any other schema
gives None, and False means "not sure": the host then asks the full validator, which stays
the judge (and writes the error message).

A schema :func:`quick_check` takes is a valid JSON Schema by construction (it refuses
anything the metaschema would: a description that is not text, a name required twice, a
bound that is not a number), so :class:`ArgumentCheck` imports and builds jsonschema only
for the first arguments the quick check does not vouch for. Importing jsonschema costs
about 0.12 s of CPU (its metaschemas, ``referencing``, ``attrs``): a tool host of the
standard tools, and a session that only sees usual arguments, never pay it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from actors.base.errors import UsageError

__all__ = ["ArgumentCheck", "quick_check"]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),  # 1.0 is an integer to jsonschema too, but it is left to jsonschema
    "number": (int, float),
    "boolean": (bool,),
}
_NOTES = {"description", "title"}  # keys that do not constrain anything (text, if there)
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties"} | _NOTES
_BOUNDS: dict[str, Callable[[Any, Any], bool]] = {  # a number's bounds: value, bound -> ok
    "minimum": lambda v, b: v >= b,
    "maximum": lambda v, b: v <= b,
    "exclusiveMinimum": lambda v, b: v > b,
    "exclusiveMaximum": lambda v, b: v < b,
}


def _notes_are_text(schema: Mapping[str, Any]) -> bool:
    return all(type(schema[k]) is str for k in _NOTES if k in schema)


def quick_check(schema: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool] | None:
    """A function that is True only for arguments ``schema`` accepts; None if out of reach."""
    if not set(schema) <= _OBJECT_KEYS or schema.get("type") != "object":
        return None
    props = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if type(props) is not dict or type(required) is not list or type(extra) is not bool:
        return None
    if not _notes_are_text(schema):
        return None
    types: dict[str, tuple[type, ...]] = {}
    patterns: dict[str, re.Pattern[str]] = {}  # jsonschema's "pattern": re.search
    bounds: dict[str, list[tuple[Callable[[Any, Any], bool], Any]]] = {}
    for name, prop in props.items():
        if type(prop) is not dict or not set(prop) <= {"type", "pattern"} | _NOTES | set(_BOUNDS):
            return None
        if type(name) is not str or not _notes_are_text(prop):
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
        for key in _BOUNDS.keys() & prop.keys():
            bound = prop[key]
            if kind not in ("integer", "number") or type(bound) not in (int, float):
                return None
            if bound != bound or bound in (float("inf"), float("-inf")):  # not JSON numbers
                return None
            bounds.setdefault(name, []).append((_BOUNDS[key], bound))
    if not all(type(r) is str for r in required) or len(set(required)) != len(required):
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
            elif (
                type(value) not in allowed  # exact types: True is not an integer
                or (key in patterns and patterns[key].search(value) is None)
                or (key in bounds and not all(ok(value, b) for ok, b in bounds[key]))
            ):
                return False
        return True

    return check


class ArgumentCheck:
    """A tool's argument schema, compiled once: the quick yes, then jsonschema.

    Used by the tool host (the trust boundary) and by the session's dispatch (so the model
    hears about bad arguments without a round trip). Building one raises UsageError for an
    invalid schema; the full validator of a schema the quick check takes is built (and
    jsonschema imported) when arguments first need it.
    """

    __slots__ = ("_quick", "_schema", "_validator")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._schema = dict(schema)
        self._quick = quick_check(self._schema)
        self._validator: Any = None
        if self._quick is None:
            self._validator = _validator(self._schema)

    def problem(self, arguments: Mapping[str, Any]) -> tuple[str, str] | None:
        """None when ``arguments`` are valid, else (where, what is wrong) of the best error."""
        if self._quick is not None and self._quick(arguments):
            return None
        if self._validator is None:
            self._validator = _validator(self._schema)
        if self._validator.is_valid(arguments):
            return None
        import jsonschema.exceptions

        error = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if error is None:
            return None
        return "/".join(str(p) for p in error.absolute_path) or "the arguments", error.message


def _validator(schema: dict[str, Any]) -> Any:
    """jsonschema's validator of ``schema``; UsageError (its reason) when it is invalid."""
    import jsonschema  # slow to import: only when a schema or arguments need it

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except jsonschema.exceptions.SchemaError as e:
        raise UsageError(e.message) from None
    return cls(schema)
