"""Approval rules: which tool calls run without asking, and which never run (pure).

A rule is ``TOOL`` (every call of the tool), ``TOOL: PREFIX`` or ``TOOL = EXACT``. The
prefix is compared with the call's *subject*, word by word, never character by character;
an exact rule matches a subject equal to it and nothing longer (what an "always" or "for
this session" answer grants: what the person saw, see :func:`grant_for`):

- ``run_command``: the words of ``command`` as the shell would split them, so
  ``run_command: git status`` matches ``git status -s`` and not ``git statusx``. A command
  with shell operators (``; & | < > ( ) $ `` `` and newlines, anywhere, quoted or not) or
  unbalanced quotes has no words: it matches no prefix or exact rule, since what it would
  run cannot be told from its first words (``git status; rm -rf ~``).
- any other tool with a ``path`` argument: the path's parts (``write_file: notes`` matches
  ``notes/a.md``, not ``notes2/a.md``); a path with a ``..`` part never matches.
- any other call: no subject; only ``TOOL`` rules match it.

:func:`verdict` decides: a matching deny rule wins over everything; then a matching allow
rule; else the person is asked. A deny rule of ``run_command`` holds against every spelling
of its words that :mod:`actors.base.command_line` recognises (``/bin/rm``, ``env rm``, ``sh -c
'rm x'``, ``git -C . push``, one command of several joined by ``;``): those are denied. A
call that may still run what a deny rule names without loopd being able to tell (the
rule's words found anywhere in the command, in order: ``python -c "...'git','push'..."``;
inline code; ``$`` or backquotes; ``git -c``) is never allowed by a rule: the person is
asked. And a call that writes where programs find code to run (:func:`protected`: ``.git``)
is asked for whatever the rules say. A rule never loosens what a tool host itself refuses.
"""

from __future__ import annotations

import dataclasses
import enum
import fnmatch
import re
import shlex
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Any

from actors.base.command_line import SHELL_OPERATORS, Reading, base, read_command, split_words

__all__ = [
    "PROTECTED",
    "Rule",
    "RuleBook",
    "Verdict",
    "doubt",
    "grant_for",
    "has_shell_operators",
    "parse_rule",
    "parse_rules",
    "protected",
    "protected_path",
    "subject",
    "verdict",
]

COMMAND_TOOL = "run_command"
_TOOL = re.compile(r"[A-Za-z0-9_.\-]+")
_SEPARATOR = re.compile(r"[:=]")
# Path parts where programs the person runs find code: a write there is asked for, always
# (git runs core.fsmonitor, core.pager, aliases and hooks from .git/config and .git/hooks:
# "git status" after such a write runs anything; a loopd.toml in the workspace could allow
# every call of the next loopd that reads it).
PROTECTED = frozenset({".git", "loopd.toml"})


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """``tool`` alone, or with the words (or path parts) a call's subject must start with
    (``exact``: must equal)."""

    tool: str
    prefix: tuple[str, ...] | None = None
    exact: bool = False

    def __str__(self) -> str:
        if self.prefix is None:
            return self.tool
        joined = shlex.join(self.prefix) if self.tool == COMMAND_TOOL else "/".join(self.prefix)
        return f"{self.tool} = {joined}" if self.exact else f"{self.tool}: {joined}"

    def matches(self, tool: str, words: tuple[str, ...] | None) -> bool:
        if tool != self.tool:
            return False
        if self.prefix is None:
            return True
        if words is None:
            return False
        return words == self.prefix if self.exact else words[: len(self.prefix)] == self.prefix

    def denies(self, reading: Reading) -> bool:
        """True when one invocation the command may start begins with this rule's words
        (its program by base name: ``/bin/rm`` is ``rm``)."""
        if self.prefix is None:
            return True
        want = (base(self.prefix[0]), *self.prefix[1:])
        return any(run[: len(want)] == want for run in reading.runs)

    def mentioned(self, reading: Reading) -> bool:
        """True when this rule's words appear among the command's atoms, in order (a glob
        atom stands for whatever it matches)."""
        if self.prefix is None:
            return True
        want = (base(self.prefix[0]), *self.prefix[1:])
        atoms = reading.atoms
        for start, atom in enumerate(atoms):
            if _same(atom, want[0]) and _in_order(want[1:], atoms[start + 1 :]):
                return True
        return False


def _same(atom: str, word: str) -> bool:
    return atom == word or (any(c in atom for c in "*?[") and fnmatch.fnmatchcase(word, atom))


def _in_order(wanted: tuple[str, ...], atoms: tuple[str, ...]) -> bool:
    i = 0
    for atom in atoms:
        if i == len(wanted):
            break
        if _same(atom, wanted[i]):
            i += 1
    return i == len(wanted)


def has_shell_operators(command: str) -> bool:
    """True when ``command`` holds anything that makes the shell run more than its words."""
    return SHELL_OPERATORS.search(command) is not None


def _parts(path: str) -> tuple[str, ...] | None:
    parts = tuple(p for p in PurePosixPath(path).parts if p not in ("", "."))
    if not parts or ".." in parts:
        return None
    return parts


