"""The layout's rule: a path names its process, and each folder imports only what is below it.

Every module of ``actors`` may reach (directly or through what it imports) only the
folders its row of :data:`MAY_REACH` names, checked by walking the imports. The rows, from
the bottom up (docs/architecture.md draws the same picture):

- ``base``: every process (errors, config, cancel, events, rules, text cuts, durable writes,
  process trees);
- ``wire``: every process that speaks ZeroMQ (codec, field checks, CURVE);
- ``tools.protocol``, ``tools.providers``, ``tools.host``: the tool host process. What runs
  tools never reaches a session, a log, inference, approval, the daemon or pykka;
- ``log``: the records and their file; ``inference``: the model server's side;
  ``tools`` (port, registry, search, toolbox): the session process's side of the tool wire;
  ``approval``: the gate and the rules file; ``session``: the actor, the turn, the world
  (and the session service's result types, which the turn makes); ``session.smallmodel``:
  what helps a small model, which the turn asks and which asks nothing of the session, the
  model server, the gate or the tool host's code back;
- ``daemon`` (``protocol``, ``address``, ``client``): what a client of ``loopd serve`` runs.
  It reaches the records (a client reads a log) but never the log file, a session, the
  turn, inference, the tool port or pykka: a ``loopd run`` that finds a daemon loads none
  of the world it would otherwise build;
- ``daemon.server``: ``loopd serve``; ``acp``: ``loopd acp``, the editor's agent: what the
  CLI reaches but the CLI and the daemon's server; ``cli``: the person's command, the top:
  nothing below it imports it, and nothing but it imports ``acp``.

Every ``import`` counts, including ones inside functions and under TYPE_CHECKING: a lazy
import still runs in the process that calls it. One exception, the package's public face:
``actors/__init__.py`` runs in every process, so a name it loads on first use (PEP 562's
``__getattr__``, typed under TYPE_CHECKING) is reached only by a module that imports that
name (``from actors import Client``), never by every module below ``actors``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_HOST = ("actors.base", "actors.wire", "actors.tools.protocol", "actors.tools.providers")
_CLIENT = (
    "actors.base", "actors.wire", "actors.tools.protocol.spec", "actors.log.records",
    "actors.log.server_values",
    "actors.daemon.protocol", "actors.daemon.address", "actors.daemon.client",
    "actors.service.types", "actors.service.remote",
)
_WORLD = ("actors.log", "actors.inference", "actors.tools", "actors.approval", "actors.session")
# folder -> the folders (or modules) of loopd it may reach, its own included; the most
# specific folder of a module decides. Third-party packages are free but for pykka.
MAY_REACH: dict[str, tuple[str, ...]] = {
    "actors.base": ("actors.base",),
    "actors.wire": ("actors.base", "actors.wire"),
    "actors.tools.protocol": ("actors.base", "actors.wire", "actors.tools.protocol"),
    "actors.tools.providers": _HOST,
    "actors.tools.host": (*_HOST, "actors.tools.host"),
    "actors.log": ("actors.base", "actors.wire", "actors.tools.protocol", "actors.log"),
    "actors.inference": (
        "actors.base", "actors.wire", "actors.tools.protocol", "actors.log", "actors.inference",
    ),
    "actors.tools": ("actors.base", "actors.wire", "actors.tools"),
    "actors.approval": (
        "actors.base", "actors.wire", "actors.log", "actors.tools.protocol", "actors.approval",
    ),
    # the session service's result types too: the turn makes the TurnOutcome it returns
    "actors.session": (
        "actors.base", "actors.wire", "actors.log", "actors.inference", "actors.tools",
        "actors.approval", "actors.session", "actors.service.types",
    ),
    # what helps a small model: asked by the turn as it builds a request, it asks nothing of
    # the session (its actor, turn, world), the model server or the gate back; it knows the
    # tools by what both ends share (specs, the workspace walk), never by the host's code
    "actors.session.smallmodel": (
        "actors.base", "actors.wire", "actors.log", "actors.tools.protocol", "actors.tools.search",
        "actors.session.smallmodel",
    ),
    "actors.daemon": _CLIENT,
    # the session service: its types and the daemon's side are a client's; in this process
    # it is the world's, and the choice between them reaches both
    "actors.service": _CLIENT,
    "actors.service.local": (*_CLIENT, *_WORLD, "actors.service.local"),
    "actors.service.choose": (*_CLIENT, *_WORLD, "actors.service"),
    "actors.daemon.server": (*_CLIENT, *_WORLD, "actors.service", "actors.daemon.server"),
    # loopd acp: what the CLI may reach but the CLI itself and the daemon's server side
    "actors.acp": (*_CLIENT, *_WORLD, "actors.service", "actors.acp"),
    "actors.cli": ("actors",),
    "actors": _CLIENT,  # the package's public face: the client, the config, the errors
}
NO_PYKKA = (
    "actors.base", "actors.wire", "actors.tools.protocol", "actors.tools.providers",
    "actors.tools.host", "actors.log", "actors.daemon.protocol", "actors.daemon.address",
    "actors.daemon.client", "actors.service.types", "actors.service.remote",
    "actors.session.smallmodel",
)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_lazy(node: ast.stmt) -> bool:
    """``def __getattr__`` or ``if TYPE_CHECKING:`` at the top of a package's face."""
    if isinstance(node, ast.FunctionDef):
        return node.name == "__getattr__"
    return isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")


