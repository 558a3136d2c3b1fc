"""Every reference the code's prose makes points at something that exists.

A docstring or comment that names ``actors/session/turn.py``, ``actors.log.file.SessionLog``,
``tests/support/fake_llama.py`` or ``docs/slots.md#files`` sends a newcomer there; after a
move or a rename it sends them nowhere. This walks the docstrings and comments of every
Python file of the repository, and the Markdown and TOML files, and checks:

- a path under ``actors/``, ``tests/``, ``scripts/``, ``docs/``, ``config/`` or
  ``examples/`` names a file or folder of the repository; a shorter one
  (``inference/llama.py``) names one under ``actors/``, and a bare ``name.py`` is the name of
  some file of the repository (in a Markdown page: in a table, where its maps are);
- ``actors.x.y`` names a module (or a package), perhaps followed by a name that module
  defines at its top level, or a class and one of its members;
- ``docs/FILE.md#anchor`` names a heading of that file (GitHub's anchors: lower case,
  punctuation dropped, spaces as hyphens);
- a Markdown link (``[text](../actors/log/file.py)``, ``[text](slots.md#files)``) leads to a
  file of the repository, from where the page is, and to a heading when it names one;
- nothing cites a document the repository does not hold ("design 9", "protocol notes 3.2",
  "bench-notes", ``../shared``): the design is in ``docs/``;
- nothing cites an issue number ("issue 24", "#38"), in prose or in a Python string: a reader
  of the repository cannot follow one. Say what was decided, or cite ``docs/FILE.md#section``
  (another project's ``owner/repo#N`` is a link a reader can follow, and stays).

Test data (string literals that are not docstrings) is not prose and is not checked.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PATH = re.compile(
    r"(?<![\w./-])((?:actors|tests|scripts|docs|config|examples)/[\w./*-]*[\w*])(#[\w-]+)?"
)
DOTTED = re.compile(r"(?<![\w./-])(actors(?:\.\w+)+)")
# a path from inside actors/ (``inference/llama.py``) or a file's bare name (``turn.py``)
PARTIAL = re.compile(r"(?<![\w./-])((?:\w+/)*\w+\.py)\b")
LINK = re.compile(r"\]\(([^)#\s]*)(#[\w-]+)?\)")  # a Markdown link: [text](target#anchor)
ROOTS = ("actors/", "tests/", "scripts/", "docs/", "config/", "examples/")
OUTSIDE = re.compile(
    r"\bdesign (?:section )?\d+|\bprotocol notes\b|\bbench-notes\b|\.\./shared\b|shared/docs"
    r"|llama-server-protocol\.md|library-notes",
    re.IGNORECASE,
)
# "issue 24" anywhere (a string of the code too); "#38" in prose only (test data counts
# records as "#5"), not after a word or a slash (llama.cpp#26954, owner/repo#12)
ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
HASH_NUMBER = re.compile(r"(?<![\w/.&`#-])#\d+\b")
SKIP_DIRS = {".git", ".venv", "node_modules", "bench", "build", "loopd.egg-info"}
# `make eval`'s workspaces are test data, not prose: loopd-docs holds copies of this
# repository's pages, whose links lead from where the originals are.
DATA = Path("examples/eval/workspaces")
SELF = Path(__file__).resolve()  # its prose shows the patterns it refuses


def prose_of_python(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every docstring and comment of a Python source."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            value = first.value if isinstance(first, ast.Expr) else None
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                yield value.lineno, value.value
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def prose_of(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        yield from prose_of_python(text)
    elif path.suffix == ".toml":
        for n, line in enumerate(text.splitlines(), 1):
            if "#" in line:
                yield n, line[line.index("#"):]
    else:  # Markdown: all of it is prose
        yield from enumerate(text.splitlines(), 1)


def anchors(markdown: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file."""
    found = set()
    in_code = False
    for line in markdown.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def top_level_names(path: Path) -> tuple[dict[str, set[str]], dict[str, str]]:
    """Names a module defines at its top level (a class maps to its members), and where
    each name it imports from a module of loopd comes from (``name -> module.name``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: dict[str, set[str]] = {}
    imported: dict[str, str] = {}

    def add(node: ast.stmt) -> None:
        if isinstance(node, ast.ClassDef):
            members = set()
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    members.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    members.update(t.id for t in item.targets if isinstance(t, ast.Name))
            names[node.name] = members
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = set()
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Name):
                        names[t.id] = set()
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = set()
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = set()
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, guarded imports
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    add(child)

    for node in tree.body:
        add(node)
    for node in tree.body:  # a module's lazy names (PEP 562), typed under TYPE_CHECKING
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom) and child.module:
                    for alias in child.names:
                        imported[alias.asname or alias.name] = f"{child.module}.{alias.name}"
    return names, imported


def dotted_problem(root: Path, name: str) -> str | None:
    """Why ``name`` (``actors.x.y[.Attr[.member]]``) names nothing, or None."""
    parts = name.split(".")
    module: Path | None = None
    used = 0
    for i in range(1, len(parts) + 1):
        base = root.joinpath(*parts[:i])
        if (base / "__init__.py").is_file():
            module, used = base / "__init__.py", i
        elif base.with_suffix(".py").is_file():
            module, used = base.with_suffix(".py"), i
            break
        else:
            break
    if module is None:
        return "no such module"
    rest = parts[used:]
    if not rest:
        return None
    names, imported = top_level_names(module)
    if rest[0] not in names:
        return f"{'.'.join(parts[:used])} defines no {rest[0]}"
    if len(rest) > 1 and imported.get(rest[0], "").startswith("actors."):
        return dotted_problem(root, ".".join([imported[rest[0]], *rest[1:]]))
    if len(rest) > 1 and rest[1] not in names[rest[0]]:
        return f"{'.'.join(parts[:used + 1])} has no member {rest[1]}"
    return None


def problems(root: Path) -> list[str]:
    """Every reference in ``root``'s prose that points at nothing."""
    found: list[str] = []
    everywhere = {
        p.name for p in root.rglob("*.py") if not SKIP_DIRS & set(p.relative_to(root).parts)
    }
    files = [
        p for p in root.rglob("*")
        if p.suffix in (".py", ".md", ".toml") and p.is_file()
        and not SKIP_DIRS & set(p.relative_to(root).parts) and p.resolve() != SELF
        and not p.relative_to(root).is_relative_to(DATA)
    ]  # fmt: skip
    for path in sorted(files):
        where = path.relative_to(root)
        whole = path.read_text(encoding="utf-8")
        for m in ISSUE.finditer(whole):
            line = 1 + whole.count("\n", 0, m.start())
            found.append(f"{where}:{line}: cites {m.group(0)!r}: say what was decided instead "
                         "(an issue number leads a reader of the repository nowhere)")
        for start, text in prose_of(path):
            for m in PATH.finditer(text):
                line = start + text.count("\n", 0, m.start())
                target, anchor = m.group(1).rstrip("."), m.group(2)
                if "*" in target:  # a glob names the files it matches: at least one
                    if not any(root.glob(target)):
                        found.append(f"{where}:{line}: {target} matches nothing")
                elif not (root / target).exists():
                    found.append(f"{where}:{line}: {target} does not exist")
                elif anchor and target.endswith(".md") and anchor[1:] not in anchors(
                    root / target
                ):
                    found.append(f"{where}:{line}: {target} has no heading {anchor}")
            for m in LINK.finditer(text) if path.suffix == ".md" else ():
                line = start + text.count("\n", 0, m.start())
                target, anchor = m.group(1), m.group(2)
                if target.startswith(("http://", "https://", "mailto:")):
                    continue
                file = (path.parent / target).resolve() if target else path
                if not file.exists():
                    found.append(f"{where}:{line}: the link {target} leads nowhere")
                elif anchor and file.suffix == ".md" and anchor[1:] not in anchors(file):
                    found.append(f"{where}:{line}: {target or where.name} has no heading {anchor}")
            for m in PARTIAL.finditer(text):
                line = start + text.count("\n", 0, m.start())
                name = m.group(1)
                if name.startswith(ROOTS):
                    continue  # checked above, as a path from the repository's root
                if "/" in name and not (root / "actors" / name).exists():
                    found.append(f"{where}:{line}: {name} is not a path under actors/")
                elif "/" not in name and name not in everywhere and (
                    path.suffix != ".md" or text.startswith("|")  # a page's maps are tables;
                ):  # its prose may show a person's own files (`python build.py`)
                    found.append(f"{where}:{line}: no file of the repository is named {name}")
            for m in DOTTED.finditer(text):
                line = start + text.count("\n", 0, m.start())
                why = dotted_problem(root, m.group(1).rstrip("."))
                if why:
                    found.append(f"{where}:{line}: {m.group(1)}: {why}")
            for m in HASH_NUMBER.finditer(text):
                line = start + text.count("\n", 0, m.start())
                found.append(f"{where}:{line}: cites {m.group(0)!r}: say what was decided instead "
                             "(an issue number leads a reader of the repository nowhere)")
            for m in OUTSIDE.finditer(text):
                line = start + text.count("\n", 0, m.start())
                found.append(
                    f"{where}:{line}: cites {m.group(0)!r}, which is not in the repository "
                    "(cite docs/FILE.md#section)"
                )
    return found


