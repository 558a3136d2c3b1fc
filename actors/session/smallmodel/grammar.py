"""A GBNF grammar for llama-server's ``grammar`` field: one tool call, or plain text.

A small model left free writes tool calls as bare JSON with made-up keys, repeats the
same call until ``max_tokens``, or answers a question with a call written as text. Under
``inference.constrained_calls`` each request carries :func:`build_grammar`'s grammar, and the server
samples only what it allows: either

- the word ``TOOL``, then exactly one call ``{"name": "<tool>", "arguments": {...}}`` of a
  tool that can be called, with arguments that follow that tool's schema (property names,
  types, enums, required keys), and nothing after it; or
- the word ``ANSWER``, then plain text that does not start with ``{``, ``[``, ``<``, a
  backquote or white space (so it cannot be the start of a call in another form).

The word makes the model decide first (:mod:`actors.session.smallmodel.decision_word`,
which also takes it off again); the first answer to a question that names a file may only be a call
(``text=False``). The call arrives as the answer's content, where the bare-JSON path
(:mod:`actors.session.smallmodel.bare_json`) takes it as the call. ``call_tool``'s arguments
are one
of the registry's tools with *that* tool's schema, so a call through it is well formed too;
a registry tool may also be called by its own name (the bare-JSON path routes it through
``call_tool``). A ``pattern`` is held only when it is one negated class (``^[^...]*$``,
:meth:`_Rules.string`); other patterns and keywords outside the subset below (``minLength``,
``$ref``, ...) are not enforced here; the registry's schema check still answers a bad call
with what was wrong.

llama-server refuses ``grammar`` together with tools unless ``tool_choice`` is ``"none"``
(docs/llama-server.md#tools-and-grammars): the request keeps its ``tools`` (the chat
template still shows them in the prompt, so the prompt and its cache are the same as
without the grammar) and sets ``tool_choice: "none"``, which only turns off the server's
own tool-call parsing.

After ``inference.constrained_tool_steps`` responses of a turn that called tools, the turn
asks for plain text only (``calls=False``: ``ANSWER`` and text): after a tool's result the
embedded model starts a call again about 9 times in 10 (first-token probabilities), and
left free it repeats the same call until the repeat limit ends the turn with no answer.

The grammar depends only on the tools given, in their order, so the same tools give the
same grammar, byte for byte. A tool's schema comes from a tool host or an MCP server, so it
is not trusted: building is linear in the schema (:class:`_Rules`), a tool's argument rules
are capped (:data:`TOOL_CAP`, and :data:`TOTAL_CAP` for all tools; past a cap, or for a
schema that cannot be read, that tool's arguments are plain JSON, said once in the log),
building never raises, and :func:`cached_grammar` builds it once per set of tools, not per
request (the turn's thread, where a cancel does not reach, never builds for long).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import re
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.session.smallmodel.decision_word import ANSWER, ANSWER_VALUE, TOOL

__all__ = ["REQUIRED", "TOOL_CAP", "TOTAL_CAP", "Built", "Values", "build_grammar",
           "cached_grammar"]

# Generic JSON, for schemas (or parts of them) the subset does not cover. White space is
# bounded so that a constrained model cannot loop on it.
_COMMON = r"""
ws ::= [ ]?
string ::= "\"" char* "\""
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
integer ::= "-"? natural
natural ::= "0" | [1-9] [0-9]{0,17}
number ::= "-"? natural ("." [0-9]{1,17})? ([eE] [-+]? [0-9]{1,4})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws ( string ":" ws value ( "," ws string ":" ws value )* )? "}"
array ::= "[" ws ( value ( "," ws value )* )? "]"
text ::= [^{\[<` \t\r\n] [^\x00]*
"""

# A JSON Schema pattern the grammar can hold a string to: one negated character class,
# anchored, its escapes written as GBNF writes them (\xNN, \n, \t, \\).
_NEGATED = re.compile(r"\^\[\^((?:[^\]\\]|\\x[0-9a-fA-F]{2}|\\[ntr\\\]])+)\]\*\$")

# (tool, argument, allowed values): a string argument held to one of the values; an
# argument named with a trailing "!" ("path!") is also required, optional in the schema or not
Values = tuple[tuple[str, str, tuple[str, ...]], ...]
REQUIRED = "!"

_RESERVED = frozenset(
    {"root", "call", *(line.split(" ::= ")[0] for line in _COMMON.strip().splitlines())}
)


# What one tool's argument rules may take (characters of rule text, schema nodes read, depth
# of nesting), and the whole grammar: past a cap the tool's arguments are plain JSON.
TOOL_CAP = 64 * 1024
TOTAL_CAP = 512 * 1024
_NODES = 4096
_DEPTH = 32
_KINDS = ("string", "integer", "number", "boolean", "null", "array", "object")

log = logging.getLogger("loopd.grammar")


class _TooBig(Exception):
    """A tool's schema needs more grammar than :data:`TOOL_CAP` (or is nested too deeply)."""


class _Rules:
    """Named rules, each written once; names derive from the tool and the property path.

    Building is linear in the schema: each schema node is read once (memoized by identity,
    so a shared subschema or a ``type`` list does not multiply the work), an object's
    optional members are chained rule by rule (never every later member after each), and a
    rule's name takes the next free number of its base name at once. ``budget`` counts the
    rule text of the tool being built; past it, or past :data:`_NODES` nodes or
    :data:`_DEPTH` levels, :class:`_TooBig` ends that tool's build.
    """

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self._next: dict[str, int] = {}
        self._memo: dict[tuple[int, str], str] = {}
        self._keep: list[Any] = []  # what the memo's ids name stays alive while it is used
        self.size = 0
        self.fixed: Mapping[str, tuple[str, ...]] = {}  # the tool's arguments held to values
        self.must: frozenset[str] = frozenset()  # and those of them it must give
        self.budget = sys.maxsize  # capped while a tool's arguments are built
        self.nodes = 0
        self._over = ""

    def start_tool(self) -> None:
        """Begin a tool: its own budget (what is left of the total, at most its cap)."""
        self.budget, self.nodes = min(TOOL_CAP, TOTAL_CAP - self.size), 0
        self._over = (f"its grammar would be over {TOOL_CAP // 1024} KiB"
                      if self.budget == TOOL_CAP else
                      f"the tools' grammar would be over {TOTAL_CAP // 1024} KiB")
        self._memo.clear()
        self._keep.clear()

    def end_tool(self) -> None:
        """The tool's arguments are built: the rules that follow (its call) are not capped."""
        self.budget = sys.maxsize
        self.fixed, self.must = {}, frozenset()
        self._memo.clear()
        self._keep.clear()

    def add(self, name: str, body: str) -> str:
        base = _name(name)
        key = base
        if key in _RESERVED or (key in self.rules and self.rules[key] != body):
            n = self._next.get(base, 1)
            while True:
                n += 1
                key = f"{base}-{n}"
                if key not in self.rules or self.rules[key] == body:
                    break
            self._next[base] = n
        if key not in self.rules:
            self.size += len(key) + len(body) + 5
            self.budget -= len(key) + len(body) + 5
            if self.budget < 0:
                raise _TooBig(self._over)
        self.rules[key] = body
        return key

    def value(self, schema: Any, name: str, depth: int = 0, kind: str = "") -> str:
        """A rule name (or a literal alternative) for values of ``schema`` (``kind``: one
        type of its ``type`` list)."""
        if not isinstance(schema, Mapping):
            return "value"
        memo = (id(schema), kind)
        if memo in self._memo:
            return self._memo[memo]
        self.nodes += 1
        if self.nodes > _NODES:
            raise _TooBig(f"its schema has more than {_NODES} parts")
        if depth > _DEPTH:
            raise _TooBig(f"its schema nests more than {_DEPTH} levels deep")
        self._keep.append(schema)
        found = self._value(schema, name, depth, kind)
        self._memo[memo] = found
        return found

    def _value(self, schema: Mapping[str, Any], name: str, depth: int, kind: str) -> str:
        if not kind:
            if "const" in schema:
                return _literal(schema["const"])
            enum = schema.get("enum")
            if isinstance(enum, list) and enum:
                return self.add(name, " | ".join(dict.fromkeys(_literal(v) for v in enum)))
            for key in ("anyOf", "oneOf"):
                options = schema.get(key)
                if isinstance(options, list) and options:
                    parts = [self.value(o, f"{name}-{i}", depth + 1)
                             for i, o in enumerate(options)]
                    return self.add(name, " | ".join(dict.fromkeys(parts)))
        found = kind or schema.get("type")
        if isinstance(found, list):
            kinds = [k for k in dict.fromkeys(found) if k in _KINDS]
            parts = [self.value(schema, f"{name}-{k}", depth, k) for k in kinds]
            return self.add(name, " | ".join(dict.fromkeys(parts))) if parts else "value"
        if found == "string":
            return self.string(schema, name)
        if found == "integer":
            minimum = schema.get("minimum")
            non_negative = isinstance(minimum, int | float) and minimum >= 0
            return "natural" if non_negative else "integer"
        if found in ("number", "boolean", "null"):
            return str(found)
        if found == "array":
            item = self.value(schema.get("items"), f"{name}-item", depth + 1)
            return self.add(name, f'"[" ws ( {item} ( "," ws {item} )* )? "]"')
        if found == "object" or "properties" in schema:
            return self.object(schema, name, depth)
        return "value"

    def string(self, schema: Mapping[str, Any], name: str) -> str:
        """A string; a ``pattern`` of one negated class (``^[^...]*$``) is held to it, and
        such a string has no escapes (the standard tools' paths: no control characters,
        no glob)."""
        pattern = schema.get("pattern")
        found = _NEGATED.fullmatch(pattern) if isinstance(pattern, str) else None
        if found is None:
            return "string"
        excluded = found.group(1)
        return self.add(name, f'"\\"" [^"\\\\\\x7F\\x00-\\x1F{excluded}]* "\\""')

    def object(self, schema: Mapping[str, Any], name: str, depth: int) -> str:
        """An object with the schema's properties: the required ones, then any optional.

        Without required members, the first optional one present has no comma before it:
        ``from-i`` is "member i, then any later ones" or ``from-(i+1)``, and ``tail-i`` adds
        member i or not, then ``tail-(i+1)``, so each member is written twice, not once
        per earlier member."""
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            return "object"
        listed = schema.get("required")
        required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
        fixed = self.fixed if depth == 0 else {}
        if depth == 0:
            required |= self.must & set(fixed)
        members = [
            (k in required, f'{_text(json.dumps(k) + ": ")} ' + (
                self._fixed(fixed[k], f"{name}-{k}") if fixed.get(k)
                else self.value(v, f"{name}-{k}", depth + 1)))
            for k, v in props.items()
            if isinstance(k, str) and (k in required or fixed.get(k, ()) != () or k not in fixed)
        ]
        needed = [m for r, m in members if r]
        optional = [m for r, m in members if not r]
        if needed:
            body = ' ", " '.join(needed) + "".join(f' ( ", " {m} )?' for m in optional)
        elif not optional:
            body = ""
        else:
            body = f"( {self._chain(name, optional)} )?"
        return self.add(name, f'"{{" {body} "}}"')

    def _fixed(self, values: tuple[str, ...], name: str) -> str:
        """A string argument that may only be one of ``values``."""
        return self.add(name, " | ".join(dict.fromkeys(_literal(v) for v in values)))

    def _chain(self, name: str, optional: list[str]) -> str:
        """Rules for "one or more of ``optional``, in order, comma-separated"; the first."""
        last = len(optional) - 1
        tail = ""  # the rule after the last member: nothing
        start = optional[last]
        for i in range(last, 0, -1):
            tail = self.add(f"{name}-tail-{i}", f'( ", " {optional[i]} )?' + (
                f" {tail}" if tail else ""))
            start = self.add(f"{name}-from-{i - 1}",
                             f"{optional[i - 1]} {tail} | {start}")
        return start

@dataclasses.dataclass(frozen=True, slots=True)
class Built:
    """A grammar, and the tools whose arguments it leaves as plain JSON (each with why)."""

    grammar: str
    plain: tuple[str, ...] = ()


def build_grammar(
    offered: Sequence[Mapping[str, Any]],
    registry: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    calls: bool = True,
    text: bool = True,
    exclude: frozenset[str] = frozenset(),
    values: Values = (),
    value: bool = False,
) -> Built:
    """The grammar for one answer (``grammar``): a call of an ``offered`` tool (request
    ``tools`` entries) or of a ``registry`` tool (``(name, parameters)``), or plain text;
    ``calls=False``: plain text only; ``text=False``: a call only; the tools named in
    ``exclude`` cannot be called (by their name nor through ``call_tool``); ``values``:
    ``(tool, argument, allowed)``, a string argument of a tool held to one of the allowed
    values (none: an optional argument left out; ``argument!``: one it must give). And
    which tools' arguments are plain JSON (``plain``: a schema past :data:`TOOL_CAP`, or
    past :data:`TOTAL_CAP` for all tools, or one it cannot read). In time and size linear
    in the schemas; never raises. ``value``: the text is a value (arithmetic), after
    :data:`~actors.session.smallmodel.decision_word.ANSWER_VALUE`."""
    if not calls:
        return Built(f"root ::= {_text(ANSWER_VALUE if value else ANSWER)} text" + _COMMON)
    rules = _Rules()
    plain: list[str] = []
    found: dict[str, str] = {}
    held: dict[str, dict[str, tuple[str, ...]]] = {}
    must: dict[str, frozenset[str]] = {}  # of them, those a call must give ("path!")
    for tool, argument, allowed in values:
        bare = argument.removesuffix(REQUIRED)
        held.setdefault(tool, {})[bare] = allowed
        if bare != argument:
            must[tool] = must.get(tool, frozenset()) | {bare}
    for tool, params in registry:
        if isinstance(tool, str) and tool not in found and tool not in exclude:
            found[tool] = _call(rules, tool, params, plain, held.get(tool, {}),
                                must.get(tool, frozenset()))
    alternatives: dict[str, str] = {}
    for entry in offered:
        function = entry.get("function", {}) if isinstance(entry, Mapping) else {}
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or name in alternatives or name in exclude:
            continue
        if name == "call_tool" and found:
            inner = rules.add("call-tool-arguments", " | ".join(found.values()))
            alternatives[name] = _call_rule(rules, name, inner)
        else:
            alternatives[name] = found.get(name) or _call(
                rules, name, function.get("parameters"), plain, held.get(name, {}),
                must.get(name, frozenset()))
    for name, rule in found.items():
        alternatives.setdefault(name, rule)
    answer = f" | {_text(ANSWER_VALUE if value else ANSWER)} text" if text else ""
    lines = [
        f"root ::= {_text(TOOL)} call{answer}",
        f"call ::= {' | '.join(alternatives.values()) or 'object'}",
    ]
    lines += [f"{k} ::= {v}" for k, v in rules.rules.items()]
    return Built("\n".join(lines) + _COMMON, tuple(plain))


def _call(rules: _Rules, name: str, params: Any, plain: list[str],
          fixed: Mapping[str, tuple[str, ...]], must: frozenset[str]) -> str:
    """The call rule of tool ``name``: its arguments as its schema says (those in ``fixed``
    held to their values, those of them in ``must`` required), or plain JSON (and a note in
    ``plain``) when that schema is past its cap or cannot be read."""
    schema = params if isinstance(params, Mapping) else {"type": "object"}
    rules.start_tool()
    rules.fixed, rules.must = fixed, must
    before = set(rules.rules)
    try:
        arguments = rules.object(schema, f"{name}-args", 0)
        rules.end_tool()
    except Exception as e:  # a hostile or odd schema: never the turn's end
        rules.end_tool()
        why = str(e) if isinstance(e, _TooBig) else f"its schema cannot be read ({e!r:.200})"
        for key in set(rules.rules) - before:
            rules.size -= len(key) + len(rules.rules.pop(key)) + 5
        arguments = "object"
        plain.append(f"{name}: {why}")
    return _call_rule(rules, name, arguments)


def _call_rule(rules: _Rules, name: str, arguments: str) -> str:
    head = _text('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return rules.add(f"call-{name}", f'{head} {arguments} "}}"')


# --- once per set of tools -------------------------------------------------------------------

_CACHE: collections.OrderedDict[tuple[Any, ...], tuple[Any, str]] = collections.OrderedDict()
_CACHED = 16
_LOCK = threading.Lock()
_SAID: set[str] = set()


def cached_grammar(
    offered: Sequence[Mapping[str, Any]],
    registry: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    calls: bool = True,
    text: bool = True,
    exclude: frozenset[str] = frozenset(),
    values: Values = (),
    value: bool = False,
) -> str:
    """:func:`build_grammar`'s grammar, built once per set of tools (the same ``offered`` object and
    the same schema objects, by identity: a session's baseline and its hosts' specs), not
    per request. A tool whose arguments are left as plain JSON is said once (logged)."""
    key = (id(offered), tuple((name, id(params)) for name, params in registry), calls, text,
           exclude, values, value)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[1]
    built = build_grammar(offered, registry, calls=calls, text=text, exclude=exclude,
                          values=values, value=value)
    with _LOCK:
        for note in built.plain:
            if note not in _SAID:
                _SAID.add(note)
                log.warning("constrained calls: plain JSON for the arguments of %s", note)
        # the entry keeps the objects its key names alive, so their ids are not reused
        _CACHE[key] = ((offered, [p for _, p in registry]), built.grammar)
        while len(_CACHE) > _CACHED:
            _CACHE.popitem(last=False)
    return built.grammar


def _literal(value: Any) -> str:
    """A GBNF string literal matching ``value`` written as JSON (json.dumps' spacing)."""
    return _text(json.dumps(value, ensure_ascii=False))


def _text(text: str) -> str:
    """A GBNF string literal matching ``text`` exactly."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    escaped = escaped.replace("\r", "\\r").replace("\t", "\\t")
    return f'"{escaped}"'


def _name(text: str) -> str:
    """A GBNF rule name: letters, digits and dashes."""
    out = "".join(c if c.isascii() and c.isalnum() else "-" for c in text)
    return out.strip("-").lower() or "rule"
