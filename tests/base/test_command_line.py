"""Reading what a command line runs: word splitting as sh does it, and the spellings of a
program that a deny rule must hold against, checked against a real /bin/sh."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.command_line import read_command, scan, split_words


@pytest.mark.parametrize(("command", "words"), [
    ("git status -s", ("git", "status", "-s")),
    ("  a   b  ", ("a", "b")),
    ("'a b' c", ("a b", "c")),
    ('"a \\" b" c', ('a " b', "c")),
    ('"a\\x"', ("a\\x",)),
    ("a\\ b", ("a b",)),
    ("r''m", ("rm",)),
    ("'' x", ("", "x")),
])
def test_words_are_split_as_sh_splits_them(command: str, words: tuple[str, ...]) -> None:
    assert split_words(command) == words
    printed = subprocess.run(["/bin/sh", "-c", f"printf '%s\\0' {command}"],
                             capture_output=True, check=True).stdout
    assert tuple(printed.decode().split("\0")[:-1]) == words  # the real shell agrees


@pytest.mark.parametrize("command", ["a 'b", 'a "b', "a\\"])
def test_unbalanced_quotes_have_no_words(command: str) -> None:
    assert split_words(command) is None
    assert read_command(command).unclear == "its quotes are unbalanced"


def test_operators_split_simple_commands_outside_quotes_only() -> None:
    found = scan("a 'x;y' | b \"c&d\" > f; e")
    assert found is not None
    assert [s.words for s in found[0]] == [("a", "x;y"), ("b", "c&d"), ("f",), ("e",)]
    assert found[1] is False
    single, double = scan("echo '$HOME'"), scan('echo "$HOME"')
    assert single is not None and single[1] is False  # single quotes expand nothing
    assert double is not None and double[1] is True


@pytest.mark.timeout(60)
def test_a_huge_word_is_read_in_linear_time() -> None:
    """The issue's 400,000-character word took 4 s in the rules matcher (shlex builds each
    word a character at a time: quadratic). Ten times that is read here in well under a
    second; on the old matcher it would take about 400 s, past this test's hang guard.
    (The bound is a hang guard: speed is measured by scripts/bench_guards.py.)"""
    word = "a" * 4_000_000
    assert split_words(f"git {word}") == ("git", word)
    assert read_command(f"git '{word}'").runs == (("git", word),)


@pytest.mark.parametrize("spelling", [
    "rm {m}", "/usr/bin/env rm {m}", "\\rm {m}", "'r'm {m}", "env -i STUB=$STUB PATH=$STUB rm {m}",
    "command rm {m}", "nice -n 5 rm {m}", "timeout -s KILL 5 rm {m}", "sh -c 'rm {m}'",
    "eval 'rm {m}'", "echo {m} | xargs -n 1 rm", "true; rm {m}", "stdbuf -o0 rm {m}",
    "find {m} -exec rm {{}} +", "FOO=1 rm {m}", "if rm {m}; then :; fi",
])
def test_each_recognised_spelling_really_runs_the_program(tmp_path: Path, spelling: str) -> None:
    """Run by a real /bin/sh with a stub ``rm`` first on the PATH: the stub runs, and the
    reading names ``rm`` among what the command runs."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "rm").write_text('#!/bin/sh\necho ran >> "$STUB/../ran"\n')
    (stub / "rm").chmod(0o755)
    marker = tmp_path / "target"
    marker.write_text("x")
    command = spelling.format(m=shlex.quote(str(marker)))
    env = {"PATH": f"{stub}:{os.defpath}", "STUB": str(stub)}
    subprocess.run(["/bin/sh", "-c", command], env=env, cwd=tmp_path, check=False,
                   capture_output=True, timeout=30)
    assert (tmp_path / "ran").read_text().startswith("ran"), command
    assert any(run[0] == "rm" for run in read_command(command).runs), command


@given(st.text(max_size=200))
def test_reading_never_raises(command: str) -> None:
    reading = read_command(command)
    assert all(run and isinstance(run[0], str) for run in reading.runs)