def test_every_reference_points_at_something() -> None:
    assert problems(ROOT) == []


def test_the_walk_sees_real_references() -> None:
    """A checker that read nothing would pass: it must see the references that are there."""
    seen = [
        m.group(1)
        for _, text in prose_of(ROOT / "actors" / "daemon" / "client.py")
        for m in DOTTED.finditer(text)
    ]
    assert "actors.daemon.protocol" in seen
    assert "actors.base.errors.DaemonError" in seen
    assert "log.md" in {p.name for p in (ROOT / "docs").iterdir()}
    assert "encoding" in anchors(ROOT / "docs" / "log.md")


_MINI = {
    "actors/__init__.py": "",
    "actors/log/__init__.py": "",
    "actors/log/file.py": (
        '"""The log (docs/log.md#the-file).\n\nSee actors.log.file.SessionLog."""\n'
        "class SessionLog:\n    def append(self):\n        pass\n"
    ),
    "docs/log.md": "# The log\n\n## The file\n\nRun `python build.py`.\n\n```\n# no heading\n```\n",
    "tests/test_x.py": "# tests actors/log/file.py\nX = 'actors/gone.py in test data is fine'\n",
}
_X = "actors/log/x.py"


@pytest.mark.parametrize(
    ("path", "text", "caught"),
    [
        (_X, '"""See actors/log/gone.py."""\n', "actors/log/gone.py does not exist"),
        (_X, "# moved to tests/log/test_gone.py\n", "tests/log/test_gone.py"),
        (_X, '"""Frames: docs/log.md#the-frames."""\n', "has no heading #the-frames"),
        (_X, '"""Frames: docs/frames.md."""\n', "docs/frames.md does not exist"),
        (_X, '"""A code block is no heading: docs/log.md#not-a-heading."""\n', "has no heading"),
        (_X, '"""See actors.log.records."""\n', "actors.log defines no records"),
        (_X, '"""See actors.log.file.Log."""\n', "defines no Log"),
        (_X, '"""See actors.log.file.SessionLog.close."""\n', "has no member close"),
        (_X, "def f():\n    # as design 9 says\n    pass\n", "cites 'design 9'"),
        (_X, '"""Protocol notes 3.2."""\n', "cites 'Protocol notes'"),
        (_X, '"""Every scripts/bench_*.py."""\n', "scripts/bench_*.py matches nothing"),
        (_X, "# see log/gone.py\n", "log/gone.py is not a path under actors/"),
        (_X, '"""As render.py does."""\n', "no file of the repository is named render.py"),
        ("docs/log.md", "# The log\n\nSee actors/log/gone.py.\n", "does not exist"),
        ("docs/log.md", "# Log\n\n| file | job |\n|---|---|\n| `render.py` | x |\n",
         "no file of the repository is named render.py"),
        ("docs/log.md", "# Log\n\n[file](../actors/log/gone.py)\n", "link ../actors/log/gone.py"),
        ("docs/log.md", "# The log\n\n[file](../actors/log/file.py) [up](#the-log)\n"
         "[frames](#frames)\n", "log.md has no heading #frames"),
        ("config/loopd.toml", "[log]\nfsync = 1  # see docs/fsync.md\n", "docs/fsync.md"),
        (_X, '"""Cut as issue 24 asked."""\n', "cites 'issue 24'"),
        (_X, 'WHY = "a limit (Issue 7)"\n', "cites 'Issue 7'"),
        (_X, "# the fix of #38\n", "cites '#38'"),
        ("docs/log.md", "# The log\n\nSince issues 13 and 27, frames are checked.\n", "issues 13"),
        ("docs/log.md", "# The log\n\nAs asked in #27.\n", "cites '#27'"),
    ],
)
def test_a_bad_reference_is_caught(tmp_path: Path, path: str, text: str, caught: str) -> None:
    """The checker on a small copy: clean, then with one bad reference added."""
    for name, body in _MINI.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body)
    assert problems(tmp_path) == []
    (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / path).write_text(text)
    found = problems(tmp_path)
    assert any(caught in p for p in found), found
