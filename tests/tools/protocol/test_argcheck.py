"""quick_check never says yes where jsonschema says no, and says yes to the usual arguments."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given
from hypothesis import strategies as st

from actors.tools.protocol.argcheck import quick_check
from actors.tools.providers.standard import STANDARD_SPECS

_NAMES = st.sampled_from(["text", "path", "n", "flag", "x"])
_TYPES = st.sampled_from(["string", "integer", "number", "boolean"])
_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=5),
    st.lists(st.integers(), max_size=2), st.just(1.0),
)  # fmt: skip

_MAPS = st.dictionaries(st.text(max_size=2), st.integers(), max_size=2)

_schemas = st.fixed_dictionaries(
    {
        "type": st.just("object"),
        "properties": st.dictionaries(_NAMES, _TYPES.map(lambda t: {"type": t}), max_size=4),
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


def test_schemas_with_more_than_types_are_left_to_jsonschema() -> None:
    assert quick_check(STANDARD_SPECS["read_file"].parameters) is None  # "minimum"
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
