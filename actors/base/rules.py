"""Approval rules: which tool calls run without asking, and which never run (pure).

A rule is ``TOOL`` (every call of the tool) or ``TOOL: PREFIX``. The prefix is compared
with the call's *subject*, word by word, never character by character:

- ``run_command``: the words of ``command`` as the shell would split them (``shlex``), so
  ``run_command: git status`` matches ``git status -s`` and not ``git statusx``. A command
  with shell operators (``; & | < > ( ) $ `` `` and newlines, anywhere, quoted or not) or
  unbalanced quotes has no words: it never matches a prefix rule, since what it would run
  cannot be told from its first words (``git status; rm -rf ~``).
- any other tool with a ``path`` argument: the path's parts (``write_file: docs`` matches
  ``docs/a.md``, not ``docs2/a.md``); a path with a ``..`` part never matches.
- any other call: no subject; only ``TOOL`` rules match it.

:func:`verdict` decides: a matching deny rule wins over everything; then a matching allow
rule; else the person is asked. One more safeguard for deny prefix rules: a call that has
no subject (a command with shell operators) is never allowed by a plain ``TOOL`` rule when
a deny prefix rule exists for that tool, since the deny rule could not be checked; the
person is asked instead. A rule never loosens what a tool host itself refuses.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import shlex
from collections.abc import Iterable, Mapping
from functools import lru_cache
from pathlib import PurePosixPath
from typing import Any

__all__ = [
    "Rule",
    "RuleBook",
    "Verdict",
    "grant_for",
    "has_shell_operators",
    "host_allow",
    "parse_rule",
    "parse_rules",
    "subject",
    "unchecked",
    "verdict",
]

COMMAND_TOOL = "run_command"
_OPERATORS = re.compile(r"[;&|<>()$`\n\r]")
_TOOL = re.compile(r"[A-Za-z0-9_.\-]+")


class Verdict(enum.StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """``tool`` alone, or with the words (or path parts) a call's subject must start with."""

    tool: str
    prefix: tuple[str, ...] | None = None

    def __str__(self) -> str:
        if self.prefix is None:
            return self.tool
        joined = shlex.join(self.prefix) if self.tool == COMMAND_TOOL else "/".join(self.prefix)
        return f"{self.tool}: {joined}"

    def matches(self, tool: str, words: tuple[str, ...] | None) -> bool:
        if tool != self.tool:
            return False
        if self.prefix is None:
            return True
        return words is not None and words[: len(self.prefix)] == self.prefix


def has_shell_operators(command: str) -> bool:
    """True when ``command`` holds anything that makes the shell run more than its words."""
    return _OPERATORS.search(command) is not None


def _words(command: str) -> tuple[str, ...] | None:
    if has_shell_operators(command):
        return None
    try:
        words = tuple(shlex.split(command))
    except ValueError:  # unbalanced quotes
        return None
    return words or None


def _parts(path: str) -> tuple[str, ...] | None:
    parts = tuple(p for p in PurePosixPath(path).parts if p not in ("", "."))
    if not parts or ".." in parts:
        return None
    return parts


def subject(tool: str, arguments: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What a prefix rule is compared with: the command's words, the path's parts, or None."""
    if tool == COMMAND_TOOL:
        command = arguments.get("command")
        return _words(command) if isinstance(command, str) else None
    path = arguments.get("path")
    return _parts(path) if isinstance(path, str) else None


def parse_rule(text: str) -> Rule:
    """A rule from ``TOOL`` or ``TOOL: PREFIX`` (also ``TOOL:PREFIX``); ValueError says why."""
    if not isinstance(text, str):
        raise ValueError(f"a rule must be a string like \"run_command: git status\", got {text!r}")
    tool, colon, rest = text.partition(":")
    tool, rest = tool.strip(), rest.strip()
    if not _TOOL.fullmatch(tool):
        raise ValueError(
            f"rule {text!r}: {tool!r} is not a tool name; write TOOL or TOOL: PREFIX, "
            'e.g. "write_file" or "run_command: git status"'
        )
    if not colon:
        return Rule(tool)
    if not rest:
        raise ValueError(f"rule {text!r}: nothing after ':'; write {tool!r} for every call")
    prefix = _words(rest) if tool == COMMAND_TOOL else _parts(rest)
    if prefix is None:
        what = ("shell operators or unbalanced quotes" if tool == COMMAND_TOOL
                else "a '..' part")
        raise ValueError(f"rule {text!r}: the prefix has {what}, so it could never match")
    return Rule(tool, prefix)


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


def verdict(book: RuleBook, tool: str, arguments: Mapping[str, Any]) -> tuple[Verdict, Rule | None]:
    """What the rules say about one call, and the rule that said it (None: ask the person)."""
    words = subject(tool, arguments)
    for rule in book.deny:
        if rule.matches(tool, words):
            return Verdict.DENY, rule
    guarded = unchecked(book, tool, words)
    for rule in book.allow:
        if rule.matches(tool, words) and not (guarded and rule.prefix is None):
            return Verdict.ALLOW, rule
    return Verdict.ASK, None


def unchecked(book: RuleBook, tool: str, words: tuple[str, ...] | None) -> bool:
    """True when a deny prefix rule of ``tool`` exists that a call without a subject
    (``words`` None) could not be checked against: no plain rule may allow such a call."""
    return words is None and any(r.tool == tool and r.prefix is not None for r in book.deny)


def grant_for(book: RuleBook, tool: str, arguments: Mapping[str, Any]) -> Rule | None:
    """The rule an "allow for this session" or "always" answer grants for this call.

    ``run_command``: this command's words (so later calls with more arguments match too);
    None for a command with shell operators: it can only be allowed once. Other tools: the
    whole tool, unless a deny prefix rule of the tool could not be checked (``unchecked``).
    """
    words = subject(tool, arguments)
    if tool == COMMAND_TOOL:
        return None if words is None else Rule(tool, words)
    return None if unchecked(book, tool, words) else Rule(tool)


def host_allow(allow: Iterable[str], deny: Iterable[str]) -> tuple[str, ...]:
    """The ``--allow`` names a local tool host may be given: plain rules of tools that no deny
    rule names (those calls go through the session's :func:`verdict` instead)."""
    denied = {r.tool for r in parse_rules(deny)}
    return tuple(
        r.tool for r in parse_rules(allow) if r.prefix is None and r.tool not in denied
    )
