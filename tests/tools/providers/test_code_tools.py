"""The tools for code (outline_file, find_definition, read_file by lines, search_files'
enclosing definition), run in a real tool host process on a small Python project, with
the bad inputs a person's repository holds: a missing file, a binary file, a huge file, a
file that is not valid Python."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from actors.tools.port import PortSettings, ToolPort, start_port
from actors.tools.protocol import wire
from actors.tools.providers.code import enclosing, outline
from actors.tools.providers.standard import _about
from tests.tools.hostkit import short_dir, spawn_host

PARSER = '''"""A tiny parser."""

VERSION = "1.4.2"


class Context:
    """Where the parser is.

    More words that are not the first paragraph."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    @property
    def left(self) -> str:
        """Returns what is left to read."""
        return self.text[self.at:]


def parse(text: str) -> Context:
    """Parse text. It makes a Context."""
    context = Context(text)
    return context
'''

USES = '''from pkg.parser import parse


def main() -> None:
    # parse is used here
    print(parse("x"))
'''

BROKEN = "def fine():\n    return 1\n\ndef broken(:\n    pass\n\nclass Context:\n    x = 1\n"


@pytest.fixture(scope="module")
def host() -> Iterator[tuple[str, Path]]:
    """A host running the tools for code on a small project with bad files in it."""
    with short_dir() as d:
        ws = d / "ws"
        (ws / "pkg").mkdir(parents=True)
        (ws / "pkg" / "parser.py").write_text(PARSER)
        (ws / "pkg" / "cli.py").write_text(USES)
        (ws / "pkg" / "broken.py").write_text(BROKEN)
        (ws / "README.md").write_text("# Tiny\n\nA tiny parser.\n\n## Use\n\nCall parse.\n")
        (ws / "blob.bin").write_bytes(b"\x00\x01Context\x00" * 100)
        (ws / "huge.py").write_bytes(b"x = 1\n" * (9 * 1024 * 1024 // 6 + 1))  # over 8 MiB
        (ws / "many").mkdir()
        for name in ("a.py", "b.py"):  # 20 lines that use Widget, in two files
            (ws / "many" / name).write_text("".join(f"w{i} = Widget({i})\n" for i in range(10)))
        (ws / "deep.py").write_text("x = " + "(" * 400 + "1" + ")" * 400 + "\n")
        endpoint = f"ipc://{d}/code.sock"
        tools = ["read_file", "search_files", "outline_file", "find_definition"]
        args = ["--tools", *tools, "--workspace", str(ws), "--timeout", "60",
                "--max-output-bytes", "65536"]
        with spawn_host(endpoint, *args, log=d / "host.log"):
            yield endpoint, ws


@pytest.fixture
def port(host: tuple[str, Path]) -> Iterator[tuple[ToolPort, Path]]:
    endpoint, ws = host
    p = start_port(PortSettings("code", endpoint, 60.0, 2.0), context=zmq.Context.instance())
    try:
        assert p.wait_ready(30)
        yield p, ws
    finally:
        p.stop()


def _call(port: ToolPort, tool: str, **arguments: Any) -> wire.Answer:
    return port.call(session="s", call=1, tool=tool, arguments=arguments)


def _text(answer: wire.Answer) -> str:
    assert isinstance(answer, wire.Result), answer
    return answer.content


def _failed(answer: wire.Answer) -> str:
    assert isinstance(answer, wire.Failed), answer
    return answer.message


def test_an_outline_lists_definitions_with_their_lines(port: tuple[ToolPort, Path]) -> None:
    p, _ = port
    text = _text(_call(p, "outline_file", path="pkg/parser.py"))
    assert text.splitlines() == [
        "pkg/parser.py: 24 lines",
        "3-3: VERSION = \"1.4.2\"",
        "6-18: class Context:  # Where the parser is.",
        "  11-13: def __init__(self, text: str) -> None:",
        "  15-18: def left(self) -> str:  # Returns what is left to read.",
        "21-24: def parse(text: str) -> Context:  # Parse text.",
    ]
    # a Markdown file: its headings
    assert _text(_call(p, "outline_file", path="README.md")).splitlines()[1:] == [
        "1-7: Tiny", "  5-7: Use"]


def test_a_file_that_is_not_valid_python_is_outlined_by_its_lines(
    port: tuple[ToolPort, Path],
) -> None:
    p, _ = port
    text = _text(_call(p, "outline_file", path="pkg/broken.py"))
    head, *rows = text.splitlines()
    assert head.startswith("pkg/broken.py: 8 lines (not valid Python (line 4")
    assert rows == ["1-3: def fine():", "4-6: def broken(:", "7-8: class Context:"]
    # nesting too deep for the parser: the same fallback, not a crash
    assert _text(_call(p, "outline_file", path="deep.py")).startswith(
        "deep.py: 1 lines (not valid Python (line 1: too many nested parentheses)")


@pytest.mark.parametrize("tool", ["outline_file", "read_file"])
def test_missing_binary_and_huge_files_fail_with_the_reason(
    port: tuple[ToolPort, Path], tool: str,
) -> None:
    p, _ = port
    lines = {"start_line": 1} if tool == "read_file" else {}
    assert "'nope.py' does not exist" in _failed(_call(p, tool, path="nope.py", **lines))
    binary = _failed(_call(p, tool, path="blob.bin", **lines))
    assert "blob.bin is not a text file" in binary
    if tool == "outline_file":
        assert "too big to read whole" in _failed(_call(p, tool, path="huge.py"))
    else:  # lines near the start of a huge file are read without reading it all
        assert _text(_call(p, tool, path="huge.py", start_line=2, end_line=3)) == (
            "2: x = 1\n3: x = 1\n[more lines follow; read on with start_line=4]")


def test_read_by_line_range(port: tuple[ToolPort, Path]) -> None:
    p, _ = port
    assert _text(_call(p, "read_file", path="pkg/parser.py", start_line=21, end_line=22)) == (
        "21: def parse(text: str) -> Context:\n"
        '22:     """Parse text. It makes a Context."""\n'
        "[more lines follow; read on with start_line=23]")
    tail = _text(_call(p, "read_file", path="pkg/parser.py", start_line=24))
    assert tail == "24:     return context"  # to the end: no note
    assert "has 24 lines; start_line 90 is past its end" in _failed(
        _call(p, "read_file", path="pkg/parser.py", start_line=90))
    assert "end_line 2 is before start_line 5" in _failed(
        _call(p, "read_file", path="pkg/parser.py", start_line=5, end_line=2))
    # without lines, the byte read is as before
    assert _text(_call(p, "read_file", path="README.md")).startswith("# Tiny\n")


def test_find_definition(port: tuple[ToolPort, Path]) -> None:
    p, _ = port
    found = _text(_call(p, "find_definition", name="Context")).splitlines()
    # what its docstring says first, then its first line and place: given "path:lines:
    # class X:  # doc", the embedded model answered "What is X for?" with the place alone
    assert found == ["It is class Context in pkg/broken.py, lines 7-8.",
                     "Context is where the parser is (its docstring). It is class Context in "
                     "pkg/parser.py, lines 6-18."]
    # a use, a string or a comment is no definition (the cli module only uses parse)
    assert _text(_call(p, "find_definition", name="parse")) == (
        "parse parses text. It is def parse(text: str) -> Context in pkg/parser.py, "
        "lines 21-24.")
    # a docstring that starts with a verb reads as a sentence about the name
    assert _text(_call(p, "find_definition", name="Context.left")) == (
        "left returns what is left to read. It is def left(self) -> str in pkg/parser.py, "
        "lines 15-18.")
    assert _text(_call(p, "find_definition", name="VERSION", path="pkg")).startswith(
        "It is VERSION")
    assert _text(_call(p, "find_definition", name="context")).startswith(
        "no definition of context itself; these differ in case")
    # not found, in words that cannot read as a place (the model answered "defined in .;
    # search_files finds where the text is" from the old wording)
    assert _text(_call(p, "find_definition", name="Nowhere")) == (
        "Nowhere is not defined anywhere in the workspace: no class, function or variable "
        "there has that name.")
    assert _text(_call(p, "find_definition", name="Nowhere", path="pkg")).startswith(
        "Nowhere is not defined anywhere in pkg:")
    assert "is not a name" in _failed(_call(p, "find_definition", name="class Context"))
    assert "does not exist" in _failed(_call(p, "find_definition", name="x", path="nope"))


def test_a_docstring_reads_as_a_sentence_about_the_name() -> None:
    # a noun phrase after "is": quoted after the name ('Limits: "Configuration for ..."'),
    # the embedded model answered "What is the class Limits for?" with the place alone
    assert _about("Limits", "Configuration for limits to various client behaviors.") == (
        "Limits is configuration for limits to various client behaviors (its docstring).")
    assert _about("Doc", "A TOML document.") == "Doc is a TOML document (its docstring)."
    assert _about("Headers", "HTTP headers, as a multi-dict.") == (
        "Headers is HTTP headers, as a multi-dict (its docstring).")  # an acronym keeps its case
    # a verb: in the third person as it is, an imperative put in it
    assert _about("TOMLFile", "Represents a TOML file.") == "TOMLFile represents a TOML file."
    assert _about("f", "Coerce a value into a string.") == "f coerces a value into a string."
    assert _about("g", "Match the text.") == "g matches the text."
    assert _about("h", "Apply it") == "h applies it."
    # what reads as neither stays quoted after the name
    assert _about("X", "This class is deprecated.") is None
    assert _about("X", "Used by the parser.") is None
    assert _about("X", ":class:`Y` for the parser.") is None


def test_a_search_says_the_definition_each_match_is_in(port: tuple[ToolPort, Path]) -> None:
    p, _ = port
    found = _text(_call(p, "search_files", pattern="parse\\(", path="pkg")).splitlines()
    assert found == [
        'pkg/cli.py:6 (in main): print(parse("x"))',
        "pkg/parser.py:21 (in parse): def parse(text: str) -> Context:",
    ]
    assert _text(_call(p, "search_files", pattern="self.at", path="pkg/parser.py")) == (
        "pkg/parser.py:13 (in Context.__init__): self.at = 0\n"
        "pkg/parser.py:18 (in Context.left): return self.text[self.at:]")
    # a file that is not code: no definition (README's lines sit under headings only)
    assert _text(_call(p, "search_files", pattern="tiny parser", path="README.md")) == (
        "README.md:3: A tiny parser.")


def test_a_long_search_says_its_files_first(port: tuple[ToolPort, Path]) -> None:
    p, _ = port
    # given every line, the embedded model asked "Which files use Widget?" listed them one
    # by one until its token limit: past 12 lines in more than one file, the files come
    # first with their counts, then each file's first two lines
    assert _text(_call(p, "search_files", pattern="Widget", path="many")).splitlines() == [
        "20 lines in 2 files match: many/a.py (10), many/b.py (10). The first lines of each:",
        "many/a.py:1: w0 = Widget(0)", "many/a.py:2: w1 = Widget(1)",
        "many/b.py:1: w0 = Widget(0)", "many/b.py:2: w1 = Widget(1)"]
    # up to 12 lines, or one file: every line, as before
    assert len(_text(_call(p, "search_files", pattern="Widget", path="many/a.py")).splitlines(
        )) == 10
    assert len(_text(_call(p, "search_files", pattern="Widget\\([0-5]\\)", path="many")
                     ).splitlines()) == 12


def test_enclosing_is_the_innermost_definition() -> None:
    shape = outline("p.py", PARSER)
    assert [enclosing(shape, n) for n in (1, 3)] == [None, None]  # top level, a variable
    inner = enclosing(shape, 12)
    assert inner is not None and inner.qualname == "Context.__init__"
    outer = enclosing(shape, 9)
    assert outer is not None and outer.qualname == "Context"