def lazy_names(root: Path, package: str = "actors") -> dict[str, set[str]]:
    """``package.NAME`` -> what it loads, for each name the face loads on first use."""
    tree = ast.parse((root / package / "__init__.py").read_text(encoding="utf-8"))
    found: dict[str, set[str]] = {}
    for top in tree.body:
        if not _is_lazy(top):
            continue
        for node in ast.walk(top):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    found.setdefault(f"{package}.{alias.asname or alias.name}", set()).update(
                        (node.module, f"{node.module}.{alias.name}")
                    )
    return found


def imports_of(root: Path, path: Path, *, skip_lazy: bool = False) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved); with
    ``skip_lazy``, not what its lazy parts (see :func:`_is_lazy`) import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    if skip_lazy:
        tree.body = [node for node in tree.body if not _is_lazy(node)]
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
    """Module -> the modules it imports, for every module of ``package`` under ``root``; the
    names the package's face loads on first use are nodes of their own (``actors.Client``)."""
    modules = {module_name(root, p): p for p in (root / package).rglob("*.py")}
    found = {
        name: imports_of(root, path, skip_lazy=name == package) for name, path in modules.items()
    }
    return {**found, **lazy_names(root, package)}


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


def packages(root: Path, package: str = "actors") -> set[str]:
    return {module_name(root, p) for p in (root / package).rglob("__init__.py")}


def rule_of(module: str) -> str:
    """The most specific folder of MAY_REACH that holds ``module``."""
    return max((f for f in MAY_REACH if _within(module, (f,))), key=len)


def violations(imports: dict[str, set[str]], pkgs: set[str] = frozenset()) -> list[str]:  # type: ignore[assignment]
    bad: list[str] = []
    for module in sorted(imports):
        rule = rule_of(module)
        for target, via in sorted(reach(imports, module).items()):
            if target == "pykka" and _within(module, NO_PYKKA):
                bad.append(f"{module} reaches pykka (imported by {via})")
            if not _within(target, ("actors",)) or target in pkgs:
                continue  # third-party; a package's __init__ is followed for what it imports
            if not _within(target, MAY_REACH[rule]):
                bad.append(f"{module} reaches {target} (imported by {via}); {rule} may not")
    return bad


def test_the_layers_hold() -> None:
    assert violations(graph(ROOT), packages(ROOT)) == []


def test_every_module_has_a_rule() -> None:
    """A new top-level folder must be given its row (else it would fall to ``actors``'s)."""
    tops = {m.split(".")[1] for m in graph(ROOT) if m.count(".") >= 1} - {
        m.split(".")[1] for m in lazy_names(ROOT)
    }
    assert tops <= {f.split(".")[1] for f in MAY_REACH if f != "actors"}, tops


def host_reaching_events(imports: dict[str, set[str]]) -> list[str]:
    """The events a turn emits live in ``base`` because every emitter and reader may import
    it (docs/layout.md); the tool host is not one of them and never loads them."""
    return sorted(
        f"{m} reaches actors.base.events (imported by {via})"
        for m in imports if _within(m, (*_HOST[2:], "actors.tools.host"))
        for target, via in reach(imports, m).items() if target == "actors.base.events"
    )


def test_the_tool_host_loads_no_turn_events() -> None:
    assert host_reaching_events(graph(ROOT)) == []
    caught = host_reaching_events({"actors.tools.providers.x": {"actors.base.events"}})
    assert caught == ["actors.tools.providers.x reaches actors.base.events (imported by "
                      "actors.tools.providers.x)"]


def test_the_walk_sees_the_hosts_real_imports() -> None:
    """A checker that found nothing could pass on an empty graph: it must see real edges."""
    reached = reach(graph(ROOT), "actors.tools.host.main")
    assert "actors.tools.protocol.wire" in reached
    assert "actors.tools.host.server" in reached
    assert "zmq" in reached
    client = reach(graph(ROOT), "actors.daemon.client")
    assert "actors.daemon.protocol" in client and "actors.wire.codec" in client


