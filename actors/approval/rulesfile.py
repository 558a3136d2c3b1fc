"""The rules file (``tools.rules_file``; by default ``~/.config/loopd/rules.toml``, or under
``$XDG_CONFIG_HOME``).

It holds the "always" answers (allow) and the "never" ones (deny), and any rule a person
writes there by hand::

    allow = ["run_command: git status", "write_file: docs"]
    deny = ["run_command: rm"]

The syntax of each entry is that of ``tools.allow`` / ``tools.deny`` (:mod:`actors.base.rules`).
A missing file is no rules. A malformed one is a :class:`~actors.base.errors.RulesError` naming
the file and the line, so a typo never silently allows or denies anything. Saving an
"always" answer adds one entry to ``allow`` (a "never" answer one to ``deny``) with tomlkit,
so the person's comments and layout stay, and replaces the file atomically under a lock (two
loopd processes saving at once both keep their rule).
"""

from __future__ import annotations

import os
import threading
import tomllib
from pathlib import Path
from typing import Any

from actors.base.durable import locked, replace_file
from actors.base.errors import RulesError
from actors.base.rules import Rule, RuleBook, parse_rule

__all__ = ["RuleStore", "load_rules", "save_rule"]

_KEYS = ("allow", "deny")
_NEW = """\
# loopd approval rules: the "always" (allow) and "never" (deny) answers, and rules
# written by hand.
# Each entry is TOOL, "TOOL: PREFIX" (for run_command, the command's first words) or
# "TOOL = EXACT" (exactly that command or path: what an "always" or "never" answer saves).
# Deny beats allow. Syntax and meaning as tools.allow / tools.deny in loopd.toml.
allow = []
deny = []
"""


def load_rules(path: Path) -> RuleBook:
    """The rules in ``path`` (none when it does not exist); RulesError names the bad line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return RuleBook()
    except (OSError, UnicodeDecodeError) as e:
        raise RulesError(f"rules file {path}: cannot read it: {e}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # its message says "(at line N, column M)"
        where = str(e).replace("at end of document", f"at line {len(text.splitlines())}, "
                               "the end of the file: something opened was not closed")
        raise RulesError(f"rules file {path}: not valid TOML: {where}; fix that line") from None
    unknown = set(data) - set(_KEYS)
    if unknown:
        key = sorted(unknown)[0]
        raise RulesError(
            f"rules file {path}, line {_line_of(text, key)}: unknown key {key!r}; "
            "the file holds only allow = [...] and deny = [...]"
        )
    lists: dict[str, tuple[Rule, ...]] = {}
    for key in _KEYS:
        value = data.get(key, [])
        if not isinstance(value, list):
            raise RulesError(
                f"rules file {path}, line {_line_of(text, key)}: {key} must be a list of "
                f'rules, e.g. {key} = ["run_command: git status"]'
            )
        rules = []
        for entry in value:
            try:
                rules.append(parse_rule(entry))
            except ValueError as e:
                raise RulesError(
                    f"rules file {path}, line {_line_of(text, entry)}: {e}"
                ) from None
        lists[key] = tuple(rules)
    return RuleBook(lists["allow"], lists["deny"])


def _line_of(text: str, needle: Any) -> int | str:
    """The first line holding ``needle`` (a key or an entry), for the message."""
    if isinstance(needle, bool):
        token = str(needle).lower()
    else:
        token = needle if isinstance(needle, str) else str(needle)
    for number, line in enumerate(text.splitlines(), 1):
        if token in line:
            return number
    return "?"


def save_rule(path: Path, rule: Rule, *, deny: bool = False) -> None:
    """Add ``rule`` to the file's ``allow`` list (``deny``: its ``deny`` list), creating the
    file; RulesError if it cannot."""
    import tomlkit  # only an "always" or "never" answer writes: every session reads (tomllib)

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path.with_name(path.name + ".lock")):
            load_rules(path)  # refuse to add to a file that is already malformed
            try:
                text = path.read_text(encoding="utf-8")
            except FileNotFoundError:
                text = _NEW
            doc = tomlkit.parse(text)
            entries = doc.setdefault("deny" if deny else "allow", tomlkit.array())
            if str(rule) not in [str(v) for v in entries]:
                entries.append(str(rule))
            replace_file(path, tomlkit.dumps(doc).encode())
    except OSError as e:
        raise RulesError(f"rules file {path}: cannot save the rule {str(rule)!r}: {e}") from None


class RuleStore:
    """The rules of one loopd process besides the config's: the rules file and the
    command's own (``--approve``), shared by its sessions.

    Every decision uses the file as it is on disk then: :meth:`current` stats it (one
    ``stat``, a few microseconds) and reads it again when its inode, size, modification or
    change time differ from the last read, so a rule added, removed or saved by another
    process (another command, the daemon, a hand edit) counts from the next call. A file
    that is malformed when the process starts is an error (the start stops); one that
    becomes malformed later makes :meth:`current` name the problem and give no rule of the
    file, and the gate asks the person for every call until it is fixed. An "always" answer
    is saved to the file and is in force at once. Without a path (tests, tools driving turns
    directly) the rules live in memory only."""

    def __init__(self, path: Path | None = None, extra: RuleBook | None = None) -> None:
        self.path = path
        self.extra = extra or RuleBook()
        self._lock = threading.Lock()
        self._file = RuleBook()  # the file's rules as last read (in memory: all of them)
        self._seen: object = None  # the file's signature when read
        self._problem = ""
        if path is not None:
            self._seen = _signature(path)
            self._file = load_rules(path)

    def book(self) -> RuleBook:
        """The rules now (none of the file's while it is malformed: see :meth:`current`)."""
        return self.current()[0]

    def current(self) -> tuple[RuleBook, str]:
        """The rules now, and what is wrong with the rules file ("" when nothing is)."""
        with self._lock:
            if self.path is not None:
                seen = _signature(self.path)
                if seen != self._seen:
                    self._seen = seen  # taken before the read: a change during it shows next
                    try:
                        self._file, self._problem = load_rules(self.path), ""
                    except RulesError as e:
                        self._file, self._problem = RuleBook(), str(e)
            return self._file + self.extra, self._problem

    def save(self, rule: Rule, *, deny: bool = False) -> None:
        """Keep ``rule`` as an allow rule, or a deny rule (in the file, when there is one);
        RulesError if not."""
        with self._lock:
            if self.path is not None:
                save_rule(self.path, rule, deny=deny)
                self._seen = None  # read again at the next decision, with every change
                return
            allow, denied = self._file.allow, self._file.deny
            if deny and rule not in denied:
                denied = (*denied, rule)
            elif not deny and rule not in allow:
                allow = (*allow, rule)
            self._file = RuleBook(allow, denied)


def _signature(path: Path) -> object:
    """What tells a changed file from the one read: None when there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:  # unreadable now: read it again (load_rules says why) next time
        return ("error", e.errno, object())
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
