"""The standard tools: files in the workspace, a shell command, a web fetch, and echo.

One :class:`StandardTools` provider runs any subset of them inside a tool host. Every path
is walked by :class:`~actors.tools.protocol.workspace.Workspace`, so a path that leads
outside the workspace (``../``, an absolute path, a symlink pointing out, a directory
swapped for one mid-call), a FIFO or device, or a write to a file with other hard links is
``Denied`` with the reason. ``search_files`` uses RE2 (google-re2), whose matching time is
linear in the text: no pattern can stall a worker.
Outputs are cut at ``max_output_bytes`` with a note saying how much was cut and how to read
on. ``write_file`` and ``run_command`` change things, so their specs say
``needs_approval``; the host answers ``PendingApproval`` unless its ``--allow`` names them
or the call comes approved (the session's rules or the person said yes: actors.approval.gate).
``fetch_url``'s results come from outside and are marked ``untrusted``.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import re2

from actors.base.errors import UsageError
from actors.base.rules import protected_path
from actors.base.textcut import cut
from actors.tools.protocol.provider import APPROVED_LANDING
from actors.tools.protocol.spec import ToolSpec
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.protocol.wire import Answer, Denied, Failed, PendingApproval, Result
from actors.tools.protocol.workspace import SKIP_DIRS, Opened, Refused, Workspace, kind_of
from actors.tools.providers.code import (
    Definition,
    Outline,
    describe,
    enclosing,
    outline,
    signature,
)
from actors.tools.providers.command import run_shell
from actors.tools.providers.sandbox import Sandbox, config_present, remove_new_config
from actors.tools.providers.web import fetch_url

__all__ = ["StandardTools"]


_MAX_MATCHES = 200
_LINES = 200  # lines one read by line range shows at most
_MAX_DEFINITIONS = 30
_NAME = re.compile(r"[A-Za-z_$][\w$]*(?:\.[A-Za-z_$][\w$]*)*")
_MAX_SEARCHED = 8 * 1024 * 1024  # a file larger than this is not searched


class StandardTools:
    """A ToolProvider running some of the standard tools (see :data:`STANDARD_SPECS`)."""

    def __init__(
        self,
        names: list[str],
        *,
        workspace: Workspace,
        max_output_bytes: int,
        sandbox: Sandbox | None = None,
    ) -> None:
        unknown = [n for n in names if n not in STANDARD_SPECS]
        if unknown:
            raise UsageError(
                f"unknown standard tool(s) {', '.join(unknown)}; known: {', '.join(STANDARD_SPECS)}"
            )
        self.names = list(dict.fromkeys(names))
        self.workspace = workspace
        self.max_output = max_output_bytes
        self.sandbox = sandbox if sandbox is not None else Sandbox()
        self._env = self.sandbox.environment(os.environ)
        self._bwrap = ""  # the bwrap that passed Sandbox.check (checked again until one does)
        self._run: dict[str, Callable[[Mapping[str, Any], float, threading.Event], Answer]] = {
            "read_file": self._read_file,
            "outline_file": self._outline_file,
            "find_definition": self._find_definition,
            "list_dir": self._list_dir,
            "search_files": self._search_files,
            "write_file": self._write_file,
            "run_command": self._run_command,
            "fetch_url": self._fetch_url,
            "echo": lambda a, _t, _c: Result(content=str(a["text"])),
        }

    def specs(self) -> list[ToolSpec]:
        specs = [STANDARD_SPECS[n] for n in self.names]
        return [self._sandboxed(s) if s.name == "run_command" else s for s in specs]

    def _sandboxed(self, spec: ToolSpec) -> ToolSpec:
        """run_command's description says what its sandbox allows (so the model knows)."""
        if self.sandbox.mode == "none":
            return spec
        net = "it has the network" if self.sandbox.network else "it has no network"
        return dataclasses.replace(
            spec,
            description=f"{spec.description} It runs in a sandbox: only the workspace and a "
            f"private /tmp can be written, {net}, and what it starts ends with it.",
        )

    def run(
        self, tool: str, arguments: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        if tool not in self.names:
            return Failed(message=f"this host does not run {tool}")
        try:
            return self._run[tool](arguments, timeout_s, cancel)
        except Refused as e:
            return Denied(reason=str(e))
        except FileNotFoundError:
            return Failed(
                message=f"{tool}: {arguments.get('path', '')!r} does not exist in the workspace"
            )
        except IsADirectoryError:
            return Failed(
                message=f"{tool}: {arguments.get('path', '')!r} is a directory, not a file"
            )
        except NotADirectoryError:
            return Failed(message=f"{tool}: {arguments.get('path', '')!r} is not a directory")
        except PermissionError as e:
            return Failed(message=f"{tool}: permission denied: {e.strerror}")

    def close(self) -> None:
        pass

    # --- the tools ---------------------------------------------------------------------

    def _cut(self, data: bytes, total: int, start: int = 0) -> str:
        text, size, _ = cut(data, self.max_output, "bytes")
        shown_end = start + size
        if shown_end < total:
            text += (
                f"\n[cut: showing bytes {start} to {shown_end} of {total}; "
                f"read on with offset={shown_end}]"
            )
        return text

    def _read_file(self, a: Mapping[str, Any], _t: float, _c: threading.Event) -> Answer:
        if "start_line" in a or "end_line" in a:
            return self._read_lines(a)
        offset = int(a.get("offset", 0))
        opened = self.workspace.open_read(str(a["path"]))
        try:
            total = os.fstat(opened.fd).st_size
            data = os.pread(opened.fd, self.max_output + 1, offset)
        finally:
            opened.close()
        return Result(content=self._cut(data, total, offset))

    def _read_lines(self, a: Mapping[str, Any]) -> Answer:
        """Lines ``start_line`` to ``end_line`` (at most :data:`_LINES` of them), each after
        its number; read line by line, so a range near the start of a huge file is quick."""
        start = int(a.get("start_line", 1))
        end = int(a.get("end_line", start + _LINES - 1))
        if end < start:
            return Failed(message=f"read_file: end_line {end} is before start_line {start}")
        last = min(end, start + _LINES - 1)
        opened = self.workspace.open_read(str(a["path"]))
        shown: list[str] = []
        more = False
        number = 0
        with os.fdopen(opened.fd, "rb") as f:
            if b"\0" in f.read(8192):
                return Failed(message=f"read_file: {_printable(opened.rel)} is not a text file "
                              "(it holds binary data); read it by offset without lines")
            f.seek(0)
            for number, raw in enumerate(f, start=1):
                if number > last:
                    more = True
                    break
                if number >= start:
                    shown.append(f"{number}: {raw.decode('utf-8', 'replace').rstrip()[:2000]}")
        if not shown:
            return Failed(message=f"read_file: {_printable(opened.rel)} has {number} lines; "
                          f"start_line {start} is past its end")
        text = "\n".join(shown)
        if more:
            text += f"\n[more lines follow; read on with start_line={last + 1}]"
        data = text.encode()
        return Result(content=self._cut(data, len(data)))

    def _text_of(self, path: str) -> tuple[str, str] | Failed:
        """A file's path (as the workspace names it) and its text; Failed for a file over
        :data:`_MAX_SEARCHED` or one that holds binary data."""
        opened = self.workspace.open_read(path)
        try:
            size = os.fstat(opened.fd).st_size
            if size > _MAX_SEARCHED:
                return Failed(message=f"{_printable(opened.rel)} is {size} bytes, too big to "
                              f"read whole (at most {_MAX_SEARCHED}); read it by lines or "
                              "search it")
            lines = _text_lines(opened)
            if not lines and size:
                return Failed(message=f"{_printable(opened.rel)} is not a text file (it holds "
                              "binary data)")
        finally:
            opened.close()
        return _printable(opened.rel), "\n".join(line for _, line in lines)

    def _outline_file(self, a: Mapping[str, Any], _t: float, _c: threading.Event) -> Answer:
        found = self._text_of(str(a["path"]))
        if isinstance(found, Failed):
            return Failed(message=f"outline_file: {found.message}")
        rel, text = found
        shape = outline(rel, text)
        lines = text.splitlines()
        head = f"{rel}: {shape.lines} lines" + (f" ({shape.note})" if shape.note else "")
        if not shape.definitions:
            return Result(content=f"{head}; no definitions found: read it with read_file")
        rows = [head]
        for d in shape.definitions:
            first = d.name if d.kind == "heading" else signature(lines, d) or describe(d)
            doc = f"  # {d.doc}" if d.doc else ""
            rows.append(f"{'  ' * d.depth}{d.line}-{d.end}: {first}{doc}")
        data = "\n".join(rows).encode()
        return Result(content=self._cut(data, len(data)))

    def _find_definition(
        self, a: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        wanted = str(a["name"]).strip().removesuffix("()")
        if not _NAME.fullmatch(wanted):
            return Failed(message=f"find_definition: {wanted[:80]!r} is not a name (letters, "
                          "digits and _, parts joined by dots: Parser or Parser.parse); "
                          "search_files finds any text")
        last = wanted.rsplit(".", 1)[-1]
        path = str(a.get("path", "."))
        try:
            top = self.workspace.open_dir(path)
            files: Iterable[Opened] = self.workspace.files(top, SKIP_DIRS)
        except NotADirectoryError:
            top = self.workspace.open_read(path)
            files = [top]
        deadline = time.monotonic() + timeout_s * 0.9
        exact: list[str] = []
        alike: list[str] = []
        note = ""
        try:
            for file in files:
                if cancel.is_set() or time.monotonic() > deadline:
                    note = "\n[stopped: the time limit was reached; look in a smaller directory]"
                    break
                lines = _text_lines(file)
                text = "\n".join(line for _, line in lines)
                if last.lower() not in text.lower():
                    continue
                rel = _printable(file.rel)
                body = text.splitlines()
                for d in outline(rel, text).definitions:
                    if d.kind == "heading" or d.name.lower() != last.lower():
                        continue
                    same = d.name == last and (d.qualname == wanted or d.qualname.endswith(
                        f".{wanted}") or "." not in wanted)
                    (exact if same else alike).append(_defined(rel, body, d))
                if len(exact) >= _MAX_DEFINITIONS:
                    note = f"\n[stopped at {_MAX_DEFINITIONS} definitions; give a path]"
                    break
        finally:
            top.close()
        if exact:
            return Result(content="\n".join(exact[:_MAX_DEFINITIONS]) + note)
        if alike:
            return Result(content=f"no definition of {wanted} itself; these differ in case or "
                          "in the outer name:\n" + "\n".join(alike[:_MAX_DEFINITIONS]) + note)
        where = "the workspace" if path.strip("./") == "" else path
        return Result(content=f"{wanted} is not defined anywhere in {where}: no class, "
                      f"function or variable there has that name.{note}")

    def _list_dir(self, a: Mapping[str, Any], _t: float, _c: threading.Event) -> Answer:
        path = str(a.get("path", "."))
        try:
            opened = self.workspace.open_dir(path)
        except NotADirectoryError:  # a file named as the path: its line, as `ls FILE` gives
            file = self.workspace.open_read(path)
            try:
                size = os.fstat(file.fd).st_size
            finally:
                file.close()
            return Result(content=f"{_printable(file.rel)}  {size}")
        lines = []
        try:
            with os.scandir(opened.fd) as it:
                entries = sorted(it, key=lambda e: e.name)
            for entry in entries:
                name = _printable(entry.name)
                try:
                    st = entry.stat(follow_symlinks=False)
                    if entry.is_symlink():
                        target = os.readlink(entry.name, dir_fd=opened.fd)
                        lines.append(f"{name} -> {_printable(target)}")
                    elif entry.is_dir(follow_symlinks=False):
                        lines.append(f"{name}/")
                    elif entry.is_file(follow_symlinks=False):
                        lines.append(f"{name}  {st.st_size}")
                    else:
                        lines.append(f"{name}  ({kind_of(st.st_mode)})")
                except FileNotFoundError:  # removed while listed
                    continue
        finally:
            opened.close()
        text = "\n".join(lines) if lines else "(empty directory)"
        data = text.encode()
        return Result(content=self._cut(data, len(data)))

    def _search_files(
        self, a: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        pattern = _compile(str(a["pattern"]))
        if isinstance(pattern, Failed):
            return pattern
        path = str(a.get("path", "."))
        try:
            top = self.workspace.open_dir(path)
        except NotADirectoryError:  # a file named as the path: search that file
            return self._search_one(pattern, self.workspace.open_read(path))
        deadline = time.monotonic() + timeout_s * 0.9
        found = _Found(self.max_output)
        try:
            for file in self.workspace.files(top, SKIP_DIRS):
                if cancel.is_set() or time.monotonic() > deadline:
                    found.note = ("[stopped: the time limit was reached; search a smaller "
                                  "directory]")
                    break
                if found.scan(pattern, file):
                    break
        finally:
            top.close()
        return found.result()

    def _search_one(self, pattern: re2._Regexp[str], file: Opened) -> Answer:
        found = _Found(self.max_output)
        try:
            found.scan(pattern, file)
        finally:
            file.close()
        return found.result()

    def landing(self, tool: str, arguments: Mapping[str, Any]) -> tuple[str, str]:
        """Where a ``write_file`` would land (every symlink walked) and why that place is
        protected; ("", "") for other tools."""
        if tool != "write_file" or tool not in self.names:
            return "", ""
        landing = self.workspace.landing(str(arguments["path"]))
        return landing, protected_path(landing)

    def _write_file(self, a: Mapping[str, Any], _t: float, _c: threading.Event) -> Answer:
        data = str(a["content"]).encode("utf-8", "surrogateescape")
        path = str(a["path"])
        expect = APPROVED_LANDING.get()

        def guard(rel: str, leaf: bool) -> None:
            """Stop before a directory is made or the file opened anywhere the call was
            not approved for (the host checked the landing; a symlink may have changed)."""
            if expect is None:
                if protected_path(rel):
                    raise _Unapproved(rel)
            elif not (rel == expect if leaf else expect.startswith(rel + "/")):
                raise _Unapproved(rel)

        try:
            opened = self.workspace.open_write(path, guard)
        except _Unapproved as e:
            landing = e.rel
            with contextlib.suppress(Refused, OSError):
                landing = self.workspace.landing(path)
            return PendingApproval(
                prompt=f"Allow write_file to write {landing} (asked as {path!r})? "
                f"{protected_path(landing)}".rstrip(),
                landing=landing, protected=protected_path(landing))
        with os.fdopen(opened.fd, "wb") as f:
            f.write(data)
        return Result(content=f"wrote {len(data)} bytes to {_printable(opened.rel)}")

    def _run_command(
        self, a: Mapping[str, Any], timeout_s: float, cancel: threading.Event
    ) -> Answer:
        if self.sandbox.mode == "bwrap" and not self._bwrap:
            why = self.sandbox.check(os.environ, self.workspace.root)
            if why:
                return Failed(message=why)
            self._bwrap = self.sandbox.bwrap(os.environ) or ""
        limit = min(float(a.get("timeout_s", timeout_s)), timeout_s)
        bounds = self.sandbox.bounds
        launch = self.sandbox.launch(limit) if self.sandbox.mode == "bwrap" else None
        had_config, made = config_present(self.workspace.root), ""
        try:
            out = run_shell(
                self.sandbox.argv(self._bwrap, str(a["command"]), self.workspace.root, launch),
                cwd=self.workspace.root,
                env=self._env,
                timeout_s=limit,
                max_output=self.max_output,
                cancel=cancel,
                pass_fds=launch.pass_fds() if launch else (),
                started=(lambda: launch.bound(min(limit, 30.0))) if launch else None,
            )
        finally:
            if launch is not None:
                launch.close()
                made = remove_new_config(self.workspace.root, had_config)
        text = out.output.decode("utf-8", "replace")
        if out.stopped == "refused":
            return Failed(message=f"run_command: {out.why}")
        if out.stopped == "timeout":
            return Failed(
                message=f"run_command timed out after {limit:g} s; the command and every process "
                f"it started were killed. Its output until then (last 2000 characters):\n"
                f"{text[-2000:]}"
            )
        if out.stopped == "cancelled":
            return Failed(
                message="run_command was cancelled; the command and its processes were killed"
            )
        note = f"\n[output cut: {out.dropped} more bytes not shown]" if out.dropped else ""
        if self.sandbox.mode == "bwrap" and (bound := bounds.stopped_by(out.exit_code, text,
                                                                         limit, launch)):
            note += f"\n[sandbox bound: {bound}]"
        if made:
            note += f"\n[sandbox: {made}]"
        return Result(content=f"exit code: {out.exit_code}\n{text}{note}")

    def _fetch_url(self, a: Mapping[str, Any], timeout_s: float, cancel: threading.Event) -> Answer:
        return fetch_url(
            str(a["url"]), timeout_s=timeout_s, max_output=self.max_output, cancel=cancel
        )


def _defined(rel: str, body: list[str], d: Definition) -> str:
    """One definition as find_definition answers it: what its docstring says, as a sentence
    about the name (:func:`_about`), then its first line and place. Given ``path:lines:
    class TOMLFile:  # Represents a TOML file.`` (or the docstring in any other place of the
    line), the embedded model answered "What is the class TOMLFile for?" with the place
    alone."""
    first = (signature(body, d) or describe(d)).removesuffix(":").rstrip()
    place = f"It is {first} in {rel}, lines {d.line}-{d.end}."
    if not d.doc:
        return place
    about = _about(d.name, d.doc)
    return f"{about} {place}" if about else f'{d.name}: "{d.doc}" {place}'


def _about(name: str, doc: str) -> str | None:
    """A docstring said as a sentence about ``name``: one that starts with a verb in the
    third person as it is ("Represents a TOML file." -> "TOMLFile represents a TOML
    file."), an imperative one in the third person ("Coerce a value." -> "f coerces a
    value."), a noun phrase after "is", said to be the docstring's ("Configuration for
    limits." -> "Limits is configuration for limits (its docstring)."). Quoted after the
    name ("Limits: "Configuration ...""), the 0.5B model answered "What is the class Limits
    for?" with the place; without "(its docstring)", the 1.5B did. None: a docstring that
    reads as neither ("This class ...", "Used by ...")."""
    word, _, rest = doc.partition(" ")
    text = doc.rstrip(".")
    if _VERB.fullmatch(word) and rest:
        return f"{name} {word.lower()} {rest.rstrip('.')}."
    if word.lower() in _IMPERATIVE and rest:
        return f"{name} {_third_person(word.lower())} {rest.rstrip('.')}."
    if not word[:1].isalpha() or word.rstrip(",:;").lower() in _NOT_A_NOUN:
        return None
    plain = word[:1].isupper() and (word[1:].islower() or len(word) == 1)  # An, A (not HTTP)
    return f"{name} is {text[:1].lower() + text[1:] if plain else text} (its docstring)."


# a docstring's first word as a verb in the third person: Represents, Parses, Does (not
# This, Its, Was, Thus, Various, Class, Process)
_VERB = re.compile(r"(?!(?:This|Its|Was)$)[A-Z][a-z]+[^su\W]s")
# a docstring's first word as an imperative (PEP 257's "Return the ...")
_IMPERATIVE_WORDS = """
add append apply build call check clear close coerce collect compare compute construct convert
copy create decode delete determine dump emit encode ensure extract fetch filter find format
generate get give handle initialise initialize insert iterate join load look make map mark
match merge normalise normalize open parse print process produce raise read register remove
render replace reset resolve return run save send serialise serialize set sort split start
stop store strip take test transform update validate wrap write yield
"""
_IMPERATIVE = frozenset(_IMPERATIVE_WORDS.split())
# first words after which "X is ..." does not read as a sentence
_NOT_A_NOUN = frozenset({"this", "these", "that", "it", "its", "used", "see", "note", "deprecated",
                         "internal", "todo", "xxx", "if", "when", "for", "called", "should",
                         "must", "do", "does", "is", "are", "was", "has", "have", "can", "may"})


def _third_person(verb: str) -> str:
    """``verb`` in the third person singular: return -> returns, match -> matches."""
    if verb.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


class _Unapproved(Exception):
    """A write about to reach a place it was not approved for (``rel``)."""

    def __init__(self, rel: str) -> None:
        super().__init__(rel)
        self.rel = rel


def _printable(name: str) -> str:
    """A file name as text the wire can carry (undecodable bytes shown as U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _compile(pattern: str) -> re2._Regexp[str] | Failed:
    """The pattern compiled by RE2 (linear time, so no pattern can stall the host); smart
    case, as ripgrep's ``--smart-case``: a pattern with no capital letter of its own (an
    escape such as ``\\S`` or ``\\p{Lu}`` is not one) matches either case, so "grace lee"
    finds "Grace Lee" (the small model writes its search words in lower case)."""
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = _has_capital(pattern)
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else e
        return Failed(
            message=f"search_files: the pattern is not a valid regular expression: {why} "
            "(RE2 syntax: like Python's, but without backreferences or lookaround)"
        )


_ESCAPES = re.compile(r"\\(?:[pP]\{[^}]*\}|.)", re.DOTALL)


def _has_capital(pattern: str) -> bool:
    """Whether the pattern has a capital letter outside its escapes."""
    return any(c.isupper() for c in _ESCAPES.sub("", pattern))


# Files whose matches say the definition they are in (search_files).
_CODE = (".py", ".pyi", ".js", ".mjs", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".kt",
         ".swift", ".scala", ".rb", ".php", ".lua", ".sh", ".c", ".h", ".cc", ".cpp", ".hpp",
         ".cs", ".pl", ".ex", ".exs")


class _Found:
    """A search's matching lines, up to _MAX_MATCHES of them or ``limit`` bytes of output."""

    def __init__(self, limit: int) -> None:
        self.files: dict[str, list[str]] = {}  # each file's matching lines, in order
        self.matched = 0
        self.note = ""  # why the search stopped early, if it did
        self._size, self._limit = 0, limit

    def scan(self, pattern: re2._Regexp[str], file: Opened) -> bool:
        """Add ``file``'s matching lines; True when the output is full (a note says so)."""
        lines = _text_lines(file)
        header = _csv_header(file.rel, lines)
        shape: Outline | None = None
        for line_no, line in lines:
            if pattern.search(line):
                shown = _with_columns(header, line) if header and line_no > 1 else line.strip()
                where = ""
                if file.rel.endswith(_CODE):  # the definition the line is in, read once
                    shape = shape or outline(file.rel, "\n".join(t for _, t in lines))
                    inside = enclosing(shape, line_no)
                    where = f" (in {inside.qualname})" if inside else ""
                entry = f"{_printable(file.rel)}:{line_no}{where}: {shown[:200]}"
                self.files.setdefault(_printable(file.rel), []).append(entry)
                self.matched += 1
                self._size += len(entry) + 1
                if self.matched >= _MAX_MATCHES or self._size > self._limit:
                    self.note = f"[stopped at {self.matched} matches; narrow the pattern or path]"
                    return True
        return False

    def result(self) -> Result:
        """Every matching line; past :data:`_GROUP_AT` of them in more than one file, the
        files first (with how many lines each) and only each file's first
        :data:`_PER_FILE`: given 40 lines, the embedded model asked "Which files use X?"
        listed the lines one by one until its token limit."""
        if not self.matched:
            return Result(content=self.note or "no matches")
        shown = None if self.matched <= _GROUP_AT or len(self.files) < 2 else _PER_FILE
        rows = [] if shown is None else [
            f"{self.matched} lines in {len(self.files)} files match: "
            + ", ".join(f"{rel} ({len(v)})" for rel, v in self.files.items())
            + ". The first lines of each:"]
        for entries in self.files.values():
            rows += entries[:shown]
        return Result(content="\n".join([*rows, self.note] if self.note else rows))


_GROUP_AT = 12  # matching lines a search shows all of
_PER_FILE = 2  # lines of each file a longer search shows


def _csv_header(name: str, lines: list[tuple[int, str]]) -> list[str]:
    """A CSV file's column names (its first line), or [] for any other file."""
    if not name.lower().endswith(".csv") or not lines:
        return []
    return next(csv.reader([lines[0][1]]), [])


def _with_columns(header: list[str], line: str) -> str:
    """A CSV row with each value after its column's name ("name=Omar Haddad, city=Lyon"):
    a matched row alone does not say which value is which (the embedded model answered a
    city question from a row of name, team, year and city with a name of its own)."""
    row = next(csv.reader([line]), [])
    cells = [f"{h}={v}" for h, v in zip(header, row, strict=False)] + row[len(header):]
    return ", ".join(cells)


def _text_lines(file: Opened) -> list[tuple[int, str]]:
    """The lines of a text file (skipping files that look binary or are over 8 MiB)."""
    try:
        if os.fstat(file.fd).st_size > _MAX_SEARCHED:
            return []
        data = b""
        while chunk := os.read(file.fd, _MAX_SEARCHED + 1 - len(data)):
            data += chunk
            if len(data) > _MAX_SEARCHED:
                return []
    except OSError:
        return []
    if b"\0" in data[:8192]:
        return []
    text = data.decode("utf-8", "replace")
    return list(enumerate(text.splitlines(), start=1))
