"""Approval rules: matching by words and path parts, deny beats allow (the rules file:
tests/approval/test_rulesfile.py)."""

from __future__ import annotations

import contextlib
import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.base.command_line import read_command, split_words
from actors.base.config import parse
from actors.base.errors import ConfigError
from actors.base.rules import (
    Rule,
    RuleBook,
    Verdict,
    doubt,
    grant_for,
    has_shell_operators,
    parse_rule,
    protected,
    subject,
    verdict,
)


def cmd(command: str) -> dict[str, str]:
    return {"command": command}


def said(book: RuleBook, tool: str, **arguments: str) -> Verdict:
    return verdict(book, tool, arguments)[0]


# --- matching ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("git status", Verdict.ALLOW),
        ("git status -s", Verdict.ALLOW),
        ("git   status  -s", Verdict.ALLOW),  # words, not characters
        ("'git' \"status\"", Verdict.ALLOW),
        ("git statusx", Verdict.ASK),
        ("git", Verdict.ASK),
        ("git log", Verdict.ASK),
        ("git status; rm -rf ~", Verdict.ASK),
        ("git status && rm -rf ~", Verdict.ASK),
        ("git status | sh", Verdict.ASK),
        ("git status > /etc/passwd", Verdict.ASK),
        ("git status $(rm -rf ~)", Verdict.ASK),
        ("git status `rm -rf ~`", Verdict.ASK),
        ("git status\nrm -rf ~", Verdict.ASK),
        ("git status 'unbalanced", Verdict.ASK),
        ("git status &", Verdict.ASK),
    ],
)
def test_a_command_prefix_matches_the_commands_words_only(command: str, expected: Verdict) -> None:
    book = RuleBook.of(["run_command: git status"])
    assert said(book, "run_command", command=command) is expected


def test_deny_beats_allow_and_plain_rules_match_every_call() -> None:
    book = RuleBook.of(["run_command", "write_file"], ["run_command: rm", "write_file: secrets"])
    assert said(book, "run_command", command="ls -l") is Verdict.ALLOW
    assert said(book, "run_command", command="rm -rf build") is Verdict.DENY
    assert said(book, "write_file", path="notes.txt") is Verdict.ALLOW
    assert said(book, "write_file", path="secrets/key") is Verdict.DENY
    assert said(book, "write_file", path="./secrets/key") is Verdict.DENY
    assert said(book, "write_file", path="secrets2/key") is Verdict.ALLOW
    assert said(book, "read_file", path="secrets/key") is Verdict.ASK  # other tool
    assert verdict(book, "run_command", cmd("rm x"))[1] == Rule("run_command", ("rm",))


def test_a_call_a_deny_prefix_cannot_check_is_not_allowed_by_a_plain_rule() -> None:
    book = RuleBook.of(["run_command", "write_file"], ["run_command: rm", "write_file: secrets"])
    assert said(book, "run_command", command="ls; rm -rf ~") is Verdict.DENY  # one of its commands
    assert said(book, "run_command", command="ls | wc -l") is Verdict.ALLOW  # shown not to rm
    assert said(book, "run_command", command="ls $(echo r)m") is Verdict.ASK  # cannot be told
    assert said(book, "write_file", path="docs/../secrets/key") is Verdict.ASK
    # without a deny prefix rule, the plain rule allows it: the person asked for that
    assert said(RuleBook.of(["run_command"]), "run_command", command="ls; rm x") is Verdict.ALLOW
    assert said(RuleBook.of(["run_command"], ["run_command"]), "run_command",
                command="ls") is Verdict.DENY


def test_path_prefixes_match_whole_parts() -> None:
    book = RuleBook.of(["write_file: docs"])
    assert said(book, "write_file", path="docs/a.md") is Verdict.ALLOW
    assert said(book, "write_file", path="docs") is Verdict.ALLOW
    assert said(book, "write_file", path="docs2/a.md") is Verdict.ASK
    assert said(book, "write_file", path="docs/../etc/passwd") is Verdict.ASK
    assert said(book, "write_file", content="no path") is Verdict.ASK


