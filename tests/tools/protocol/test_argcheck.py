"""quick_check never says yes where jsonschema says no, and says yes to the usual arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.base.errors import UsageError
from actors.tools.protocol.argcheck import ArgumentCheck, quick_check
from actors.tools.protocol.standard_specs import STANDARD_SPECS

ROOT = Path(__file__).resolve().parents[3]
_NAMES = st.sampled_from(["text", "path", "n", "flag", "x"])
_TYPES = st.sampled_from(["string", "integer", "number", "boolean"])
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
    st.lists(st.integers(), max_size=2), st.just(1.0),
)  # fmt: skip

_MAPS = st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)

_BOUND = st.one_of(st.integers(-3, 3), st.floats(-3, 3, allow_nan=False), st.just(1.0))
_PROPERTIES = st.one_of(
    _TYPES.map(lambda t: {"type": t}),
    st.builds(lambda t, k, b: {"type": t, k: b}, st.sampled_from(["integer", "number"]),
              st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]),
              _BOUND),
)

_schemas = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(_NAMES, _PROPERTIES, max_size=4),
    },
    optional={
        "required": st.lists(_NAMES, max_size=3, unique=True),
        "additionalProperties": st.booleans(),
        "description": st.text(max_size=5),
    },
)


@given(_schemas, st.dictionaries(_NAMES, st.one_of(_VALUES, _MAPS), max_size=4))
def test_a_yes_is_always_a_yes_of_jsonschema(schema: dict[str, Any], arguments: Any) -> None:
    check = quick_check(schema)
    assert check is not None
    validator = jsonschema.validators.validator_for(schema)(schema)
    if check(arguments):
        assert validator.is_valid(arguments)


# Schemas near the quick check's reach, valid or not: notes that are not text, a name
# required twice, bounds that are not numbers or on the wrong type, unknown keys.
_ANY = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False),
                 st.text(max_size=3), st.lists(st.integers(), max_size=2))
_ODD_KEYS = st.sampled_from(["type", "pattern", "description", "title", "minimum", "maximum",
                             "exclusiveMinimum", "exclusiveMaximum", "minLength"])
_ODD_VALUES = st.one_of(_TYPES, st.sampled_from(["^a", "[", "string", "object"]), _ANY)
_ODD_PROPERTIES = st.one_of(
    st.builds(lambda t, k, v: {"type": t, k: v}, _TYPES, _ODD_KEYS, _ODD_VALUES),
    st.dictionaries(_ODD_KEYS, _ODD_VALUES, max_size=4),
)
_near_schemas = st.fixed_dictionaries(
    {"type": st.sampled_from(["object", "object", "object", "array"])},
    optional={
        "properties": st.dictionaries(_NAMES, _PROPERTIES | _ODD_PROPERTIES, max_size=3),
        "required": st.lists(_NAMES, max_size=3),  # a name twice, now and then
        "additionalProperties": st.one_of(st.booleans(), _ANY),
        "description": _ANY,
        "title": _ANY,
    },
)


@settings(max_examples=300)
@given(_near_schemas)
def test_a_schema_the_quick_check_takes_is_a_valid_schema(schema: dict[str, Any]) -> None:
    """What lets ArgumentCheck leave jsonschema unimported (tool hosts start without it):
    the quick check never takes a schema the metaschema refuses."""
    if quick_check(schema) is not None:
        jsonschema.validators.validator_for(schema).check_schema(schema)


def _typed(**prop: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"n": prop}}


@pytest.mark.parametrize("schema", [
    {"type": "object", "description": 5},
    {"type": "object", "title": None},
    {"type": "object", "required": ["a", "a"]},
    _typed(type="integer", minimum="1"),
    _typed(type="number", exclusiveMaximum=True),
    _typed(type="number", maximum=None),
    _typed(type="string", description=["x"]),
    _typed(type="string", title=1),
    _typed(type="string", pattern=5),
])  # fmt: skip
def test_a_schema_the_metaschema_refuses_is_not_taken_by_the_quick_check(
    schema: dict[str, Any],
) -> None:
    with pytest.raises(jsonschema.exceptions.SchemaError):
        jsonschema.validators.validator_for(schema).check_schema(schema)
    assert quick_check(schema) is None


def test_a_check_of_usual_arguments_needs_no_jsonschema_and_an_invalid_schema_is_refused() -> None:
    code = (
        "import sys\n"
        "from actors.tools.protocol.argcheck import ArgumentCheck\n"
        "from actors.tools.protocol.standard_specs import STANDARD_SPECS\n"
        "checks = {n: ArgumentCheck(s.parameters) for n, s in STANDARD_SPECS.items()}\n"
        "assert checks['read_file'].problem({'path': 'a.txt', 'offset': 2}) is None\n"
        "assert checks['run_command'].problem({'command': 'ls', 'timeout_s': 5}) is None\n"
        "assert 'jsonschema' not in sys.modules, 'imported'\n"
        "where, what = checks['read_file'].problem({'path': 5})\n"
        "assert where == 'path' and 'is not of type' in what, (where, what)\n"
        "assert 'jsonschema' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    with pytest.raises(UsageError, match=r"is not valid under any of the given schemas"):
        ArgumentCheck({"type": "object", "properties": {"a": {"type": "strnig"}}})


@given(_schemas, _VALUES)
def test_arguments_that_are_not_a_map_are_never_a_yes(schema: dict[str, Any], value: Any) -> None:
    check = quick_check(schema)
    assert check is not None
    assert not check(value)


def test_the_usual_arguments_get_a_yes_and_bad_ones_a_no() -> None:
    check = quick_check(STANDARD_SPECS["echo"].parameters)
    assert check is not None
    assert check({"text": "hi"})
    assert not check({})
    assert not check({"text": 5})
    assert not check({"text": "hi", "other": 1})


def test_schemas_with_more_than_types_and_bounds_are_left_to_jsonschema() -> None:
    assert quick_check(STANDARD_SPECS["read_file"].parameters) is not None  # "minimum" too
    assert (
        quick_check({"type": "object", "properties": {"a": {"type": "string", "minLength": 1}}})
        is None
    )
    assert quick_check({"type": "array"}) is None
    assert (
        quick_check({"$schema": "http://json-schema.org/draft-03/schema#", "type": "object"})
        is None
    )
    assert (
        quick_check({"type": "object", "properties": {"a": {"type": ["string", "null"]}}}) is None
    )


@given(st.text(max_size=6, alphabet=st.sampled_from(["a", "/", ".", "*", "?", "\n", "\x1f", " "])))
def test_a_path_pattern_is_checked_like_jsonschema_checks_it(path: str) -> None:
    schema = STANDARD_SPECS["list_dir"].parameters
    check = quick_check(schema)
    assert check is not None  # the file tools keep the fast path with their path pattern
    valid = jsonschema.validators.validator_for(schema)(schema).is_valid({"path": path})
    assert check({"path": path}) is valid
    # Python's $ also matches before one newline at the end: jsonschema lets that one pass
    # (the grammar cannot produce it)
    assert valid is not any(c in path.removesuffix("\n") for c in "*?\n\x1f")
