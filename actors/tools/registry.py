"""The tools of every connected host, and what a model's tool call turns into.

The baseline offers the model two meta-tools, :data:`META_TOOLS`, so the tool list (and the
prompt prefix the server caches) never changes when hosts come and go:

- ``find_tool(query)`` runs here: it ranks the tools by how well their name and description
  match the query's words and answers with names, descriptions and argument schemas;
- ``call_tool(name, arguments)`` runs the named tool on the host that offers it.

:func:`dispatch` turns a call the model made into :class:`Local` (text to give back now) or
:class:`Remote` (a call for a tool port). Nothing the model sends raises: an unknown tool,
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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.base.errors import UsageError
from actors.tools.port import ToolPort
from actors.tools.protocol.argcheck import ArgumentCheck
from actors.tools.protocol.spec import ToolSpec
from actors.tools.search import find
from actors.wire.fieldchecks import parse_json

__all__ = [
    "META_TOOLS",
    "QUALIFIER",
    "Local",
    "Registry",
    "Remote",
    "Renamed",
    "baseline_tools",
    "dispatch",
    "qualified",
]

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
QUALIFIER = "__"


@dataclasses.dataclass(frozen=True, slots=True)
class Local:
    """Text to give the model as the call's result, without running anything."""

    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class Remote:
    """A call to make on a tool port: the tool (as its host names it) and its checked arguments."""

    port: ToolPort
    tool: str
    arguments: Mapping[str, Any]


def qualified(host: str, tool: str) -> str:
    """The name a tool is offered under when an earlier host already offers its name.

    ``host__tool``: two underscores, because a model's function names allow only letters,
    digits, ``_`` and ``-`` (no dot), and pinned tools are offered as functions.
    """
    return f"{host}{QUALIFIER}{tool}"


@dataclasses.dataclass(frozen=True, slots=True)
class Renamed:
    """A tool offered under a qualified name because an earlier host has its name."""

    name: str  # what the model calls it
    host: str
    tool: str  # what its host calls it
    holder: str  # the host that keeps the bare name

    def notice(self) -> str:
        return (
            f"tool {self.tool} of host {self.host} is offered as {self.name}: host "
            f"{self.holder} also has a tool named {self.tool} and keeps that name"
        )


class Registry:
    """The tools of the given ports; the first port offering a name keeps it.

    A later host's tool of the same name is never hidden: it is offered as ``host__tool``
    (:func:`qualified`) and listed in :meth:`renamed`, so the person can be told. The
    standard hosts come first, so loopd's own tools keep the names pinned lists and system
    prompts use. The table is rebuilt only when a host announces a new tool list (each
    port's specs are one tuple per announcement, so comparing them by identity is enough).
    """

    def __init__(self, ports: Sequence[ToolPort]) -> None:
        self.ports = list(ports)
        self._checks: dict[tuple[str, int], tuple[Mapping[str, Any], ArgumentCheck | None]] = {}
        self._built_from: tuple[tuple[ToolSpec, ...], ...] | None = None
        self._table: dict[str, tuple[ToolSpec, ToolPort]] = {}
        self._host_names: dict[str, str] = {}  # qualified name -> its host's name for it
        self._renamed: tuple[Renamed, ...] = ()

    def entry(self, tool: str) -> tuple[ToolSpec, ToolPort] | None:
        """The spec of ``tool`` and the port of the host that offers it, or None.

        For a qualified name the spec carries that name; :meth:`host_name` gives the name
        to send to the host.
        """
        return self._current().get(tool)

    def host_name(self, tool: str) -> str:
        """The name the host offering ``tool`` knows it by (differs for a qualified name)."""
        self._current()
        return self._host_names.get(tool, tool)

    def renamed(self) -> tuple[Renamed, ...]:
        """The tools offered under a qualified name, because an earlier host has theirs."""
        self._current()
        return self._renamed

    def _current(self) -> dict[str, tuple[ToolSpec, ToolPort]]:
        announced = tuple(port.specs() for port in self.ports)
        if self._built_from is not None and all(
            a is b for a, b in zip(announced, self._built_from, strict=True)
        ):
            return self._table
        table: dict[str, tuple[ToolSpec, ToolPort]] = {}
        host_names: dict[str, str] = {}
        renamed: list[Renamed] = []
        for port, specs in zip(self.ports, announced, strict=True):
            for spec in specs:
                if spec.name in _META_NAMES:
                    continue
                holder = table.get(spec.name)
                if holder is None:
                    table[spec.name] = (spec, port)
                    continue
                name = qualified(port.name, spec.name)
                if holder[1].name == port.name or name in table:
                    continue  # a host listing a name twice: its first
                table[name] = (dataclasses.replace(spec, name=name), port)
                host_names[name] = spec.name
                renamed.append(Renamed(name, port.name, spec.name, holder[1].name))
        fresh = [r for r in renamed if r not in self._renamed]
        for r in fresh:
            log.warning("%s", r.notice())
        self._table, self._built_from = table, announced
        self._host_names, self._renamed = host_names, tuple(renamed)
        return table

    def specs(self) -> list[ToolSpec]:
        """Every tool of every connected host (one per name)."""
        return [spec for spec, _ in self._current().values()]

    def spec(self, tool: str) -> ToolSpec | None:
        entry = self.entry(tool)
        return entry[0] if entry else None

    def find(self, query: str, limit: int = 5) -> str:
        """The find_tool answer: the best matches for ``query``, with their schemas."""
        return find(self.specs(), query, limit)

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
        except UsageError:
            log.warning("tool %s has an invalid schema; its host checks its arguments", spec.name)
            check = None
        if len(self._checks) > 1000:
            self._checks.clear()
        self._checks[key] = (spec.parameters, check)
        return check


# --- dispatch -------------------------------------------------------------------------------------


def _parse_object(text: str | Mapping[str, Any], what: str) -> dict[str, Any] | str:
    """The JSON object in ``text``, or the text telling the model what was wrong."""
    if isinstance(text, Mapping):
        return dict(text)
    if not text.strip():
        return {}
    try:
        value = parse_json(text)
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


def _checked(registry: Registry, name: str, arguments: dict[str, Any]) -> Local | Remote:
    entry = registry.entry(name)
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
    return Remote(port, registry.host_name(name), arguments)


def dispatch(registry: Registry, name: str, arguments: str) -> Local | Remote:
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