def test_what_a_session_or_always_answer_grants() -> None:
    """Exactly what the person saw: the command, the path; never a prefix that adds effects."""
    none = RuleBook()
    grant = grant_for(none, "run_command", cmd("find . -name '*.txt'"))
    assert grant == Rule("run_command", ("find", ".", "-name", "*.txt"), exact=True)
    assert str(grant) == "run_command = find . -name '*.txt'"
    book = RuleBook((grant,))
    assert said(book, "run_command", command="find . -name '*.txt'") is Verdict.ALLOW
    assert said(book, "run_command", command='find  .  -name "*.txt"') is Verdict.ALLOW
    assert said(book, "run_command", command="find . -name '*.txt' -delete") is Verdict.ASK
    assert said(book, "run_command", command="find . -name '*.txt' -exec rm {} +") is Verdict.ASK
    assert grant_for(none, "run_command", cmd("ls | wc -l")) is None  # once only
    assert grant_for(none, "write_file", {"path": "a"}) == Rule("write_file", ("a",), exact=True)
    assert said(RuleBook((Rule("write_file", ("a",), exact=True),)), "write_file",
                path="a/b") is Verdict.ASK
    assert grant_for(none, "git_add", {"files": ["a"]}) == Rule("git_add")  # no subject
    guarded = RuleBook.of([], ["write_file: secrets"])
    assert grant_for(guarded, "write_file", {"path": "../x"}) is None
    denied = RuleBook.of([], ["run_command: rm"])
    assert grant_for(denied, "run_command", cmd("python3 -c 'import os'")) is None
    assert str(Rule("run_command", ("git", "commit", "-m", "a b"))) == \
        "run_command: git commit -m 'a b'"


@pytest.mark.parametrize("path", [".git/config", ".git/hooks/pre-commit", "sub/.git/config",
                                  "./.git/info/attributes", ".git", "loopd.toml",
                                  "conf/loopd.toml"])
def test_writes_where_programs_find_code_are_asked_for_whatever_the_rules_say(path: str) -> None:
    """The approval guide's own example (docs/configuration.md#approval): write_file and
    "git status" allowed; a .git/config with a core.fsmonitor made "git status" run
    anything. Such a write is asked for, and an answer to it counts once."""
    book = RuleBook.of(["write_file", "write_file: .git", "run_command: git status"])
    assert said(book, "write_file", path=path, content="x") is Verdict.ASK
    assert grant_for(book, "write_file", {"path": path}) is None
    assert "where programs find what to run" in protected("write_file", {"path": path})
    assert said(book, "write_file", path="src/git/config") is Verdict.ALLOW
    assert said(book, "write_file", path=".gitignore") is Verdict.ALLOW
    assert said(RuleBook.of([], ["write_file"]), "write_file", path=path) is Verdict.DENY


# --- deny rules against other spellings ----------------------------------------------------


@pytest.mark.parametrize("command", [
    "rm -rf x", "/bin/rm x", "/usr/bin/rm x", "./rm x", "\\rm x", "'r'm x", '"rm" x',
    "r''m x", "env rm x", "env -i FOO=1 rm x", "env -u HOME rm x", "command rm x",
    "command -p rm x", "exec rm x", "builtin rm x", "nice rm x", "nice -n 5 rm x", "nohup rm x",
    "time rm x", "timeout 5 rm x", "timeout -s KILL 5 rm x", "stdbuf -o0 rm x",
    "setsid rm x", "sudo rm x", "sudo -u root rm x", "busybox rm x", "FOO=bar rm x",
    "sh -c 'rm x'", "bash -ec 'rm x'", "sh -c 'cd /; rm x'", "dash -c \"sh -c 'rm x'\"",
    "eval 'rm x'", "xargs rm", "xargs -n 1 rm", "find . -exec rm {} +",
    "find . -execdir /bin/rm {} ;", "ls; rm x", "true && rm x", "ls | xargs rm",
    "if rm x; then :; fi", "env -S 'rm x'", "flock /tmp/l rm x", "chroot / rm x",
])
def test_a_deny_rule_holds_against_other_spellings_of_its_program(command: str) -> None:
    book = RuleBook.of(["run_command", "run_command: env", "run_command: sh"],
                       ["run_command: rm"])
    assert said(book, "run_command", command=command) is Verdict.DENY


