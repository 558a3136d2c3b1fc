"""What a shell command line may run, read from its words (pure; for the approval rules).

A deny rule names a program by its words (``rm``, ``git push``), but the shell runs the same
program under many spellings: ``/bin/rm``, ``\\rm``, ``'r'm``, ``env rm``, ``command rm``,
``nice -n 5 rm``, ``sh -c 'rm x'``, ``xargs rm``, ``find . -exec rm {} +``, ``git -C . push``.
:func:`read_command` turns a command into what :mod:`actors.base.rules` needs to hold a deny
rule against every spelling it can recognise:

- ``runs``: the invocations the command line may start, each a tuple of words with the
  program as its base name (``/usr/bin/rm -f x`` -> ``("rm", "-f", "x")``), found through
  variable assignments, wrappers (:data:`WRAPPERS`), shells' ``-c`` scripts (split at their
  operators), ``eval``, ``xargs``, ``find -exec``, ``busybox`` and git's global options;
- ``atoms``: every name-like piece of every word (split at quotes, operators, ``=``, ``,``,
  brackets; paths to their base name), so a rule's words found anywhere in order (``python
  -c "os.system('git push')"``) keep the call from being allowed without asking;
- ``unclear``: why loopd cannot tell what the command runs (inline code for an interpreter,
  a shell script with ``$`` or backquotes, a program given by a glob, ``git -c``), or "".

Word splitting follows POSIX ``sh`` (quotes, backslashes) in time linear in the command, so a
400,000-character word costs no more than reading it (``shlex`` took seconds: it builds
each word one character at a time).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

__all__ = [
    "SHELL_OPERATORS", "WRAPPERS", "Reading", "Simple", "base", "read_command", "scan",
    "split_words",
]

# Anything that makes sh run more than one simple command, expand, or redirect.
SHELL_OPERATORS = re.compile(r"[;&|<>()$`\n\r]")
_GLOB = frozenset("*?[{")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# the pieces of a word that may name a program or a subcommand
_ATOM = re.compile(r"[^\s'\"`;&|()<>=,{}\[\]\\$!]+")
_KEYWORDS = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                       "while", "until", "time"})  # words the shell reads before a program
_DEPTH = 8  # nested sh -c / eval / wrappers followed at most this deep

# Programs that run the command in their remaining words, with their options that take a
# value (so the value is not taken for the program). An option not listed is a flag.
WRAPPERS: dict[str, frozenset[str]] = {
    "env": frozenset({"-u", "--unset", "-C", "--chdir", "-S", "--split-string", "-a", "--argv0"}),
    "command": frozenset(),
    "builtin": frozenset(),
    "exec": frozenset({"-a"}),
    "nice": frozenset({"-n", "--adjustment"}),
    "nohup": frozenset(),
    "time": frozenset({"-f", "--format", "-o", "--output"}),
    "timeout": frozenset({"-s", "--signal", "-k", "--kill-after"}),
    "stdbuf": frozenset({"-i", "--input", "-o", "--output", "-e", "--error"}),
    "setsid": frozenset(),
    "ionice": frozenset({"-c", "--class", "-n", "--classdata"}),
    "taskset": frozenset(),
    "chrt": frozenset(),
    "sudo": frozenset({"-u", "--user", "-g", "--group", "-C", "--close-from", "-D",
                       "--chdir", "-h", "--host", "-p", "--prompt", "-r", "--role", "-t",
                       "--type", "-U", "--other-user", "-T", "--command-timeout"}),
    "doas": frozenset({"-u", "-C"}),
    "runuser": frozenset({"-u", "--user", "-g", "--group", "-G", "--supp-group"}),
    "flock": frozenset({"-w", "--timeout", "-E", "--conflict-exit-code"}),
    "chroot": frozenset({"--userspec", "--groups"}),
    "unbuffer": frozenset(),
    "catchsegv": frozenset(),
    "strace": frozenset({"-o", "-e", "-p", "-s", "-u", "-E", "-P", "-a", "-b", "-I", "-X"}),
    "ltrace": frozenset({"-o", "-e", "-p", "-s", "-u", "-n", "-a"}),
    "watch": frozenset({"-n", "--interval", "-d", "--differences", "-q", "--equexit"}),
    "xvfb-run": frozenset({"-n", "--server-num", "-s", "--server-args", "-f", "--auth-file",
                           "-e", "--error-file", "-p", "--xauth-protocol"}),
    "prlimit": frozenset({"-p", "--pid"}),
}
# Wrappers whose first remaining word is a value, not the program (taskset MASK, timeout
# DURATION, chroot DIR, flock FILE, chrt PRIORITY).
_FIRST_IS_VALUE = frozenset({"timeout", "taskset", "chroot", "flock", "chrt"})
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "yash",
                    "posh", "rbash", "busybox-sh"})
# Interpreters and the flags that give them code to run inline.
INLINE: dict[str, frozenset[str]] = {
    "python": frozenset({"-c"}), "perl": frozenset({"-e", "-E"}),
    "ruby": frozenset({"-e"}), "node": frozenset({"-e", "--eval", "-p", "--print"}),
    "nodejs": frozenset({"-e", "--eval", "-p", "--print"}),
    "deno": frozenset({"eval"}), "bun": frozenset({"-e", "--eval"}),
    "php": frozenset({"-r"}), "lua": frozenset({"-e"}), "tclsh": frozenset(),
    "osascript": frozenset({"-e"}), "Rscript": frozenset({"-e"}),
}
_PROGRAM_TEXT = frozenset({"awk", "gawk", "mawk", "nawk", "sed", "gsed", "jq"})  # e, system()
# git's options that come before its subcommand, and those that take a value.
_GIT_VALUED = frozenset({"-C", "-c", "--git-dir", "--work-tree", "--namespace",
                         "--super-prefix", "--config-env", "--exec-path", "--list-cmds",
                         "--attr-source"})
_GIT_RUNS_CODE = frozenset({"-c", "--config-env", "--exec-path"})
_XARGS_VALUED = frozenset({"-a", "--arg-file", "-d", "--delimiter", "-E", "-e", "--eof",
                           "-I", "-i", "--replace", "-L", "-l", "--max-lines", "-n",
                           "--max-args", "-P", "--max-procs", "-s", "--max-chars",
                           "--process-slot-var"})


_TOKEN = re.compile(
    r"""'(?P<sq>[^']*)'|"(?P<dq>(?:[^"\\]|\\.)*)"|\\(?P<esc>.)|(?P<op>[;&|<>()\n\r])"""
    r"""|(?P<sp>[ \t]+)|(?P<plain>[^ \t\n\r'"\\;&|<>()]+)|(?P<bad>.)""",
    re.S,
)
_DQ_ESCAPE = re.compile(r'\\([\\"$`\n])')


