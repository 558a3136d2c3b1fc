"""A GBNF grammar for llama-server's ``grammar`` field: one tool call, or plain text.

A small model left free writes tool calls as bare JSON with made-up keys, repeats the
same call until ``max_tokens``, or answers a question with a call written as text. Under
``inference.constrained_calls`` each request carries :func:`answer_grammar`, and the server
samples only what it allows: either

- the word ``TOOL``, then exactly one call ``{"name": "<tool>", "arguments": {...}}`` of a
  tool that can be called, with arguments that follow that tool's schema (property names,
  types, enums, required keys), and nothing after it; or
- the word ``ANSWER``, then plain text that does not start with ``{``, ``[``, ``<``, a
  backquote or white space (so it cannot be the start of a call in another form).

The word makes the model decide first (:mod:`actors.inference.smallmodel.decision`, which also takes
it off again); the first answer to a question that names a file may only be a call
(``text=False``). The call arrives as the answer's content, where the bare-JSON path
(:mod:`actors.inference.smallmodel.bare_json`) takes it as the call. ``call_tool``'s arguments
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
same grammar, byte for byte.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from actors.inference.smallmodel.decision import ANSWER, TOOL

__all__ = ["answer_grammar"]

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

_RESERVED = frozenset(
    {"root", "call", *(line.split(" ::= ")[0] for line in _COMMON.strip().splitlines())}
)


class _Rules:
    """Named rules, each written once; names derive from the tool and the property path."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}

    def add(self, name: str, body: str) -> str:
        key = _name(name)
        base, n = key, 1
        while key in _RESERVED or (key in self.rules and self.rules[key] != body):
            n += 1
            key = f"{base}-{n}"
        self.rules[key] = body
        return key

    def value(self, schema: Any, name: str) -> str:
        """A rule name (or a literal alternative) for values of ``schema``."""
        if not isinstance(schema, Mapping):
            return "value"
        if "const" in schema:
            return _literal(schema["const"])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return self.add(name, " | ".join(_literal(v) for v in schema["enum"]))
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                parts = [self.value(o, f"{name}-{i}") for i, o in enumerate(options)]
                return self.add(name, " | ".join(parts))
        kind = schema.get("type")
        if isinstance(kind, list):
            parts = [self.value({**schema, "type": k}, f"{name}-{k}") for k in kind]
            return self.add(name, " | ".join(parts)) if parts else "value"
        if kind == "string":
            return self.string(schema, name)
        if kind == "integer":
            minimum = schema.get("minimum")
            non_negative = isinstance(minimum, int | float) and minimum >= 0
            return "natural" if non_negative else "integer"
        if kind == "number":
            return "number"
        if kind == "boolean":
            return "boolean"
        if kind == "null":
            return "null"
        if kind == "array":
            item = self.value(schema.get("items"), f"{name}-item")
            return self.add(name, f'"[" ws ( {item} ( "," ws {item} )* )? "]"')
        if kind == "object" or "properties" in schema:
            return self.object(schema, name)
        return "value"

    def string(self, schema: Mapping[str, Any], name: str) -> str:
        """A string; a ``pattern`` of one negated class (``^[^...]*$``) is held to it, and
        such a string has no escapes (the standard tools' paths: no control characters,
        no glob)."""
        found = _NEGATED.fullmatch(str(schema.get("pattern", "")))
        if found is None:
            return "string"
        excluded = found.group(1)
        return self.add(name, f'"\\"" [^"\\\\\\x7F\\x00-\\x1F{excluded}]* "\\""')

    def object(self, schema: Mapping[str, Any], name: str) -> str:
        """An object with the schema's properties: the required ones, then any optional."""
        props = schema.get("properties")
        if not isinstance(props, Mapping) or not props:
            return "object"
        required = set(schema.get("required") or ())
        members = [
            (k in required, f'{_text(json.dumps(k) + ": ")} {self.value(v, f"{name}-{k}")}')
            for k, v in props.items()
        ]
        needed = [m for r, m in members if r]
        optional = [m for r, m in members if not r]
        if needed:
            body = ' ", " '.join(needed) + "".join(f' ( ", " {m} )?' for m in optional)
        else:  # the first optional member present has no comma before it
            starts = [
                m + "".join(f' ( ", " {o} )?' for o in optional[i + 1 :])
                for i, m in enumerate(optional)
            ]
            body = "( " + " | ".join(f"( {s} )" for s in starts) + " )?"
        return self.add(name, f'"{{" {body} "}}"')


def answer_grammar(
    offered: Sequence[Mapping[str, Any]],
    registry: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    calls: bool = True,
    text: bool = True,
) -> str:
    """The grammar for one answer: a call of an ``offered`` tool (request ``tools`` entries)
    or of a ``registry`` tool (``(name, parameters)``), or plain text; ``calls=False``:
    plain text only; ``text=False``: a call only."""
    if not calls:
        return f"root ::= {_text(ANSWER)} text" + _COMMON
    rules = _Rules()
    found = {name: _call(rules, name, params) for name, params in registry}
    alternatives: dict[str, str] = {}
    for entry in offered:
        function = entry.get("function", {})
        name = function.get("name")
        if not isinstance(name, str) or name in alternatives:
            continue
        if name == "call_tool" and found:
            inner = rules.add("call-tool-arguments", " | ".join(found.values()))
            alternatives[name] = _call_rule(rules, name, inner)
        else:
            alternatives[name] = found.get(name) or _call(rules, name, function.get("parameters"))
    for name, rule in found.items():
        alternatives.setdefault(name, rule)
    answer = f" | {_text(ANSWER)} text" if text else ""
    lines = [
        f"root ::= {_text(TOOL)} call{answer}",
        f"call ::= {' | '.join(alternatives.values()) or 'object'}",
    ]
    lines += [f"{k} ::= {v}" for k, v in rules.rules.items()]
    return "\n".join(lines) + _COMMON


def _call(rules: _Rules, name: str, params: Any) -> str:
    schema = params if isinstance(params, Mapping) else {"type": "object"}
    return _call_rule(rules, name, rules.object(schema, f"{name}-args"))


def _call_rule(rules: _Rules, name: str, arguments: str) -> str:
    head = _text('{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ')
    return rules.add(f"call-{name}", f'{head} {arguments} "}}"')


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
