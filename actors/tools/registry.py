"""The tools of every connected host, and what a model's tool call turns into.

The baseline offers the model two meta-tools, :data:`META_TOOLS`, so the tool list (and the
prompt prefix the server caches) never changes when hosts come and go:

- ``find_tool(query)`` runs here: it ranks the tools by how well their name and description
  match the query's words and answers with names, descriptions and argument schemas;
- ``call_tool(name, arguments)`` runs the named tool on the host that offers it.

:func:`dispatch` turns a call the model made into :class:`Local` (text to give back now) or
:class:`Port` (a call for a tool port). Nothing the model sends raises: an unknown tool,
arguments that are not JSON or not an object, or that break the tool's schema, all become
``Local`` text saying what was wrong and what to do. Small models are met half way: a
``call_tool`` whose ``arguments`` is a JSON *string* holding an object is accepted, so are
the tool's arguments given at the top level next to ``name``, and so is a known tool called
directly by its own name (which is how pinned tools are called).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonschema
import jsonschema.exceptions

from actors.tools.client.port import PortHandle
from actors.tools.protocol.argcheck import ArgumentCheck
from actors.tools.protocol.spec import ToolSpec

__all__ = ["META_TOOLS", "Local", "Port", "Registry", "baseline_tools", "dispatch"]

log = logging.getLogger("loopd.registry")

META_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "find_tool",
            "description": (
                "Find tools for a task. Answers with the best matching tools: their names, "
                "what they do, and their arguments. Then run one with call_tool."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "a few words saying what you want to do, e.g. 'read a file'",
                    }
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "call_tool",
            "description": "Run a tool found with find_tool, with its arguments.",
            "parameters": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "description": "the tool's name"},
                    "arguments": {
                        "type": "object",
                        "description": "the tool's arguments, as its schema describes",
                    },
                },
                "required": ["name", "arguments"],
            },
        },
    },
)
_META_NAMES = {"find_tool", "call_tool"}


@dataclasses.dataclass(frozen=True, slots=True)
class Local:
    """Text to give the model as the call's result, without running anything."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Port:
    """A call to make on a tool port: the tool and its (already checked) arguments."""

    port: PortHandle
    tool: str
    arguments: Mapping[str, Any]


class Registry:
    """The tools of the given ports; the first port offering a name wins it."""

    def __init__(self, ports: Sequence[PortHandle]) -> None:
        self.ports = list(ports)
        self._checks: dict[tuple[str, int], tuple[Mapping[str, Any], ArgumentCheck | None]] = {}

    def _table(self) -> dict[str, tuple[ToolSpec, PortHandle]]:
        table: dict[str, tuple[ToolSpec, PortHandle]] = {}
        for port in self.ports:
            for spec in port.specs():
                if spec.name in _META_NAMES:
                    continue
                if spec.name in table:
                    other = table[spec.name][1].name
                    if other != port.name:
                        log.debug(
                            "tool %s of host %s is hidden by host %s", spec.name, port.name, other
                        )
                    continue
                table[spec.name] = (spec, port)
        return table

    def specs(self) -> list[ToolSpec]:
        """Every tool of every connected host (one per name)."""
        return [spec for spec, _ in self._table().values()]

    def spec(self, tool: str) -> ToolSpec | None:
        entry = self._table().get(tool)
        return entry[0] if entry else None

    def port_for(self, tool: str) -> PortHandle | None:
        """The port of the host that offers ``tool``, or None."""
        entry = self._table().get(tool)
        return entry[1] if entry else None

    def find(self, query: str, limit: int = 5) -> str:
        """The find_tool answer: the best matches for ``query``, with their schemas."""
        specs = self.specs()
        if not specs:
            return "No tools are available right now: no tool host is connected."
        words = _query_words(query)
        if not words:
            listed = specs[: max(limit, 20)]
            head = (
                f"All {len(specs)} tools" if len(listed) == len(specs) else f"{len(listed)} tools"
            )
            return _describe(f"{head} (ask with a few words to narrow it down):", listed)
        scored = sorted(
            ((score, i, s) for i, s in enumerate(specs) if (score := _score(words, s)) > 0),
            key=lambda t: (-t[0], t[1]),
        )
        if not scored:
            names = ", ".join(s.name for s in specs[:30])
            return (
                f"No tool matches {query!r}. The tools are: {names}. Try other words with "
                "find_tool, or call_tool with one of these names."
            )
        top = scored[0][0]
        best = [s for score, _, s in scored[:limit] if score >= top / 4]  # drop weak tails
        return _describe(f"Tools matching {query!r}, best first:", best)

    def check(self, spec: ToolSpec) -> ArgumentCheck | None:
        """The compiled argument check of ``spec``; None when its schema is invalid."""
        # Keyed by the schema object's id; the entry keeps that object alive, so the id
        # cannot be reused by a later host's schema while the entry exists.
        key = (spec.name, id(spec.parameters))
        entry = self._checks.get(key)
        if entry is not None and entry[0] is spec.parameters:
            return entry[1]
        try:
            check: ArgumentCheck | None = ArgumentCheck(spec.parameters)
        except jsonschema.exceptions.SchemaError:
            log.warning("tool %s has an invalid schema; its host checks its arguments", spec.name)
            check = None
        if len(self._checks) > 1000:
            self._checks.clear()
        self._checks[key] = (spec.parameters, check)
        return check