@dataclasses.dataclass(frozen=True, slots=True)
class Simple:
    """One simple command of a script: its words, and which of them hold an unquoted
    ``*?[{`` (the shell expands those)."""

    words: tuple[str, ...]
    globbed: tuple[bool, ...]


def scan(script: str) -> tuple[list[Simple], bool] | None:
    """The simple commands of ``script`` (split at its unquoted operators, quotes and
    backslashes removed as ``sh`` does), and whether it expands anything (``$`` or a
    backquote outside single quotes); None when its quotes are unbalanced. Linear time."""
    simples: list[Simple] = []
    words: list[str] = []
    globs: list[bool] = []
    piece: list[str] = []
    in_word = globbed = expands = False

    def end_word() -> None:
        nonlocal piece, in_word, globbed
        if in_word:
            words.append("".join(piece))
            globs.append(globbed)
        piece, in_word, globbed = [], False, False

    for m in _TOKEN.finditer(script):
        kind = m.lastgroup
        if kind == "sp":
            end_word()
        elif kind == "op":
            end_word()
            if words:
                simples.append(Simple(tuple(words), tuple(globs)))
            words, globs = [], []
        elif kind == "bad":
            return None
        else:
            text = m.group(kind or "plain")
            if kind == "dq":
                expands = expands or "$" in text or "`" in text
                text = _DQ_ESCAPE.sub(lambda e: "" if e.group(1) == "\n" else e.group(1), text)
            elif kind == "esc":
                text = "" if text == "\n" else text
            elif kind == "plain":
                expands = expands or "$" in text or "`" in text
                globbed = globbed or not _GLOB.isdisjoint(text)
            piece.append(text)
            in_word = True
    end_word()
    if words:
        simples.append(Simple(tuple(words), tuple(globs)))
    return simples, expands


def split_words(command: str) -> tuple[str, ...] | None:
    """The words of ``command`` when it is one simple command with nothing the shell expands
    but patterns (no operator, ``$`` or backquote anywhere, even quoted); else None."""
    if SHELL_OPERATORS.search(command):
        return None
    found = scan(command)
    if found is None or not found[0]:
        return None
    return found[0][0].words


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    """What a command may run (see the module's docstring)."""

    runs: tuple[tuple[str, ...], ...]
    atoms: tuple[str, ...]
    unclear: str = ""


def base(word: str) -> str:
    """A program word's base name: ``/usr/bin/rm`` and ``./rm`` are ``rm``."""
    return word.rsplit("/", 1)[-1] or word


def read_command(command: str) -> Reading:
    """Every invocation ``command`` may start, its atoms, and what loopd cannot tell."""
    runs: list[tuple[str, ...]] = []
    unclear: list[str] = []
    for segment in _segments(command, unclear):
        _follow(segment, runs, unclear, 0)
    texts = [command, *(w for run in runs for w in run)]
    atoms = tuple(dict.fromkeys(a for t in texts for m in _ATOM.finditer(t)
                                for a in _atom_forms(m.group())))
    return Reading(tuple(dict.fromkeys(runs)), atoms, unclear[0] if unclear else "")


def _atom_forms(atom: str) -> Iterator[str]:
    yield atom
    if "/" in atom.rstrip("/"):
        yield base(atom.rstrip("/"))


