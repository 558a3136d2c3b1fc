"""actors/approval/rulesfile.py: the rules file, read, checked and added to.

A missing file is no rules; a malformed one is an error naming the file and the line, and is
never written over; an "always" answer is added with the person's comments kept, and two
processes adding at once both keep theirs.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from actors.approval.rulesfile import RuleStore, load_rules, save_rule
from actors.base.errors import RulesError
from actors.base.rules import Rule, RuleBook, parse_rule


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


def test_the_store_keeps_never_rules_as_deny_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    store = RuleStore(path)
    store.save(Rule("run_command", ("git", "push")), deny=True)
    store.save(Rule("run_command", ("git", "push")), deny=True)  # once only
    assert store.book() == RuleBook((), (Rule("run_command", ("git", "push")),))
    assert RuleStore(path).book() == store.book()  # in the file, for a new process
    assert 'deny = ["run_command: git push"]' in path.read_text()


def test_an_exact_rule_is_saved_and_read_back_as_exact(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    exact = parse_rule("run_command = git status")
    save_rule(path, exact)
    (back,) = load_rules(path).allow
    assert back == exact and str(back) == "run_command = git status"
    assert "run_command = git status" in path.read_text()


def test_a_new_file_says_what_it_holds(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    save_rule(path, parse_rule("write_file"))
    text = path.read_text()
    assert text.startswith("# loopd approval rules")
    assert "deny = []" in text


def test_a_file_that_is_not_utf8_is_an_error_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_bytes(b'allow = ["\xff"]\n')
    with pytest.raises(RulesError, match=rf"rules file {path}: cannot read it"):
        load_rules(path)


def test_a_folder_that_cannot_be_made_is_an_error_naming_the_rule(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "rules.toml"  # its folder would be a file
    with pytest.raises(RulesError, match=r"cannot save the rule 'write_file'"):
        save_rule(path, parse_rule("write_file"))


def _save_many(path: str, tool: str, n: int) -> None:
    for i in range(n):
        save_rule(Path(path), parse_rule(f"{tool}: step{i}"))


def test_two_processes_saving_at_once_both_keep_their_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(path), tool, 20))
             for tool in ("run_command", "write_file")]  # fmt: skip
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)  # a hang guard
        assert p.exitcode == 0
    saved = {str(r) for r in load_rules(path).allow}
    assert saved == {f"{tool}: step{i}" for tool in ("run_command", "write_file")
                     for i in range(20)}  # fmt: skip
    assert not list(tmp_path.glob(".rules.toml.*.tmp"))  # no temporary file left behind