@pytest.mark.parametrize("command", [
    "git push", "git -C . push", "git --no-pager push origin", "git --git-dir=.git push",
    "git -C /w --work-tree /w push", "/usr/bin/git push", "env git -C . push",
    "sh -c 'git push --force'",
])
def test_a_deny_rule_of_a_subcommand_holds_against_global_options(command: str) -> None:
    """The issue's case: allow git, deny git push; "git -C . push" ran."""
    book = RuleBook.of(["run_command: git"], ["run_command: git push"])
    assert said(book, "run_command", command=command) is Verdict.DENY
    assert said(book, "run_command", command="git -C . status") is Verdict.ALLOW


@pytest.mark.parametrize(("command", "why"), [
    ("python3 -c \"import subprocess; subprocess.run(['git','push'])\"", "inline"),
    ("perl -e 'system(\"rm x\")'", "inline"),
    ("git -c alias.p=push p", "git -c"),
    ("git config alias.p push", "names what"),
    ("echo rm", "names what"),
    ("/bin/r? x", "pattern"),
    ("ls $HOME", "expands"),
    ("awk 'BEGIN { system(\"x\") }'", "program text"),
])
def test_a_call_that_cannot_be_shown_to_avoid_a_deny_rule_is_asked_for(
    command: str, why: str
) -> None:
    book = RuleBook.of(["run_command"], ["run_command: rm", "run_command: git push"])
    assert said(book, "run_command", command=command) is Verdict.ASK
    reading = read_command(command)
    assert why in doubt(book, "run_command", subject("run_command", cmd(command)), reading)
    assert said(RuleBook.of(["run_command"]), "run_command", command=command) is Verdict.ALLOW


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a tool name"),
        ("run command", "is not a tool name"),
        ("run_command:", "nothing after ':'"),
        ("run_command: ls; rm", "shell operators"),
        ("run_command: 'ls", "shell operators or unbalanced quotes"),
        ("write_file: ../x", "'..' part"),
    ],
)
def test_bad_rules_say_why(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_rule(text)


def test_rules_round_trip_through_their_text() -> None:
    for text in ["run_command", "run_command: git status", "write_file: docs/api",
                 "run_command:git log", "run_command = find . -name '*.txt'", "write_file=a/b"]:
        rule = parse_rule(text)
        assert parse_rule(str(rule)) == rule


def test_the_config_refuses_a_bad_rule_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"tools\.deny: rule 'run_command: ls \| sh'"):
        parse({"tools": {"deny": ["run_command: ls | sh"]}})
    tools = parse({"tools": {"allow": ["run_command: git status"], "approval_timeout_s": 0}})
    assert tools.tools.allow == ("run_command: git status",)


# --- the property --------------------------------------------------------------------------

_word = st.text(st.characters(min_codepoint=33, max_codepoint=126,
                              exclude_characters="'\"\\;&|<>()$`"), min_size=1, max_size=6)
_operators = st.sampled_from([";", "&&", "||", "|", "&", ">", ">>", "<", "$(", ")", "`",
                              "\n", "(", "2>&1", "$HOME"])


@given(
    prefix=st.lists(_word, min_size=1, max_size=3),
    before=st.lists(_word, max_size=3),
    after=st.lists(_word, max_size=3),
    operator=_operators,
    glue=st.sampled_from(["", " "]),
    quoted=st.booleans(),
)
def test_a_command_with_shell_operators_never_matches_a_prefix_rule(
    prefix: list[str], before: list[str], after: list[str], operator: str, glue: str,
    quoted: bool,
) -> None:
    """Random commands that start with the rule's own words and hold a shell operator
    anywhere (even inside quotes) match no allow and no deny prefix rule."""
    rule = parse_rule(f"run_command: {shlex.join(prefix)}")
    op = f"'{operator}'" if quoted else operator
    command = " ".join([*prefix, *before]) + glue + op + glue + " ".join(after)
    assert has_shell_operators(command)
    assert not rule.matches("run_command", None)
    assert said(RuleBook((rule,), ()), "run_command", command=command) is Verdict.ASK
    # as a deny rule it holds: the command's first simple command starts with its words
    assert said(RuleBook((), (rule,)), "run_command", command=command) is not Verdict.ALLOW
    # and the same command without the operator does match: the rule is not just dead
    plain = " ".join([*prefix, *before, *after])
    assert said(RuleBook((rule,), ()), "run_command", command=plain) is Verdict.ALLOW