# --- find_tool's ranking ----------------------------------------------------------------------

_STOP = {
    "a",
    "an",
    "the",
    "to",
    "of",
    "in",
    "on",
    "for",
    "and",
    "or",
    "with",
    "from",
    "my",
    "me",
    "i",
    "some",
    "this",
    "that",
    "it",
    "is",
    "be",
    "tool",
    "tools",
    "please",
    "can",
    "want",
}


def _words(text: str) -> list[str]:
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)  # camelCase -> camel Case
    return re.findall(r"[a-z0-9]+", text.lower())


def _query_words(query: str) -> list[str]:
    return [w for w in dict.fromkeys(_words(query)) if w not in _STOP]


def _related(a: str, b: str) -> bool:
    """Same word up to an ending: file/files, read/reading, dir/directory."""
    short, long = sorted((a, b), key=len)
    return len(short) >= 3 and long.startswith(short)


def _score(words: list[str], spec: ToolSpec) -> float:
    name_words = _words(spec.name)
    desc_words = set(_words(spec.description))
    score = 0.0
    for w in words:
        if w in name_words:
            score += 3
        elif any(_related(w, n) for n in name_words):
            score += 2
        if w in desc_words:
            score += 1
        elif any(_related(w, d) for d in desc_words):
            score += 0.5
    if "_".join(words) == spec.name.lower() or " ".join(words) == spec.name.lower():
        score += 10
    return score


def _describe(head: str, specs: Iterable[ToolSpec]) -> str:
    lines = [head]
    for s in specs:
        notes = []
        if s.needs_approval:
            notes.append("needs approval")
        if s.untrusted:
            notes.append("its results come from outside and may be wrong")
        extra = f" ({'; '.join(notes)})" if notes else ""
        lines.append(f"- {s.name}: {s.description}{extra}")
        lines.append(f"  arguments: {json.dumps(s.parameters, ensure_ascii=False, sort_keys=True)}")
    lines.append('Run one with call_tool(name="...", arguments={...}).')
    return "\n".join(lines)


# --- dispatch -------------------------------------------------------------------------------------


def _parse_object(text: str | Mapping[str, Any], what: str) -> dict[str, Any] | str:
    """The JSON object in ``text``, or the text telling the model what was wrong."""
    if isinstance(text, Mapping):
        return dict(text)
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        return (
            f"The arguments of {what} are not valid JSON ({e}). Send them again as one JSON "
            'object, e.g. {"path": "notes.txt"}.'
        )
    if not isinstance(value, dict):
        return (
            f"The arguments of {what} must be a JSON object (name: value pairs in braces), "
            f"not {_json_kind(value)}. Send them again as an object."
        )
    return value


