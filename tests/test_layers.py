"""The layer rules of design section 13, checked by walking the imports of every module.

- A tool host process (``actors.tools.host``, ``actors.tools.providers``, and the protocol
  both sides share) never reaches session, log, turn, inference, records or pykka code:
  what runs tools must not be able to touch a session.
- ``actors.tools.protocol`` imports nothing of the daemon side either (it is the contract).
- Nothing below the CLI imports ``actors.cli`` or ``actors.view`` (the terminal is the top).
- The daemon's client side (``actors.client`` and the protocol and places it shares with
  ``actors.daemon``) reaches the daemon only through the protocol: never the daemon's
  server, sessions, the App, a session, the turn, inference, the tool client or pykka. A
  ``loopd run`` that finds a daemon loads none of the world it would otherwise build.

Every ``import`` counts, including ones inside functions and under TYPE_CHECKING: a lazy
import still runs in the process that calls it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HOST_SIDE = ("actors.tools.host", "actors.tools.providers", "actors.tools.protocol")
FORBIDDEN_IN_HOST = (
    "actors.session",
    "actors.log",
    "actors.turn",
    "actors.inference",
    "actors.records",
    "actors.render",
    "actors.app",
    "actors.tools.client",
    "actors.tools.registry",
    "actors.tools.toolbox",
    "pykka",
)
TOP = ("actors.cli", "actors.view", "actors.prompt")
CLIENT_SIDE = ("actors.client", "actors.daemon.protocol", "actors.daemon.place")
FORBIDDEN_IN_CLIENT = (
    "actors.daemon.server",
    "actors.daemon.sessions",
    "actors.daemon.main",
    "actors.app",
    "actors.session",
    "actors.log",
    "actors.turn",
    "actors.inference",
    "actors.tools.client",
    "actors.tools.registry",
    "actors.tools.toolbox",
    "pykka",
)
# The records check the server's numbers with these (pure functions), so a client reading a
# log reaches them; the package's __init__ is empty.
ALLOWED_IN_CLIENT = ("actors.inference", "actors.inference.server_values")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(root: Path, path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(root, path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # a submodule, maybe
    return found


def graph(root: Path, package: str = "actors") -> dict[str, set[str]]:
    """Module -> the modules it imports, for every module of ``package`` under ``root``."""
    modules = {module_name(root, p): p for p in (root / package).rglob("*.py")}
    return {name: imports_of(root, path) for name, path in modules.items()}


def _within(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def reach(imports: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` reaches, each with the module that imports it (for the message)."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in imports.get(current, set()):
            if target in seen:
                continue
            seen[target] = current
            # a package import runs its __init__; a module of ours is followed further
            todo.append(target)
            parent = target.rpartition(".")[0]
            while parent and parent not in seen:
                if parent in imports:
                    seen[parent] = current
                    todo.append(parent)
                parent = parent.rpartition(".")[0]
    return seen


def violations(imports: dict[str, set[str]]) -> list[str]:
    bad: list[str] = []
    for module in sorted(imports):
        if _within(module, HOST_SIDE):
            for target, via in reach(imports, module).items():
                if _within(target, FORBIDDEN_IN_HOST):
                    bad.append(f"{module} reaches {target} (imported by {via})")
        if _within(module, CLIENT_SIDE):
            for target, via in reach(imports, module).items():
                if _within(target, FORBIDDEN_IN_CLIENT) and target not in ALLOWED_IN_CLIENT:
                    bad.append(f"{module} reaches {target} (imported by {via})")
        if not _within(module, TOP):
            for target in imports[module]:
                if _within(target, TOP):
                    bad.append(f"{module} imports {target}, which only the CLI may use")
    return bad


def test_the_layers_hold() -> None:
    assert violations(graph(ROOT)) == []


def test_the_walk_sees_the_hosts_real_imports() -> None:
    """A checker that found nothing could pass on an empty graph: it must see real edges."""
    reached = reach(graph(ROOT), "actors.tools.host.main")
    assert "actors.tools.protocol.wire" in reached
    assert "actors.tools.host.server" in reached
    assert "zmq" in reached
    client = reach(graph(ROOT), "actors.client")
    assert "actors.daemon.protocol" in client and "actors.codec" in client


_MINI = (
    "actors/__init__.py", "actors/tools/__init__.py", "actors/log.py", "actors/turn.py",
    "actors/view.py", "actors/cli.py", "actors/session.py", "actors/records.py",
    "actors/inference/__init__.py", "actors/tools/host/__init__.py",
    "actors/tools/providers/__init__.py", "actors/tools/protocol/__init__.py",
    "actors/tools/protocol/wire.py", "actors/tools/protocol/relay.py",
    "actors/client.py", "actors/daemon/__init__.py", "actors/daemon/protocol.py",
    "actors/daemon/server.py",
)


@pytest.mark.parametrize(
    ("module", "line", "caught"),
    [
        ("actors/tools/providers/evil.py", "from actors.session import open_session",
         "reaches actors.session"),
        ("actors/tools/providers/evil.py", "def f():\n    import pykka", "reaches pykka"),
        ("actors/tools/protocol/wire.py", "from actors.records import Usage",
         "reaches actors.records"),
        # indirect: the host imports the protocol, whose relay imports inference
        ("actors/tools/protocol/relay.py", "from actors.inference import x",
         "actors.tools.host reaches actors.inference"),
        ("actors/log.py", "from actors import view", "only the CLI may use"),
        ("actors/turn.py", "from actors.cli import main", "only the CLI may use"),
        ("actors/client.py", "from actors.daemon import server", "reaches actors.daemon.server"),
        # indirect: the protocol the client shares imports the session
        ("actors/daemon/protocol.py", "from actors.session import x",
         "actors.client reaches actors.session"),
        ("actors/daemon/protocol.py", "def f():\n    import pykka", "reaches pykka"),
    ],
)
def test_a_bad_import_is_caught(tmp_path: Path, module: str, line: str, caught: str) -> None:
    """The checker on a small copy of the layout: clean, then with one bad import added."""
    for name in _MINI:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    (tmp_path / "actors/tools/host/__init__.py").write_text(
        "from actors.tools.protocol import relay, wire\n"
    )
    (tmp_path / "actors/client.py").write_text("from actors.daemon import protocol\n")
    assert violations(graph(tmp_path)) == []
    target = tmp_path / module
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(line + "\n")
    found = violations(graph(tmp_path))
    assert any(caught in v for v in found), found
