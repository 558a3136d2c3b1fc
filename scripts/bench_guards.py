"""What the guards against hostile input cost, side by side with what they replaced.

- **rules**: reading a command with one long word (the review's 400,000 characters): loopd's
  splitter against ``shlex.split`` (the old one, quadratic: it builds each word one
  character at a time), and a whole ``verdict`` with a deny rule.
- **grammar**: the answer grammar of the standard tools built, against the same grammar
  taken from the cache (what every request after a session's first pays); and the grammar's
  size for N optional properties at two N (linear: the ratio is N's).
- **escaping** (and the rules file): what showing control characters as text costs per
  printed line: the
  function alone on a plain line and on one with escape sequences, and a line printed
  through loopd's console against rich's own (to a file, no terminal); and the stat of the
  rules file every approval decision makes, against reading it.
- **landing**: where a write lands, walked (every symlink followed, by descriptors) as the
  tool host does before every call that needs approval, against the words-only check it
  replaced (``protected`` on the path as written, which a symlink fooled): a plain path
  five directories deep, and one through a link in a parent directory and a link at the
  end.
- **sandbox**: ``run_command true`` through bubblewrap with its bounds set (``--block-fd``,
  prlimit, a memory cgroup, a pids cgroup as root), against the same sandbox without them.
  Skipped where bubblewrap cannot run.
"""

from __future__ import annotations

import io
import os
import shlex
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from actors.approval.rulesfile import RuleStore, load_rules
from actors.base.command_line import split_words
from actors.base.rules import RuleBook, protected, verdict
from actors.cli.terminal import SafeConsole, visible
from actors.session.smallmodel.grammar import build_grammar, cached_grammar
from actors.tools.protocol.standard_specs import STANDARD_SPECS
from actors.tools.protocol.workspace import Workspace
from actors.tools.providers.command import run_shell
from actors.tools.providers.sandbox import Sandbox
from actors.tools.registry import META_TOOLS

__all__ = ["run"]

WORD = 400_000  # characters of the long word
GRAMMAR_N = 200  # builds timed
PROPS = (40, 400)  # optional properties, two sizes (under the cap)
COMMANDS = 20  # run_command calls timed, each way
LINES = 20_000  # lines escaped / printed, each way
WALKS = 5_000  # landings walked, each way
SMOKE = {"WORD": 2_000, "GRAMMAR_N": 3, "PROPS": (5, 50), "COMMANDS": 2, "LINES": 20,
         "WALKS": 20}