def _segments(script: str, unclear: list[str]) -> Iterator[tuple[str, ...]]:
    """The simple commands of ``script``, as words; what cannot be told goes to ``unclear``."""
    found = scan(script)
    if found is None:
        unclear.append("its quotes are unbalanced")
        return
    simples, expands = found
    if expands:
        unclear.append("it expands variables or commands ($, backquotes)")
    for simple in simples:
        if simple.globbed[0]:
            unclear.append(f"its program is a pattern ({simple.words[0]})")
        yield simple.words


def _follow(words: tuple[str, ...], runs: list[tuple[str, ...]], unclear: list[str],
            depth: int) -> None:
    """Add the invocation ``words`` starts, and the ones it starts in turn."""
    if depth > _DEPTH:
        unclear.append("it nests commands too deeply to follow")
        return
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in _KEYWORDS):
        words = words[1:]
    if not words:
        return
    program = base(words[0])
    rest = words[1:]
    runs.append((program, *rest))
    inner: list[tuple[str, ...]] = []
    if program in WRAPPERS:
        inner.append(_after_options(rest, WRAPPERS[program], program in _FIRST_IS_VALUE))
        if program == "env":
            inner += [w for v in _values(rest, ("-S", "--split-string"))
                      for w in _script(v, unclear)]
        if program == "flock":
            inner += [w for v in _values(rest, ("-c", "--command")) for w in _script(v, unclear)]
    elif program in SHELLS:
        script = _shell_script(rest)
        if script is not None:
            inner += list(_script(script, unclear))
    elif program == "busybox":
        inner.append(rest)
    elif program == "eval":
        inner += list(_script(" ".join(rest), unclear))
    elif program == "xargs":
        inner.append(_after_options(rest, _XARGS_VALUED, False) or ("echo",))
    elif program == "find":
        inner += _find_exec(rest)
    elif program == "git":
        inner.append(("git", *_git_subcommand(rest, unclear)))
    elif _inline(program, rest):
        unclear.append(f"{program} is given code to run inline")
    elif program in _PROGRAM_TEXT:
        unclear.append(f"{program} is given a program text")
    for words_ in inner:
        if words_ and words_ != words:
            _follow(words_, runs, unclear, depth + 1)


def _after_options(words: tuple[str, ...], valued: frozenset[str],
                   first_is_value: bool) -> tuple[str, ...]:
    """``words`` after a wrapper's options (and assignments, for env)."""
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--":
            i += 1
            break
        if not w.startswith("-") or w == "-":
            if _ASSIGNMENT.match(w):  # env NAME=VALUE
                i += 1
                continue
            break
        i += 2 if w in valued else 1  # --opt=VALUE and -nVALUE are one word
    if first_is_value and i < len(words):
        i += 1
    return words[i:]


def _values(words: tuple[str, ...], flags: tuple[str, ...]) -> list[str]:
    found = []
    for i, w in enumerate(words):
        if w in flags and i + 1 < len(words):
            found.append(words[i + 1])
        for f in flags:
            if f.startswith("--") and w.startswith(f + "="):
                found.append(w[len(f) + 1 :])
    return found


def _script(text: str, unclear: list[str]) -> Iterator[tuple[str, ...]]:
    yield from _segments(text, unclear)


def _shell_script(words: tuple[str, ...]) -> str | None:
    """The script of ``sh [options] -c SCRIPT``, or None when there is no ``-c`` (a script
    file, or commands on stdin)."""
    i = 0
    while i < len(words):
        w = words[i]
        if w == "--" or not w.startswith(("-", "+")):
            return None
        if w.startswith("-") and not w.startswith("--") and "c" in w[1:]:
            return words[i + 1] if i + 1 < len(words) else ""
        i += 2 if w in ("-o", "+o", "-O", "+O") else 1
    return None


def _inline(program: str, words: tuple[str, ...]) -> bool:
    name = re.sub(r"[0-9.]+$", "", program)  # python3.12 -> python
    flags = INLINE.get(name)
    if flags is None:
        return False
    for w in words:
        if w in flags or any(w.startswith(f) and len(f) == 2 and len(w) > 2 and
                             not w.startswith("--") for f in flags):
            return True
        if not w.startswith("-"):
            return name == "deno" and w == "eval"
    return False


def _find_exec(words: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The commands of find's ``-exec``/``-execdir``/``-ok``/``-okdir`` actions."""
    found = []
    i = 0
    while i < len(words):
        if words[i] in ("-exec", "-execdir", "-ok", "-okdir"):
            j = i + 1
            while j < len(words) and words[j] not in (";", "+"):
                j += 1
            found.append(words[i + 1 : j])
            i = j
        i += 1
    return found


def _git_subcommand(words: tuple[str, ...], unclear: list[str]) -> tuple[str, ...]:
    """git's words from its subcommand on, its global options (``-C DIR``...) dropped."""
    i = 0
    while i < len(words):
        w = words[i]
        if not w.startswith("-"):
            break
        name = w.split("=", 1)[0]
        if name in _GIT_RUNS_CODE:
            unclear.append(f"git {name} can make git run any command")
        i += 2 if name in _GIT_VALUED and "=" not in w else 1
    return words[i:]
