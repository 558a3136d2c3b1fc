"""One logger tree: every module's logger is ``loopd.<area>``, so one setting (``loopd``)
reaches all of loopd's lines and a line's logger says where it came from. A module-level
``log = logging.getLogger(...)`` named otherwise (``__name__``, a dotted module path) fails
here; another library's logger a module tunes (``httpx``, ``mcp.client.auth``: not ``log``)
is not checked."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_loggers(root: Path) -> dict[str, str]:
    """``path -> the name given`` of each module-level ``log = logging.getLogger(...)``
    (``?`` when the name is not a string)."""
    found: dict[str, str] = {}
    for path in sorted((root / "actors").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            named_log = isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Name) and target.id == "log" for target in node.targets)
            call = node.value if named_log and isinstance(node, ast.Assign) else None
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "getLogger"):
                arg = call.args[0] if call.args else None
                name = arg.value if isinstance(arg, ast.Constant) else "?"
                found[f"{path.relative_to(root)}:{node.lineno}"] = str(name)
    return found


def test_every_module_logger_is_under_loopd() -> None:
    found = module_loggers(ROOT)
    assert len(found) >= 10, found  # the walk sees the loggers that are there
    assert {where: name for where, name in found.items()
            if not name.startswith("loopd.")} == {}


def test_a_logger_outside_the_tree_is_caught(tmp_path: Path) -> None:
    (tmp_path / "actors").mkdir()
    (tmp_path / "actors/x.py").write_text('import logging\nlog = logging.getLogger(__name__)\n')
    assert module_loggers(tmp_path) == {"actors/x.py:2": "?"}