# --- the property: no spelling of a denied call is allowed without asking -------------------

_PROGRAMS = st.sampled_from(["rm", "git", "curl", "chmod", "dd", "docker", "kill"])
_arg = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=5)


def _quote_program(program: str, how: int) -> str:
    """One way to write a program word that the shell reads as the same word."""
    half = max(1, len(program) // 2)
    return [program, f"/usr/bin/{program}", f"./{program}", f"\\{program}",
            f"'{program[:half]}'{program[half:]}", f'"{program}"',
            f"{program[:half]}''{program[half:]}"][how]


_WRAPS = [
    "env {}", "env -i A=1 {}", "env -u HOME {}", "command {}", "exec {}", "nice -n 5 {}",
    "nohup {}", "time {}", "timeout 5 {}", "timeout -s KILL 5 {}", "stdbuf -o0 {}",
    "setsid {}", "sudo -u root {}", "FOO=bar {}", "busybox {}", "xargs -n 1 {}",
    "if {}; then :; fi", "true; {}", "{} && true", "ls | {}", "{} > out.txt",
]
_NESTS = ["sh -c {q}", "bash -ec {q}", "eval {q}", "env -S {q}"]


@st.composite
def _spelled(draw: st.DrawFn) -> tuple[list[str], str]:
    """A deny rule's words and a command that runs them by another spelling."""
    program = draw(_PROGRAMS)
    rule = [program, *draw(st.lists(_arg, max_size=2))]
    words = [_quote_program(program, draw(st.integers(0, 6))), *rule[1:]]
    if program == "git" and len(rule) > 1 and draw(st.booleans()):
        words[1:1] = draw(st.sampled_from([["-C", "."], ["--no-pager"], ["--git-dir=.git"],
                                           ["-C", "/w", "--work-tree", "/w"]]))
    command = " ".join([*words, *draw(st.lists(_arg, max_size=2))])
    if draw(st.booleans()) and rule == [program]:
        command = f"find . -exec {command} {{}} +"
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            command = draw(st.sampled_from(_WRAPS)).format(command)
        else:
            command = draw(st.sampled_from(_NESTS)).format(q=shlex.quote(command))
    return rule, command


@given(spelled=_spelled(), allow=st.lists(st.sampled_from(
    ["run_command", "run_command: env", "run_command: sh", "run_command: {first}",
     "run_command = {command}", "run_command: {program}", "run_command: xargs"]), max_size=3),
    other=st.lists(st.sampled_from(["run_command: ls", "write_file: x", "echo"]), max_size=2))
def test_no_spelling_of_a_denied_call_is_allowed_without_asking(
    spelled: tuple[list[str], str], allow: list[str], other: list[str]
) -> None:
    """For generated deny rules and commands that run them by another spelling (paths,
    quotes, wrappers and their options, assignments, sh -c, eval, xargs, find -exec, git's
    global options, several commands joined), under allow rules that would otherwise match
    (every call, the wrapper, the exact command), the call is never allowed without asking.
    The seed is printed in pytest's header (replay: --hypothesis-seed=N)."""
    rule, command = spelled
    first = (split_words(command) or (command.split()[0],))[0]
    texts = []
    for a in allow:
        text = a.format(first=shlex.quote(first), command=command, program=rule[0])
        with contextlib.suppress(ValueError):
            texts.append(str(parse_rule(text)))
    book = RuleBook.of(texts, [*other, f"run_command: {shlex.join(rule)}"])
    decided, by = verdict(book, "run_command", cmd(command))
    assert decided is not Verdict.ALLOW, (command, texts, by)
    assert grant_for(book, "run_command", cmd(command)) is None or decided is Verdict.DENY