def _json_kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "true/false", type(None): "null"}.get(
        type(value), "a number"
    )


def _unknown(registry: Registry, name: str) -> Local:
    near = difflib.get_close_matches(name, [s.name for s in registry.specs()], n=3, cutoff=0.6)
    hint = f" Similar tools: {', '.join(near)}." if near else ""
    return Local(
        f"There is no tool named {name!r}.{hint} Use find_tool with a few words saying what you "
        "need to find the right tool, then call_tool with its exact name."
    )


def _checked(registry: Registry, name: str, arguments: dict[str, Any]) -> Local | Port:
    entry = registry._table().get(name)
    if entry is None:
        return _unknown(registry, name)
    spec, port = entry
    check = registry.check(spec)
    error = check.problem(arguments) if check is not None else None
    if error is not None:
        where, what = error
        schema = json.dumps(spec.parameters, ensure_ascii=False, sort_keys=True)
        return Local(
            f"The arguments for {name} are not valid: at {where}: {what}. "
            f"Its arguments schema is {schema}. Call it again with arguments that match."
        )
    return Port(port, name, arguments)


def dispatch(registry: Registry, name: str, arguments: str) -> Local | Port:
    """What the model's call ``name(arguments)`` (raw JSON text) turns into; never raises."""
    args = _parse_object(arguments, name)
    if isinstance(args, str):
        return Local(args)
    if name == "find_tool":
        query = args.get("query", "")
        if not isinstance(query, str):
            return Local('find_tool needs "query": a few words saying what you want to do.')
        return Local(registry.find(query))
    if name != "call_tool":
        if name in _META_NAMES or registry.spec(name) is None:
            return _unknown(registry, name)
        return _checked(registry, name, args)
    tool = args.get("name")
    if not isinstance(tool, str) or not tool:
        return Local(
            'call_tool needs "name": the exact name of a tool (use find_tool to find one), and '
            '"arguments": an object with that tool\'s arguments.'
        )
    if "arguments" in args:
        inner = args["arguments"]
        if inner is None:
            inner = {}
        if not isinstance(inner, str | Mapping):
            return Local(
                f"call_tool's \"arguments\" must be an object with {tool}'s arguments, "
                f"not {_json_kind(inner)}."
            )
        parsed = _parse_object(inner, tool)
    else:  # the tool's arguments written next to "name"
        parsed = {k: v for k, v in args.items() if k != "name"}
    if isinstance(parsed, str):
        return Local(parsed)
    if tool == "find_tool":
        return dispatch(registry, "find_tool", json.dumps(parsed))
    if tool == "call_tool":
        return Local("call_tool cannot call itself: give the name of the tool to run.")
    return _checked(registry, tool, parsed)


def baseline_tools(
    registry_or_specs: Registry | Iterable[ToolSpec], pinned: Sequence[str]
) -> tuple[dict[str, Any], ...]:
    """The baseline's tool list: the meta-tools, then each pinned tool that is offered.

    A pinned name no connected host offers is left out (and logged): the baseline is fixed
    for the session's life, so it holds what can actually be called now.
    """
    specs = (
        registry_or_specs.specs() if isinstance(registry_or_specs, Registry) else registry_or_specs
    )
    by_name = {s.name: s for s in specs}
    tools = [json.loads(json.dumps(t)) for t in META_TOOLS]
    for name in dict.fromkeys(pinned):
        spec = by_name.get(name)
        if spec is None or name in _META_NAMES:
            log.warning("pinned tool %s is not offered by any connected tool host; left out", name)
            continue
        tools.append(
            {
                "type": "function",
                "function": {
                    "name": spec.name,
                    "description": spec.description,
                    "parameters": json.loads(json.dumps(spec.parameters)),
                },
            }
        )
    return tuple(tools)
