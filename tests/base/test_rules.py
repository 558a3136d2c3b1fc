"""Approval rules: matching by words and path parts, deny beats allow, the rules file."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.approval.rulesfile import RuleStore, load_rules, save_rule
from actors.base.config import parse
from actors.base.errors import ConfigError, RulesError
from actors.base.rules import (
    Rule,
    RuleBook,
    Verdict,
    grant_for,
    has_shell_operators,
    host_allow,
    parse_rule,
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
    assert said(book, "run_command", command="ls; rm -rf ~") is Verdict.ASK
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
    none = RuleBook()
    assert grant_for(none, "run_command", cmd("git status -s")) == Rule(
        "run_command", ("git", "status", "-s"))
    assert grant_for(none, "run_command", cmd("ls | wc -l")) is None  # once only
    assert grant_for(none, "write_file", {"path": "a"}) == Rule("write_file")
    guarded = RuleBook.of([], ["write_file: secrets"])
    assert grant_for(guarded, "write_file", {"path": "../x"}) is None
    assert str(Rule("run_command", ("git", "commit", "-m", "a b"))) == \
        "run_command: git commit -m 'a b'"


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
                 "run_command:git log"]:
        rule = parse_rule(text)
        assert parse_rule(str(rule)) == rule


def test_the_config_refuses_a_bad_rule_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"tools\.deny: rule 'run_command: ls \| sh'"):
        parse({"tools": {"deny": ["run_command: ls | sh"]}})
    tools = parse({"tools": {"allow": ["run_command: git status"], "approval_timeout_s": 0}})
    assert tools.tools.allow == ("run_command: git status",)


def test_hosts_are_given_only_plain_rules_of_tools_no_deny_rule_names() -> None:
    assert host_allow(["write_file", "run_command", "run_command: git status", "echo"],
                      ["run_command: rm"]) == ("write_file", "echo")


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
    assert said(RuleBook((), (rule,)), "run_command", command=command) is Verdict.ASK
    # and the same command without the operator does match: the rule is not just dead
    plain = " ".join([*prefix, *before, *after])
    assert said(RuleBook((rule,), ()), "run_command", command=plain) is Verdict.ALLOW


# --- the rules file ------------------------------------------------------------------------


def test_a_missing_rules_file_is_no_rules(tmp_path: Path) -> None:
    assert load_rules(tmp_path / "rules.toml") == RuleBook()


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('allow = ["write_file"]\ndeny = [\n  "run_command: rm",\n  "run command",\n]\n', 4,
         "is not a tool name"),
        ('allow = ["write_file"]\n\ndeny = "run_command"\n', 3, "must be a list"),
        ('# mine\nallow = [\n  "ok",\n  7,\n]\n', 4, "must be a string"),
        ('allow = []\ncolour = "red"\n', 2, "unknown key 'colour'"),
    ],
)
def test_a_malformed_rules_file_is_an_error_naming_the_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RulesError, match=rf"{path}, line {line}: .*{message}"):
        load_rules(path)


def test_invalid_toml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('allow = ["write_file"]\ndeny = ["x"\n')
    with pytest.raises(RulesError, match=r"not valid TOML: .*line 2"):
        load_rules(path)


def test_saving_keeps_the_persons_comments_and_rules(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "rules.toml"
    save_rule(path, parse_rule("write_file"))  # creates the file and its folder
    assert load_rules(path) == RuleBook((Rule("write_file"),))
    path.write_text(path.read_text() + "# keep this comment\n")
    save_rule(path, parse_rule("run_command: git status"))
    save_rule(path, parse_rule("run_command: git status"))  # once only
    text = path.read_text()
    assert "# keep this comment" in text
    assert load_rules(path).allow == (Rule("write_file"), Rule("run_command", ("git", "status")))


def test_a_malformed_file_is_not_written_over(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text("allow = [\"run command\"]\n")
    with pytest.raises(RulesError, match="line 1"):
        save_rule(path, parse_rule("write_file"))
    assert path.read_text() == "allow = [\"run command\"]\n"


def test_the_store_keeps_always_rules_at_once_and_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('deny = ["run_command: rm"]\n')
    store = RuleStore(path, RuleBook.of(["echo"]))
    assert store.book() == RuleBook((Rule("echo"),), (Rule("run_command", ("rm",)),))
    store.save(Rule("write_file"))
    assert Rule("write_file") in store.book().allow
    assert RuleStore(path).book().allow == (Rule("write_file"),)  # a new process reads it
    memory = RuleStore()
    memory.save(Rule("write_file"))
    assert memory.book().allow == (Rule("write_file"),)