def _best(fn: Callable[[], object], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _rules() -> list[dict[str, Any]]:
    command = "git " + "a" * WORD
    book = RuleBook.of(["run_command: git"], ["run_command: rm", "run_command: git push"])
    new = _best(lambda: split_words(command), 3)
    old = _best(lambda: shlex.split(command), 1)
    whole = _best(lambda: verdict(book, "run_command", {"command": command}), 3)
    return [
        {"name": f"split a {WORD:,}-character word", "value": new * 1000, "unit": "ms",
         "ratio": new / old, "note": f"shlex.split (before): {old * 1000:,.0f} ms"},
        {"name": "verdict on it (deny rules read every spelling)", "value": whole * 1000,
         "unit": "ms", "ratio": whole / old, "note": "against shlex.split alone"},
    ]


def _grammar() -> list[dict[str, Any]]:
    offered = tuple(META_TOOLS)
    registry = [(s.name, s.parameters) for s in STANDARD_SPECS.values()]
    built = _best(lambda: build_grammar(offered, registry), GRAMMAR_N)
    cached_grammar(offered, registry)
    hit = _best(lambda: cached_grammar(offered, registry), GRAMMAR_N)

    def size(n: int) -> int:
        schema = {"type": "object",
                  "properties": {f"p{i}": {"type": "integer"} for i in range(n)}}
        return len(build_grammar([], [("t", schema)]).grammar)

    small, large = (size(n) for n in PROPS)
    return [
        {"name": "grammar per request, cached", "value": hit * 1e6, "unit": "us",
         "ratio": hit / built, "note": f"built each time (before): {built * 1e6:,.0f} us"},
        {"name": f"grammar size, {PROPS[1]:,} optional properties", "value": large,
         "unit": "bytes", "ratio": large / small,
         "note": f"{PROPS[0]:,} give {small:,} (linear: ratio about {PROPS[1] // PROPS[0]})"},
    ]


def _escaping() -> list[dict[str, Any]]:
    plain = "the answer streams as it comes, a line of about eighty characters: 12,345 tokens"
    hostile = plain[:40] + "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[7;13H\x1b[1K\r" + plain[40:]

    def each(fn: Callable[[], object]) -> float:
        return _best(lambda: [fn() for _ in range(LINES)], 3) / LINES

    bare, marked = each(lambda: visible(plain)), each(lambda: visible(hostile))
    out = io.StringIO()
    ours = SafeConsole(file=out, soft_wrap=True, width=200)
    theirs = Console(file=out, soft_wrap=True, width=200)
    safe = each(lambda: ours.print(plain, markup=False, highlight=False))
    rich = each(lambda: theirs.print(plain, markup=False, highlight=False))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "rules.toml"
        path.write_text('allow = ["run_command: git status"]\ndeny = ["run_command: rm"]\n')
        store = RuleStore(path)
        checked = each(store.current)  # a stat per decision: the file unchanged
        reread = each(lambda: load_rules(path))  # what a changed file costs once
    return [
        {"name": "the rules file checked per decision", "value": checked * 1e6, "unit": "us",
         "ratio": checked / reread, "note": f"read again when changed: {reread * 1e6:.0f} us"},
        {"name": "visible() on a plain line", "value": bare * 1e6, "unit": "us",
         "note": f"{len(plain)} characters, nothing to show"},
        {"name": "visible() on a line with escape sequences", "value": marked * 1e6,
         "unit": "us", "ratio": marked / bare, "note": "OSC 52, a cursor move, erase-line, CR"},
        {"name": "a line printed through loopd's console", "value": safe * 1e6, "unit": "us",
         "ratio": safe / rich, "note": f"rich's own console: {rich * 1e6:.1f} us"},
    ]


def _landing() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / ".git" / "hooks").mkdir(parents=True)
        (root / "a" / "b" / "c" / "d").mkdir(parents=True)
        (root / "docs").mkdir()
        (root / "docs" / "hooks").symlink_to("../.git/hooks")
        (root / ".git" / "hooks" / "pre-commit").symlink_to("../config")
        ws = Workspace(root)
        plain, linked = "a/b/c/d/notes.md", "docs/hooks/pre-commit"
        assert ws.landing(linked) == ".git/config"

        def each(fn: Callable[[], object]) -> float:
            return _best(lambda: [fn() for _ in range(WALKS)], 3) / WALKS

        words = each(lambda: protected("write_file", {"path": linked}))
        walked = each(lambda: ws.landing(plain))
        through = each(lambda: ws.landing(linked))
    return [
        {"name": "where a write lands, a plain path 5 deep", "value": walked * 1e6,
         "unit": "us", "ratio": walked / words,
         "note": f"the words-only check (before, fooled by links): {words * 1e6:.1f} us"},
        {"name": "where a write lands, through 2 links", "value": through * 1e6, "unit": "us",
         "ratio": through / walked, "note": "a link in a parent directory and one at the end"},
    ]


def _sandbox() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as d:
        ws = Path(d)
        sandbox = Sandbox()
        if sandbox.check(os.environ, ws):
            return [{"name": "run_command through bwrap", "value": None, "unit": "",
                     "note": "skipped: bubblewrap cannot run here"}]
        bwrap = sandbox.bwrap(os.environ) or "bwrap"
        env = sandbox.environment(os.environ)

        def once(bounded: bool) -> float:
            launch = sandbox.launch(10) if bounded else None
            start = time.perf_counter()
            try:
                out = run_shell(sandbox.argv(bwrap, "true", ws, launch), cwd=ws, env=env,
                                timeout_s=10, max_output=1000,
                                pass_fds=launch.pass_fds() if launch else (),
                                started=(lambda: launch.bound(10)) if launch else None)
            finally:
                if launch is not None:
                    launch.close()
            assert out.exit_code == 0, out
            return time.perf_counter() - start

        with_bounds = statistics.median(once(True) for _ in range(COMMANDS))
        without = statistics.median(once(False) for _ in range(COMMANDS))
    return [{"name": "run_command true, bounded", "value": with_bounds * 1000, "unit": "ms",
             "ratio": with_bounds / without,
             "note": f"the same sandbox without bounds: {without * 1000:.1f} ms (median)"}]


def run() -> list[dict[str, Any]]:
    return [*_rules(), *_grammar(), *_escaping(), *_landing(), *_sandbox()]
