"""Recognise a tool call that a small model wrote as bare JSON in ``content``.

Small local models (the embedded Qwen2.5-Coder-0.5B among them) often answer with
``{"name": "find_tool", "arguments": {...}}`` as plain text instead of the chat template's
tool-call tags, so the server reports no ``tool_calls``. Under the setting
``inference.bare_json_tool_calls`` such an answer is treated as that call.

The rule is deliberately narrow so that a real answer is never mistaken for a call: the
whole content (surrounding whitespace allowed, optionally inside one ``` or ```json code
fence) must be exactly one JSON object with ``name`` (a known tool) and exactly one of
``arguments`` / ``parameters`` (an object, or a JSON string holding one). Other keys are
ignored: the real model adds an echo of the tool's ``description``. A JSON object inside
prose, several objects (the model repeating itself) or a truncated object are not a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from typing import Any

__all__ = ["bare_call", "could_be_call", "parse_bare_tool_call", "via_call_tool"]

_FENCE = re.compile(r"\A```(?:json)?[ \t]*\r?\n(?P<body>.*?)\r?\n?```\Z", re.DOTALL | re.IGNORECASE)
_ARGUMENT_KEYS = ("arguments", "parameters")


def parse_bare_tool_call(content: str | None, known: Collection[str]) -> tuple[str, str] | None:
    """``(name, arguments_json)`` when ``content`` is exactly one call of a tool in ``known``.

    ``arguments_json`` is the arguments object re-encoded as JSON text (a string-encoded
    object is decoded first, also for ``call_tool``'s inner ``arguments``), so it can go
    into a ToolCall like a native call's arguments. Anything else gives None.
    """
    if content is None:
        return None
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced is not None:
        text = fenced.group("body").strip()
    if not text.startswith("{"):
        return None
    data = _loads(text)
    if not isinstance(data, dict):
        return None
    name = data.get("name")
    arg_keys = [k for k in _ARGUMENT_KEYS if k in data]
    if not isinstance(name, str) or name not in known or len(arg_keys) != 1:
        return None
    arguments = _object(data[arg_keys[0]])
    if arguments is None:
        return None
    if name == "call_tool":
        arguments = _call_tool_arguments(arguments)
        if arguments is None:
            return None
    return name, json.dumps(arguments, ensure_ascii=False)


def bare_call(
    content: str | None, offered: Collection[str], registered: Collection[str]
) -> tuple[str, str] | None:
    """``(name, arguments_json)`` of the call ``content`` writes as bare JSON, as the model
    may make it: a tool ``offered`` in the baseline by its own name, a ``registered`` one
    through ``call_tool``; None when the content is not one call of either."""
    parsed = parse_bare_tool_call(content, {*offered, *registered})
    if parsed is None:
        return None
    return parsed if parsed[0] in offered else via_call_tool(*parsed)


def could_be_call(text: str) -> bool:
    """Whether streamed ``text`` could still grow into what :func:`parse_bare_tool_call`
    takes: nothing yet but whitespace, a JSON object begun (it may close as a call), or the
    start of a code fence that could hold one. Text that cannot is answer text, and the
    live view may show it at once."""
    t = text.lstrip()
    if not t or t.startswith("{") or "```".startswith(t):
        return True
    if not t.startswith("```"):
        return False
    rest = t[3:]
    if "json".startswith(rest.lower()):
        return True  # "```", "```js": the fence's language may still be json
    if rest.lower().startswith("json"):
        rest = rest[4:]
    rest = rest.lstrip(" \t")
    if rest in ("", "\r"):
        return True
    if not rest.startswith(("\n", "\r\n")):
        return False  # another language, or text on the fence's line
    body = rest.lstrip()
    return not body or body.startswith("{")


def via_call_tool(name: str, arguments_json: str) -> tuple[str, str]:
    """The same call routed through ``call_tool``.

    After ``find_tool`` a small model tends to call the found tool by its own name, which
    the server does not offer directly. Pass the registry's names in ``known`` as well and
    route a call whose name is not a baseline tool through this.
    """
    return "call_tool", json.dumps(
        {"name": name, "arguments": json.loads(arguments_json)}, ensure_ascii=False
    )


def _call_tool_arguments(arguments: dict[str, Any]) -> dict[str, Any] | None:
    """call_tool's own arguments: ``name`` (a string) and ``arguments`` (an object)."""
    inner_name = arguments.get("name")
    inner_key = [k for k in _ARGUMENT_KEYS if k in arguments]
    if not isinstance(inner_name, str) or len(inner_key) != 1:
        return None
    inner = _object(arguments[inner_key[0]])
    if inner is None:
        return None
    return {"name": inner_name, "arguments": inner}


def _object(value: Any) -> dict[str, Any] | None:
    """An arguments value as an object: as it is, or decoded from a JSON string."""
    if isinstance(value, str):
        value = _loads(value.strip())
    return value if isinstance(value, dict) else None


def _loads(text: str) -> Any:
    """Strict JSON (no NaN/Infinity), or None when the text is not exactly one value."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return None


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")