_MINI = (
    "actors/__init__.py", "actors/base/__init__.py", "actors/base/errors.py",
    "actors/wire/__init__.py", "actors/wire/codec.py",
    "actors/log/__init__.py", "actors/log/file.py", "actors/log/records.py",
    "actors/session/__init__.py", "actors/session/turn.py", "actors/session/actor.py",
    "actors/session/smallmodel/__init__.py", "actors/session/smallmodel/grammar.py",
    "actors/cli/__init__.py", "actors/cli/view.py", "actors/cli/main.py",
    "actors/inference/__init__.py", "actors/inference/llama.py",
    "actors/tools/__init__.py", "actors/tools/host/__init__.py",
    "actors/tools/providers/__init__.py", "actors/tools/protocol/__init__.py",
    "actors/tools/protocol/wire.py", "actors/tools/protocol/relay.py",
    "actors/daemon/__init__.py", "actors/daemon/client.py", "actors/daemon/protocol.py",
    "actors/daemon/server/__init__.py", "actors/daemon/server/loop.py",
    "actors/acp/__init__.py", "actors/acp/agent.py",
)


_FACE = """from typing import TYPE_CHECKING
from actors.base.errors import LoopdError
if TYPE_CHECKING:
    from actors.daemon.client import Client
def __getattr__(name):
    from actors.daemon.client import Client
    return Client
"""