def subject(tool: str, arguments: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What a prefix rule is compared with: the command's words, the path's parts, or None."""
    if tool == COMMAND_TOOL:
        command = arguments.get("command")
        return split_words(command) if isinstance(command, str) else None
    path = arguments.get("path")
    return _parts(path) if isinstance(path, str) else None


def protected(tool: str, arguments: Mapping[str, Any]) -> str:
    """Why a call that needs approval must be asked for whatever the rules say ("" if not):
    its ``path`` leads into a place where programs find code to run (:func:`protected_path`).
    The tool host decides the same on where the write lands (symlinks walked)."""
    path = arguments.get("path")
    if tool == COMMAND_TOOL or not isinstance(path, str):
        return ""
    return protected_path(path)


def protected_path(path: str) -> str:
    """Why a write to ``path`` must be asked for every time ("" if not): a part of it is
    :data:`PROTECTED` (``.git`` at any depth, a ``loopd.toml``), in any letter case (a
    file system that ignores case finds ``.GIT/config`` where git reads ``.git/config``)."""
    hit = next((p for p in path.split("/") if p.casefold() in PROTECTED), None)
    if hit is None:
        return ""
    where = f"is inside {hit}" if hit.casefold() == ".git" else f"is a {hit}"
    return (f"{path} {where}, where programs find what to run (a write there can make an "
            "allowed command run anything), so it is asked for every time")


def parse_rule(text: str) -> Rule:
    """A rule from ``TOOL``, ``TOOL: PREFIX`` (also ``TOOL:PREFIX``) or ``TOOL = EXACT``;
    ValueError says why."""
    if not isinstance(text, str):
        raise ValueError(f"a rule must be a string like \"run_command: git status\", got {text!r}")
    found = _SEPARATOR.search(text)
    tool = (text if found is None else text[: found.start()]).strip()
    rest = "" if found is None else text[found.end() :].strip()
    if not _TOOL.fullmatch(tool):
        raise ValueError(
            f"rule {text!r}: {tool!r} is not a tool name; write TOOL, TOOL: PREFIX or "
            'TOOL = EXACT, e.g. "write_file" or "run_command: git status"'
        )
    if found is None:
        return Rule(tool)
    mark = found.group()
    if not rest:
        raise ValueError(f"rule {text!r}: nothing after {mark!r}; write {tool!r} for every call")
    prefix = split_words(rest) if tool == COMMAND_TOOL else _parts(rest)
    if prefix is None:
        what = ("shell operators or unbalanced quotes" if tool == COMMAND_TOOL
                else "a '..' part")
        raise ValueError(f"rule {text!r}: the prefix has {what}, so it could never match")
    return Rule(tool, prefix, exact=mark == "=")


def parse_rules(texts: Iterable[str]) -> tuple[Rule, ...]:
    return tuple(parse_rule(t) for t in texts)


@lru_cache(maxsize=64)
def _cached(texts: tuple[str, ...]) -> tuple[Rule, ...]:
    return parse_rules(texts)


@dataclasses.dataclass(frozen=True, slots=True)
class RuleBook:
    """The allow and deny rules in force: the config's, the rules file's, the command's."""

    allow: tuple[Rule, ...] = ()
    deny: tuple[Rule, ...] = ()

    @staticmethod
    def of(allow: Iterable[str], deny: Iterable[str] = ()) -> RuleBook:
        """From rule texts (already checked: the config refuses bad ones at load)."""
        return RuleBook(_cached(tuple(allow)), _cached(tuple(deny)))

    def __add__(self, other: RuleBook) -> RuleBook:
        return RuleBook(self.allow + other.allow, self.deny + other.deny)


def _reading(tool: str, arguments: Mapping[str, Any]) -> Reading | None:
    command = arguments.get("command")
    if tool != COMMAND_TOOL or not isinstance(command, str):
        return None
    return read_command(command)


def verdict(book: RuleBook, tool: str, arguments: Mapping[str, Any]) -> tuple[Verdict, Rule | None]:
    """What the rules say about one call, and the rule that said it (None: ask the person)."""
    words = subject(tool, arguments)
    deny = [r for r in book.deny if r.tool == tool]
    reading = _reading(tool, arguments) if any(r.prefix is not None for r in deny) else None
    for rule in deny:
        if rule.matches(tool, words) or (reading is not None and rule.denies(reading)):
            return Verdict.DENY, rule
    if protected(tool, arguments) or doubt(book, tool, words, reading):
        return Verdict.ASK, None
    for rule in book.allow:
        if rule.matches(tool, words):
            return Verdict.ALLOW, rule
    return Verdict.ASK, None


def doubt(book: RuleBook, tool: str, words: tuple[str, ...] | None,
          reading: Reading | None) -> str:
    """Why no rule may allow this call (it may run what a deny rule of ``tool`` names, and
    loopd cannot show it does not), or "" when nothing stands in the way."""
    deny = [r for r in book.deny if r.tool == tool and r.prefix is not None]
    if not deny:
        return ""
    if reading is None:  # a call of another tool: only its path can be checked
        return "a deny rule of the tool cannot check it" if words is None else ""
    if reading.unclear:
        return f"loopd cannot tell what it runs: {reading.unclear}"
    named = next((r for r in deny if r.mentioned(reading)), None)
    return f'it names what the rule "{named}" denies' if named is not None else ""


def grant_for(book: RuleBook, tool: str, arguments: Mapping[str, Any]) -> Rule | None:
    """The rule an "allow for this session" or "always" answer grants for this call: what
    the person saw, and nothing that could add effects.

    ``run_command``: exactly this command (``run_command = find . -name '*.txt'``, which
    does not allow ``find . -name '*.txt' -delete``); None for a command with shell
    operators. A tool with a ``path``: exactly this path. Other tools: the whole tool. None
    (the answer counts once) when a deny rule could not check the call or the call writes a
    protected place (:func:`protected`).
    """
    words = subject(tool, arguments)
    if protected(tool, arguments) or doubt(book, tool, words, _reading(tool, arguments)):
        return None
    if tool == COMMAND_TOOL or "path" in arguments:
        return None if words is None else Rule(tool, words, exact=True)
    return Rule(tool)
