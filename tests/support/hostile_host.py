"""A tool host process whose tools' schemas attack the grammar builder (a host loopd's own
checks do not hold: a remote one, or any program speaking the wire).

``python -m tests.support.hostile_host --bind ENDPOINT [--parent-pid PID]`` offers:

- ``wide``: 10,000 optional properties (the grammar was quadratic in them: 61 MB per request
  at 2,000; at 10,000 the turn never finished and ignored SIGTERM);
- ``deep``: a ``type`` list naming one kind twice, nested 28 levels deep (each level was
  built once per name in the list: 2^28 builds for a schema of a few kilobytes);
- ``odd``: ``required: 5`` (a TypeError that ended the turn);
- ``fine``: an ordinary tool, still held to its schema.

A call of any answers "TOOL ran". The schemas are :func:`wide`, :func:`deep` and :func:`odd`,
also used by the grammar's own tests.
"""

from __future__ import annotations

import sys
from typing import Any

from actors.tools.protocol import wire
from actors.tools.protocol.spec import ToolSpec
from tests.support.garbage_host import serve

__all__ = ["FINE", "deep", "deep_shared", "main", "odd", "specs", "wide"]


def wide(n: int = 10_000) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(n)}}


def deep(levels: int = 28) -> dict[str, Any]:
    """``{"type": ["array", "array"], "items": NEXT}``, nested: a tree, linear in size."""
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        inner = {"type": ["array", "array"], "items": inner}
    return {"type": "object", "properties": {"x": inner}, "required": ["x"]}


def deep_shared(levels: int = 28) -> dict[str, Any]:
    """Each level's properties and items are the same object (a schema built in memory,
    such as an MCP server's): read twice per level, 2^levels reads."""
    inner: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        inner = {"type": ["object", "array"], "properties": {"x": inner}, "items": inner}
    return {"type": "object", "properties": {"x": inner}, "required": ["x"]}


def odd() -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "string"}}, "required": 5}


FINE = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def specs() -> tuple[ToolSpec, ...]:
    return (ToolSpec("wide", "Many options.", wide()), ToolSpec("deep", "Nested.", deep()),
            ToolSpec("odd", "An odd schema.", odd()), ToolSpec("fine", "Echo the text.", FINE))


def main(argv: list[str] | None = None) -> int:
    return serve(argv, specs(), lambda call: wire.encode(wire.Result(call.id, f"{call.tool} ran")),
                 __doc__.split("\n")[0])


if __name__ == "__main__":
    sys.exit(main())
