"""build_grammar: one call of a tool that can be called (its schema's shape), or plain text.

These check the grammar's text: every rule referenced is defined, each tool's call and
argument shape is there, and the same tools give the same grammar. That llama-server
accepts it and its model then writes one call is checked on the real server
(tests/test_eval.py's smoke run and `make eval`).
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.session.smallmodel import grammar as grammar_module
from actors.session.smallmodel.grammar import (
    REQUIRED,
    TOOL_CAP,
    TOTAL_CAP,
    build_grammar,
    cached_grammar,
)
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.registry import META_TOOLS, baseline_tools
from tests.support.hostile_host import deep, deep_shared, wide

REGISTRY = [(s.name, s.parameters) for s in STANDARD_SPECS.values()]
_RULE = re.compile(r"^([a-z0-9-]+) ::= (.*)$")


def _rules(grammar: str) -> dict[str, str]:
    rules = {}
    for line in grammar.strip().splitlines():
        m = _RULE.match(line)
        assert m, f"not a rule: {line!r}"
        assert m.group(1) not in rules, f"{m.group(1)} defined twice"
        rules[m.group(1)] = m.group(2)
    return rules


def _references(body: str) -> set[str]:
    """Rule names used in a rule body (outside string literals and character classes)."""
    body = re.sub(r'"(?:[^"\\]|\\.)*"', " ", body)
    body = re.sub(r"\[(?:[^\]\\]|\\.)*\]", " ", body)
    body = re.sub(r"\{\d+(?:,\d*)?\}", " ", body)
    return set(re.findall(r"[a-z][a-z0-9-]*", body))


def _well_formed(grammar: str) -> dict[str, str]:
    rules = _rules(grammar)
    assert "root" in rules
    for name, body in rules.items():
        missing = _references(body) - set(rules)
        assert not missing, f"{name} uses undefined {missing}"
    return rules


def _call_head(name: str) -> str:
    return f'"{{\\"name\\": \\"{name}\\", \\"arguments\\": "'


def test_the_default_tools_give_a_well_formed_grammar_naming_each() -> None:
    grammar = build_grammar(META_TOOLS, REGISTRY).grammar
    rules = _well_formed(grammar)
    # a decision word first: the model chooses between a call and text before writing either
    assert rules["root"] == '"TOOL " call | "ANSWER " text'
    for name in ["find_tool", "call_tool", *STANDARD_SPECS]:
        assert _call_head(name) in grammar, name
    # call_tool's arguments are one of the registry's calls, each with its own schema
    inner = rules["call-tool-arguments"].split(" | ")
    assert inner == [f"call-{n.replace('_', '-')}" for n in STANDARD_SPECS]


def test_required_then_optional_arguments() -> None:
    rules = _well_formed(build_grammar(META_TOOLS, REGISTRY).grammar)
    assert rules["read-file-args"] == (
        '"{" "\\"path\\": " read-file-args-path ( ", " "\\"offset\\": " natural )? '
        '( ", " "\\"start_line\\": " natural )? ( ", " "\\"end_line\\": " natural )? "}"'
    )
    # list_dir has no required argument: {} or {"path": ...}
    assert rules["list-dir-args"] == '"{" ( "\\"path\\": " list-dir-args-path )? "}"'
    assert rules["write-file-args"] == (
        '"{" "\\"path\\": " write-file-args-path ", " "\\"content\\": " string "}"'
    )


def test_enums_nested_objects_arrays_and_unions() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "mode": {"enum": ["fast", "slow"]},
            "opts": {"type": "object", "properties": {"n": {"type": "integer"}},
                     "required": ["n"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "x": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "y": {"type": ["string", "boolean"]},
            "z": {"const": 3},
        },
        "required": ["mode"],
    }
    rules = _well_formed(build_grammar([], [("t", schema)]).grammar)
    assert rules["t-args-mode"] == '"\\"fast\\"" | "\\"slow\\""'
    assert rules["t-args-opts"] == '"{" "\\"n\\": " integer "}"'
    assert rules["t-args-tags"] == '"[" ws ( string ( "," ws string )* )? "]"'
    assert rules["t-args-x"] == "number | null"
    assert rules["t-args-y"] == "string | boolean"
    assert '"\\"z\\": " "3"' in rules["t-args"]


def test_pinned_tools_offered_directly_and_unknown_schemas_fall_back_to_json() -> None:
    offered = baseline_tools(list(STANDARD_SPECS.values()), ["read_file"])
    rules = _well_formed(build_grammar(offered, [("odd", {"type": "object"})]).grammar)
    assert "call-read-file" in rules["call"].split(" | ")
    assert rules["call-odd"].endswith(" object \"}\"")


def test_plain_text_cannot_start_like_a_call() -> None:
    rules = _rules(build_grammar(META_TOOLS, REGISTRY).grammar)
    first = re.match(r"\[\^([^\]]*)\]", rules["text"])
    assert first is not None
    for c in ("{", "\\[", "<", "`", " ", "\\n"):
        assert c in first.group(1), c


names = st.text(alphabet="abcdefghij_-.", min_size=1, max_size=8)


@given(st.lists(names, min_size=1, max_size=6, unique=True))
def test_the_same_tools_give_the_same_grammar(tools: list[str]) -> None:
    registry = [(n, {"type": "object", "properties": {"a": {"type": "string"}},
                     "required": ["a"]}) for n in tools]
    grammar = build_grammar(META_TOOLS, registry).grammar
    assert grammar == build_grammar(META_TOOLS, list(registry)).grammar
    _well_formed(grammar)
    for n in tools:
        assert _call_head(n) in grammar


def test_text_only_when_calls_are_not_allowed() -> None:
    rules = _well_formed(build_grammar(META_TOOLS, REGISTRY, calls=False).grammar)
    assert rules["root"] == '"ANSWER " text'
    assert not any(name.startswith("call") for name in rules)


def _string_rule(grammar: str, rule: str) -> re.Pattern[str]:
    """A string rule of one character class, as a Python regex of the whole JSON string."""
    body = _rules(grammar)[rule]
    found = re.fullmatch(r'"\\"" (\[\^.*\])\* "\\""', body)
    assert found, body
    return re.compile('"' + found.group(1) + '*"')


def test_a_path_cannot_hold_a_glob_or_a_control_character() -> None:
    grammar = build_grammar([], REGISTRY).grammar
    for rule in ("read-file-args-path", "list-dir-args-path", "search-files-args-path",
                 "write-file-args-path"):
        path = _string_rule(grammar, rule)
        for good in ("notes.txt", "recipes/soup.md", ".", "", "a b.txt"):
            assert path.fullmatch(f'"{good}"'), (rule, good)
        for bad in ("./*", "notes?.txt", ".\n", "a\tb", "x\x7f", 'a"b', "a\\\\b"):
            assert not path.fullmatch(f'"{bad}"'), (rule, bad)
    # other strings keep the generic JSON string (escapes allowed: a file's content)
    assert '"\\"content\\": " string' in _rules(grammar)["write-file-args"]


def test_only_a_pattern_of_one_negated_class_is_held() -> None:
    def rule_for(pattern: str) -> str:
        schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": pattern}}}
        return _rules(build_grammar([], [("t", schema)]).grammar)["t-args"]

    assert "t-args-p" in rule_for("^[^x]*$")
    for other in ("^[a-z]*$", "^[^x]+$", "[^x]*", "^a.*$", "^[^x]*$|y"):
        assert rule_for(other).endswith('" string )? "}"'), other


def test_a_call_only_when_text_is_not_allowed() -> None:
    rules = _well_formed(build_grammar(META_TOOLS, REGISTRY, text=False).grammar)
    assert rules["root"] == '"TOOL " call'
    assert "text" not in _references(rules["root"])



# --- schemas that attack the builder ---------------------------------------------


def _optional_members(n: int) -> dict[str, str]:
    schema = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
    return _well_formed(build_grammar([], [("t", schema)]).grammar)


def test_optional_members_are_chained_in_linear_size() -> None:
    """N optional properties: the grammar grew with N squared (every later member after each
    earlier one: 61 MB per request at 2,000). Now each member is written twice."""
    sizes = {n: sum(len(k) + len(v) for k, v in _optional_members(n).items())
             for n in (10, 100, 1000)}
    assert sizes[1000] < 12 * sizes[100] < 144 * sizes[10]  # linear, not 100x per 10x
    rules = _optional_members(3)
    assert rules["t-args"] == '"{" ( t-args-from-0 )? "}"'
    assert rules["t-args-from-0"] == '"\\"p0\\": " integer t-args-tail-1 | t-args-from-1'
    assert rules["t-args-tail-1"] == '( ", " "\\"p1\\": " integer )? t-args-tail-2'
    assert rules["t-args-tail-2"] == '( ", " "\\"p2\\": " integer )?'
    assert rules["t-args-from-1"] == '"\\"p1\\": " integer t-args-tail-2 | "\\"p2\\": " integer'


def test_a_schema_past_the_cap_leaves_that_tool_plain_json_and_says_so() -> None:
    built = build_grammar(META_TOOLS, [("wide", wide(2000)), *REGISTRY])
    rules = _well_formed(built.grammar)
    assert rules["call-wide"].endswith(' object "}"')  # plain JSON arguments
    assert built.plain == (f"wide: its grammar would be over {TOOL_CAP // 1024} KiB",)
    assert not any(k.startswith("wide-args") for k in rules)  # nothing half-built is left
    assert rules["read-file-args"].startswith('"{" "\\"path\\": "')  # the others as before
    assert len(built.grammar) < TOTAL_CAP + 8192


def test_many_tools_share_one_total_cap() -> None:
    many = [(f"t{i}", wide(300)) for i in range(60)]
    built = build_grammar([], many)
    _well_formed(built.grammar)
    assert len(built.grammar) < TOTAL_CAP + 8192
    assert built.plain and all("over 512 KiB" in note for note in built.plain)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nested", [deep, deep_shared])
def test_a_deeply_nested_type_list_takes_linear_time(nested: Callable[[int], Any]) -> None:
    """A type list naming a kind twice, or two kinds whose sub-schemas are one object: each
    level was built twice, 2^28 builds at 28 levels (the old builder never ends here; its
    18 took seconds). Built once each now, and past 32 levels the arguments are plain JSON."""
    rules = _well_formed(build_grammar([], [("deep", nested(28))]).grammar)
    assert not rules["call-deep"].endswith(' object "}"')  # held to its shape
    assert len(rules) < 28 * 8
    built = build_grammar([], [("deeper", nested(200))])
    assert built.plain == ("deeper: its schema nests more than 32 levels deep",)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": 5},
    {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", 5, None]},
    {"type": "object", "properties": {5: {"type": "string"}, "b": True}},
    {"type": "object", "properties": {"e": {"enum": [b"bytes", {1, 2}]}}},
    {"type": "object", "properties": {"c": {"const": object()}}},
    {"type": "object", "properties": {"p": {"type": "string", "pattern": 5}}},
    {"type": ["object", 7, None], "properties": []},
    "not a schema", None, 5,
])
def test_an_odd_schema_never_raises(schema: Any) -> None:
    built = build_grammar(META_TOOLS, [("odd", schema), *REGISTRY])
    _well_formed(built.grammar)
    assert _call_head("odd") in built.grammar


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "properties", "required", "items", "enum", "const", "anyOf",
                         "oneOf", "pattern", "minimum", "a", "b"]), inner, max_size=5),
    max_leaves=40,
)


@given(_json)
def test_any_schema_gives_a_well_formed_grammar(schema: Any) -> None:
    built = build_grammar([], [("t", schema)])
    _well_formed(built.grammar)


def test_the_grammar_is_built_once_per_set_of_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    real = grammar_module.build_grammar

    def counting(*args: Any, **kwargs: Any) -> Any:
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(grammar_module, "build_grammar", counting)
    # an empty cache: another test of this process may have built these tools' grammar
    monkeypatch.setattr(grammar_module, "_CACHE", collections.OrderedDict())
    offered = tuple(META_TOOLS)
    specs = [(n, p) for n, p in REGISTRY]
    first = cached_grammar(offered, specs)
    for _ in range(5):  # every request of a session: the same objects
        assert cached_grammar(offered, list(specs)) == first
    assert len(builds) == 1
    cached_grammar(offered, specs, text=False)  # another shape of answer: its own
    changed = [*specs[:-1], (specs[-1][0], dict(specs[-1][1]))]  # a host came back
    cached_grammar(offered, changed)
    assert len(builds) == 3


def test_excluded_tools_cannot_be_called_by_name_nor_through_call_tool() -> None:
    """A later step of a turn does not call again a tool the turn has called already."""
    rules = _well_formed(build_grammar(META_TOOLS, REGISTRY,
                                       exclude=frozenset({"search_files"})).grammar)
    grammar = "\n".join(f"{k} ::= {v}" for k, v in rules.items())
    assert _call_head("search_files") not in grammar
    assert "call-search-files" not in rules["call-tool-arguments"].split(" | ")
    assert _call_head("read_file") in grammar and rules["root"] == '"TOOL " call | "ANSWER " text'
    assert build_grammar(META_TOOLS, REGISTRY).grammar != build_grammar(
        META_TOOLS, REGISTRY, exclude=frozenset({"read_file"})).grammar


def test_held_values_hold_a_string_argument_and_none_leave_an_optional_one_out() -> None:
    """A step loopd holds: read_file's path one of the files that are there, no offset;
    search_files' pattern one of the question's words; the rest as the schemas say."""
    held = (("read_file", "path", ("a.txt", 'b "c".md')), ("read_file", "offset", ()),
            ("read_file", "start_line", ()), ("read_file", "end_line", ()),
            ("search_files", "pattern", ("Omar",)))
    rules = _well_formed(build_grammar(META_TOOLS, REGISTRY, values=held).grammar)
    assert rules["read-file-args-path"] == '"\\"a.txt\\"" | "\\"b \\\\\\"c\\\\\\".md\\""'
    assert rules["read-file-args"] == '"{" "\\"path\\": " read-file-args-path "}"'
    assert rules["search-files-args-pattern"] == '"\\"Omar\\""'
    free = _well_formed(build_grammar(META_TOOLS, REGISTRY).grammar)
    assert "offset" in free["read-file-args"] and "search-files-args-pattern" not in free


def test_a_held_argument_marked_required_must_be_given() -> None:
    """search_files' path held to the manifest: optional, the embedded model left it out
    and searched every file; marked with REQUIRED, the call must give it."""
    optional = _well_formed(build_grammar(META_TOOLS, REGISTRY, values=(
        ("search_files", "path", ("PKG-INFO",)),)).grammar)
    assert optional["search-files-args"].endswith(" search-files-args-path )? \"}\"")
    must = _well_formed(build_grammar(META_TOOLS, REGISTRY, values=(
        ("search_files", "path" + REQUIRED, ("PKG-INFO",)),)).grammar)
    assert must["search-files-args-path"] == '"\\"PKG-INFO\\""'
    assert must["search-files-args"] == (
        '"{" "\\"pattern\\": " string ", " "\\"path\\": " search-files-args-path "}"')