@pytest.mark.parametrize(
    ("module", "line", "caught"),
    [
        ("actors/tools/providers/evil.py", "from actors.session.actor import open_session",
         "reaches actors.session.actor"),
        ("actors/tools/providers/evil.py", "def f():\n    import pykka", "reaches pykka"),
        ("actors/tools/protocol/wire.py", "from actors.log.records import Usage",
         "reaches actors.log.records"),
        # indirect: the host imports the protocol, whose relay imports inference
        ("actors/tools/protocol/relay.py", "from actors.inference import llama",
         "actors.tools.host reaches actors.inference.llama"),
        ("actors/log/file.py", "from actors.cli import view", "reaches actors.cli.view"),
        ("actors/session/turn.py", "from actors.cli.main import main", "reaches actors.cli"),
        # the session makes the service's results, but never calls the service
        ("actors/session/turn.py", "from actors.service import local",
         "reaches actors.service.local"),
        # the small-model aids: the turn asks them, they ask nothing of the session back
        ("actors/session/smallmodel/grammar.py", "from actors.session import turn",
         "reaches actors.session.turn"),
        ("actors/session/smallmodel/grammar.py", "from actors.inference import llama",
         "actors.session.smallmodel may not"),
        ("actors/session/smallmodel/grammar.py", "def f():\n    import pykka", "reaches pykka"),
        ("actors/session/smallmodel/grammar.py", "from actors.tools.providers import standard",
         "reaches actors.tools.providers.standard"),
        ("actors/base/errors.py", "from actors.wire import codec", "actors.base may not"),
        ("actors/wire/codec.py", "from actors.log import records", "actors.wire may not"),
        ("actors/inference/llama.py", "from actors.session import turn", "reaches actors"),
        ("actors/daemon/client.py", "from actors.daemon.server import loop",
         "reaches actors.daemon.server.loop"),
        ("actors/daemon/client.py", "from actors.log import file", "reaches actors.log.file"),
        # indirect: the protocol the client shares imports the session
        ("actors/daemon/protocol.py", "from actors.session.actor import x",
         "actors.daemon.client reaches actors.session.actor"),
        ("actors/daemon/protocol.py", "def f():\n    import pykka", "reaches pykka"),
        # the daemon's messages are its own: its heartbeat is not the tool wire's
        ("actors/daemon/protocol.py", "from actors.tools.protocol.wire import Ping",
         "actors.daemon.client reaches actors.tools.protocol.wire"),
        # the face loads the client eagerly: every module below it would load it too
        ("actors/__init__.py", "from actors.daemon.client import Client",
         "actors.tools.host reaches actors.daemon.client (imported by actors)"),
        # a lazy name of the face is reached by what imports it
        ("actors/tools/providers/evil.py", "from actors import Client",
         "actors.tools.providers.evil reaches actors.daemon.client"),
        # loopd acp: nothing below the CLI imports it; it imports neither the CLI nor serve
        ("actors/session/turn.py", "from actors.acp import agent", "reaches actors.acp"),
        ("actors/daemon/client.py", "from actors.acp import agent", "reaches actors.acp"),
        ("actors/acp/agent.py", "from actors.cli import view", "reaches actors.cli.view"),
        ("actors/acp/agent.py", "from actors.daemon.server import loop",
         "reaches actors.daemon.server.loop"),
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
    (tmp_path / "actors/daemon/client.py").write_text("from actors.daemon import protocol\n")
    (tmp_path / "actors/cli/main.py").write_text("from actors.session import turn\n")
    (tmp_path / "actors/__init__.py").write_text(_FACE)
    assert violations(graph(tmp_path), packages(tmp_path)) == []
    target = tmp_path / module
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(line + "\n")
    found = violations(graph(tmp_path), packages(tmp_path))
    assert any(caught in v for v in found), found


# --- the architecture page's map ---------------------------------------------------------------

MAP_HEADING, MAP_END = "## Where each line runs", "\n## "
MAP_PAGE = "docs/architecture.md"
_ROW = re.compile(r"^\| `(actors/(?:[\w/]+/)?)` \|(.*)$")


def unmapped(root: Path) -> list[str]:
    """Modules the architecture page's map ("Where each line runs") leaves out: every folder of
    ``actors`` that holds a module has a row of its own, and its row names each module
    (its file name, in backquotes; ``__init__.py`` and ``__main__.py`` are the folder itself)."""
    readme = (root / MAP_PAGE).read_text(encoding="utf-8")
    start = readme.index(MAP_HEADING)
    end = readme.find(MAP_END, start + len(MAP_HEADING))
    rows = {m[1]: m[2] for line in readme[start:end].splitlines() if (m := _ROW.match(line))}
    missing = []
    for path in sorted((root / "actors").rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        folder = path.parent.relative_to(root).as_posix() + "/"
        if folder not in rows:
            missing.append(f"{folder} has no row (it holds {path.name})")
        elif f"`{path.name}`" not in rows[folder]:
            missing.append(f"{folder}{path.name} is not named in its folder's row")
    return missing


def test_the_map_names_every_module() -> None:
    """A module added without a word in docs/architecture.md's "Where each line runs" fails
    here: add it to its folder's row (a new folder: a row of its own, with the process it
    runs in)."""
    assert unmapped(ROOT) == []


def test_a_module_missing_from_the_map_is_caught(tmp_path: Path) -> None:
    """The check on a small copy: clean, then a module without a word, then a folder
    without a row."""
    (tmp_path / "actors/wire").mkdir(parents=True)
    for name in ("actors/__init__.py", "actors/wire/__init__.py", "actors/wire/loop.py"):
        (tmp_path / name).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / MAP_PAGE).write_text(
        "# x\n\n## Where each line runs\n\n| folder | runs in | what it holds |\n|---|---|---|\n"
        "| `actors/wire/` | every process | `loop.py` (the loop) |\n\n## Errors\n\n"
        "| `actors/wire/` | later table | `codec.py` |\n"
    )
    assert unmapped(tmp_path) == []
    (tmp_path / "actors/wire/codec.py").write_text("")  # named only in a table past the map
    assert unmapped(tmp_path) == ["actors/wire/codec.py is not named in its folder's row"]
    (tmp_path / "actors/wire/codec.py").unlink()
    (tmp_path / "actors/wire/port").mkdir()
    (tmp_path / "actors/wire/port/calls.py").write_text("")
    assert unmapped(tmp_path) == ["actors/wire/port/ has no row (it holds calls.py)"]


# --- the tests' own layout ---------------------------------------------------------------


def helper_imports(root: Path) -> list[str]:
    """Imports between test files: a test file's names are its own, a private name
    (``_helper``) is nobody else's, and a conftest module is pytest's (it gives fixtures,
    never imported as a module); what tests share lives in ``tests/support/`` (or a
    folder's rig module), under a public name."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "tests."
            ):
                continue
            source = node.module or ""
            where = path.relative_to(root)
            if source.rpartition(".")[2].startswith("test_"):
                found.append(f"{where} imports from the test file {source}")
            if source.rpartition(".")[2] == "conftest":
                found.append(f"{where} imports the conftest module {source}")
            found += [f"{where} imports the private {a.name} from {source}"
                      for a in node.names if a.name.startswith("_")]  # fmt: skip
    return found


def test_tests_share_helpers_through_support() -> None:
    assert helper_imports(ROOT) == []


@pytest.mark.parametrize(
    ("line", "caught"),
    [
        ("from tests.a.test_b import helper", "imports from the test file tests.a.test_b"),
        ("from tests.support.kit import _hidden", "imports the private _hidden"),
        ("from tests.a.conftest import Rig", "imports the conftest module tests.a.conftest"),
    ],
)
def test_a_test_importing_another_tests_helper_is_caught(
    tmp_path: Path, line: str, caught: str
) -> None:
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_c.py").write_text("from tests.support.kit import helper\n")
    assert helper_imports(tmp_path) == []
    (tmp_path / "tests" / "a" / "test_d.py").write_text(line + "\n")
    assert any(caught in p for p in helper_imports(tmp_path))
