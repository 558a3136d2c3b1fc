"""What a file defines, and where: the outline behind ``outline_file``, ``find_definition``
and the enclosing definition ``search_files`` shows for a match.

A small model answers from a part of a file far better than from a whole one, so the code
tools answer with names and lines, not text: a file's definitions (each with its line
span), a name's definitions across the workspace (with their signature and the first line
of their docstring), the definition a matched line sits in. Python is read by its own
parser (:mod:`ast`), so a name in a string or a comment is no definition; a file ast cannot
read (a syntax error, another language) falls back to lines that start like a definition
in the common languages (``def``, ``class``, ``function``, ``fn``, ``struct``, ...) and
Markdown headings, and says so. Every function here is pure: text in, records out.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterable

__all__ = ["Definition", "Outline", "describe", "enclosing", "outline", "signature"]


@dataclasses.dataclass(frozen=True, slots=True)
class Definition:
    """One definition of a file: ``kind`` (class, def, async def, variable, or the
    fallback's keyword or heading), its ``name``, ``qualname`` (Outer.inner), the lines it
    spans (1-based, inclusive), and its nesting ``depth``."""

    kind: str
    name: str
    qualname: str
    line: int
    end: int
    depth: int = 0
    doc: str = ""  # the first line of its docstring (Python)


@dataclasses.dataclass(frozen=True, slots=True)
class Outline:
    """A file's definitions in line order, and how they were found: ``parser`` is "python"
    (ast) or "lines" (the fallback), ``note`` says why the fallback was used."""

    definitions: tuple[Definition, ...]
    parser: str
    lines: int
    note: str = ""


def outline(path: str, text: str) -> Outline:
    """The definitions of file ``path`` holding ``text``: by ast for a ``.py``/``.pyi``
    file that parses, else by the fallback (with a note saying why for Python)."""
    count = len(text.splitlines())
    if path.endswith((".py", ".pyi")):
        try:
            tree = ast.parse(text, filename=path)
        except SyntaxError as e:
            note = f"not valid Python (line {e.lineno}: {e.msg}); definitions found by line"
            return Outline(_by_lines(text), "lines", count, note)
        except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, nesting
            note = f"not readable as Python ({type(e).__name__}); definitions found by line"
            return Outline(_by_lines(text), "lines", count, note)
        return Outline(tuple(_python(tree.body, "", 0)), "python", count)
    return Outline(_by_lines(text), "lines", count)


def _python(body: Iterable[ast.stmt], outer: str, depth: int) -> Iterable[Definition]:
    for node in body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            kind = ("class" if isinstance(node, ast.ClassDef) else
                    "async def" if isinstance(node, ast.AsyncFunctionDef) else "def")
            qual = f"{outer}.{node.name}" if outer else node.name
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            doc = _first_sentence(ast.get_docstring(node) or "")
            yield Definition(kind, node.name, qual, first, node.end_lineno or node.lineno,
                             depth, doc)
            yield from _python(node.body, qual, depth + 1)
        elif depth == 0 and isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    yield Definition("variable", target.id, target.id, node.lineno,
                                     node.end_lineno or node.lineno, depth)
        elif depth == 0 and isinstance(node, ast.If | ast.Try):  # if TYPE_CHECKING:, try: import
            yield from _python([*node.body, *getattr(node, "orelse", [])], outer, depth)


def _first_sentence(doc: str) -> str:
    """A docstring's first sentence (of its first paragraph), on one line, at most 160
    characters."""
    paragraph = " ".join(doc.strip().split("\n\n", 1)[0].split())
    end = paragraph.find(". ")
    return (paragraph[: end + 1] if end >= 0 else paragraph)[:160]


# A line that starts a definition in the common languages (the keyword, then the name), or
# a Markdown heading.
_KEYWORDS = ("def", "class", "function", "fn", "func", "struct", "enum", "interface",
             "trait", "impl", "module", "type", "const", "let", "var", "macro", "sub")
_DEFINES = re.compile(
    r"^(?P<indent>[ \t]*)(?:(?:export|pub(?:\([^)]*\))?|public|private|protected|static|"
    r"async|abstract|final|default|unsafe|extern)\s+)*(?P<kind>" + "|".join(_KEYWORDS) +
    r")\s+(?P<name>[A-Za-z_$][\w$]*)")
_HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<name>\S.*?)\s*#*\s*$")


def _by_lines(text: str) -> tuple[Definition, ...]:
    """Definitions found by how their first line starts; each spans to the line before the
    next one at its indent or less (a heading: to the next heading of its level or above)."""
    found: list[tuple[int, int, str, str]] = []  # line, level, kind, name
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if len(line) > 1000:
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading:
            found.append((number, len(heading["hashes"]) - 1, "heading", heading["name"][:120]))
            continue
        m = _DEFINES.match(line)
        if m:
            level = len(m["indent"].expandtabs(4)) // 2
            found.append((number, level, m["kind"], m["name"]))
    total = len(text.splitlines())
    out: list[Definition] = []
    stack: list[tuple[int, str]] = []  # level, qualname
    for i, (number, level, kind, name) in enumerate(found):
        end = next((n - 1 for n, lv, _, _ in found[i + 1:] if lv <= level), total)
        while stack and stack[-1][0] >= level:
            stack.pop()
        qual = f"{stack[-1][1]}.{name}" if stack and kind != "heading" else name
        out.append(Definition(kind, name, qual, number, max(end, number), len(stack)))
        stack.append((level, qual))
    return tuple(out)


def enclosing(found: Outline, line: int) -> Definition | None:
    """The innermost definition whose lines hold ``line`` (a variable or a heading's
    section does not count); None at a file's top level."""
    best: Definition | None = None
    for d in found.definitions:
        if d.kind not in ("variable", "heading") and d.line <= line <= d.end and (
                best is None or d.depth >= best.depth):
            best = d
    return best


def signature(text_lines: list[str], d: Definition) -> str:
    """A definition's first line as written (from its ``def``/``class`` line: decorators
    skipped), on one line and at most 160 characters."""
    for line in text_lines[d.line - 1: d.end]:
        stripped = line.strip()
        if stripped and not stripped.startswith("@"):
            return stripped[:160]
    return ""


def describe(d: Definition) -> str:
    """``kind qualname`` (a heading: its text)."""
    return d.name if d.kind == "heading" else f"{d.kind} {d.qualname}"
