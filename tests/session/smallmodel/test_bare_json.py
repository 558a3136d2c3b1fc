"""parse_bare_tool_call: the shapes small models write are calls, prose never is."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.session.smallmodel.bare_json import parse_bare_tool_call, via_call_tool
from tests.support.recordings import FIXTURES

KNOWN = ("find_tool", "call_tool", "read_file")

# Content the real embedded model streamed, taken from the recordings in
# tests/fixtures/http (see test_recorded_content_matches_the_fixtures).
LENGTH_HTTP = (
    '{"name": "find_tool", "description": "Find tools by what they do.", "parameters": {"query":'
)
FIRST_LINE = (
    '{"name": "find_tool", "arguments": {"query": "list files in notes.txt and plan.md in src/",'
    ' "required": ["query"]}}'
)
REPEATED = (
    FIRST_LINE + "\n"
    '{"name": "call_tool", "arguments": {"name": "list_dir", "arguments": {"path": "notes.txt",'
    ' "path": "plan.md", "path": "src/"}}}\n'
    '{"name": "call_tool", "arguments": {"name": "list_dir", "arguments": {"path": "notes.txt",'
    ' "path": "plan.md", "path": "src/"}}}'
)


def _streamed_contents(path: Path) -> list[str]:
    """The concatenated ``content`` deltas of each response in a recording."""
    parts = re.split(r"^### (request|response)\n", path.read_text(encoding="utf-8"), flags=re.M)
    out = []
    for kind, body in zip(parts[1::2], parts[2::2], strict=True):
        if kind != "response":
            continue
        text = ""
        for line in body.splitlines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:]).get("choices", []):
                    text += choice.get("delta", {}).get("content") or ""
        out.append(text)
    return out


def _fixture(name: str) -> Path:
    if (FIXTURES / name).is_file():
        return FIXTURES / name
    pytest.skip(f"recording {name} not available in this checkout")


def test_recorded_content_matches_the_fixtures() -> None:
    assert _streamed_contents(_fixture("length.http")) == [LENGTH_HTTP]
    session = _streamed_contents(_fixture("tool_session.http"))
    assert session[2].startswith(REPEATED)


def test_the_truncated_call_from_length_http_is_not_a_call() -> None:
    assert parse_bare_tool_call(LENGTH_HTTP, KNOWN) is None


def test_the_repeated_calls_from_tool_session_http_are_not_a_call() -> None:
    assert parse_bare_tool_call(REPEATED, KNOWN) is None


def test_the_embedded_models_usual_answer_is_a_call() -> None:
    # What the embedded model answered (temperature 0) to loopd's system prompt and the
    # `make run` question, with find_tool and call_tool offered: a call plus an echo of a
    # description.
    content = (
        '{"name": "find_tool", "arguments": {"query": "list files in workspace"}, '
        '"description": "Find files in the workspace and return their names, descriptions '
        'and argument schemas."}'
    )
    assert parse_bare_tool_call(content, KNOWN) == (
        "find_tool",
        '{"query": "list files in workspace"}',
    )


def test_one_recorded_line_is_a_call() -> None:
    call = parse_bare_tool_call(FIRST_LINE, KNOWN)
    assert call is not None
    assert call[0] == "find_tool"
    assert json.loads(call[1]) == {
        "query": "list files in notes.txt and plan.md in src/",
        "required": ["query"],
    }


@pytest.mark.parametrize(
    "content",
    [
        '{"name": "read_file", "arguments": {"path": "notes.txt"}}',
        '{"name": "read_file", "parameters": {"path": "notes.txt"}}',
        '{"name": "read_file", "arguments": "{\\"path\\": \\"notes.txt\\"}"}',
        '  \n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n\n',
        '```json\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n```',
        '```\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n```\n',
        '```JSON\n\n{"name": "read_file", "arguments": {"path": "notes.txt"}}\n\n```',
    ],
)
def test_shapes_small_models_write(content: str) -> None:
    assert parse_bare_tool_call(content, KNOWN) == ("read_file", '{"path": "notes.txt"}')


def test_call_tool_wrapping_another_tool() -> None:
    content = (
        '{"name": "call_tool", "arguments": {"name": "list_dir", '
        '"arguments": "{\\"path\\": \\".\\"}"}}'
    )
    call = parse_bare_tool_call(content, KNOWN)
    assert call is not None
    assert call[0] == "call_tool"
    assert json.loads(call[1]) == {"name": "list_dir", "arguments": {"path": "."}}


def test_a_found_tool_called_by_its_own_name_goes_through_call_tool() -> None:
    content = '```json\n{"name": "list_dir", "arguments": {"path": "/workspace"}}\n```'
    call = parse_bare_tool_call(content, (*KNOWN, "list_dir"))  # as the real model wrote it
    assert call == ("list_dir", '{"path": "/workspace"}')
    name, arguments = via_call_tool(*call)
    assert name == "call_tool"
    assert json.loads(arguments) == {"name": "list_dir", "arguments": {"path": "/workspace"}}
    assert parse_bare_tool_call(json.dumps({"name": name, "arguments": arguments}), KNOWN) == (
        name,
        arguments,
    )


@pytest.mark.parametrize(
    "content",
    [
        None,
        "",
        "   ",
        "Sure! Here it is.",
        '{"name": "delete_everything", "arguments": {}}',  # not a known tool
        '{"name": "read_file"}',  # no arguments
        '{"name": "read_file", "arguments": ["notes.txt"]}',  # arguments not an object
        '{"name": "read_file", "arguments": "notes.txt"}',  # a string that is not JSON
        '{"name": "read_file", "arguments": {}, "parameters": {}}',  # both
        '{"name": 3, "arguments": {}}',
        '{"name": "read_file", "arguments": {"n": NaN}}',  # not JSON
        '[{"name": "read_file", "arguments": {}}]',  # a list of calls
        'I will call {"name": "read_file", "arguments": {"path": "a"}} now.',  # prose
        '{"name": "read_file", "arguments": {"path": "a"}} is what I would call.',
        '```python\n{"name": "read_file", "arguments": {}}\n```',  # not a JSON fence
        '```json\n{"name": "read_file", "arguments": {}}\n```\n```json\n{}\n```',
        '{"name": "call_tool", "arguments": {"name": "list_dir"}}',  # no inner arguments
        '{"name": "call_tool", "arguments": {"name": "x", "arguments": 3}}',
        '{"name": "call_tool", "arguments": {"tool": "x", "arguments": {}}}',
    ],
)
def test_not_a_call(content: str | None) -> None:
    assert parse_bare_tool_call(content, KNOWN) is None


# --- properties -------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=20)
json_values = st.recursive(
    json_scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
words = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters="{}`"), min_size=1, max_size=40
).filter(lambda s: s.strip() != "")


@st.composite
def written_calls(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    """A call as a small model might write it: (name, arguments, content)."""
    name = draw(st.sampled_from([n for n in KNOWN if n != "call_tool"]))
    arguments = draw(json_objects)
    key = draw(st.sampled_from(["arguments", "parameters"]))
    value: Any = json.dumps(arguments) if draw(st.booleans()) else arguments
    text = json.dumps({"name": name, key: value}, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):
        text = f"```{draw(st.sampled_from(['', 'json']))}\n{text}\n```"
    space = st.text(alphabet=" \t\n", max_size=3)
    return name, arguments, draw(space) + text + draw(space)


@given(written_calls())
def test_valid_calls_round_trip(case: tuple[str, dict[str, Any], str]) -> None:
    name, arguments, content = case
    call = parse_bare_tool_call(content, KNOWN)
    assert call is not None, content
    assert call[0] == name
    assert json.loads(call[1]) == arguments


@given(words)
def test_prose_is_never_a_call(prose: str) -> None:
    assert parse_bare_tool_call(prose, KNOWN) is None


@given(words, written_calls(), words)
def test_a_call_inside_prose_is_not_a_call(
    before: str, case: tuple[str, dict[str, Any], str], after: str
) -> None:
    _, _, content = case
    assert parse_bare_tool_call(f"{before} {content}", KNOWN) is None
    assert parse_bare_tool_call(f"{content} {after}", KNOWN) is None


@given(written_calls())
def test_unknown_tools_are_not_calls(case: tuple[str, dict[str, Any], str]) -> None:
    _, _, content = case
    assert parse_bare_tool_call(content, ()) is None
