"""`make eval`'s task file and scorer, and a smoke run of two tasks on the embedded model.

The scorer is checked on hand-made logs (each check must be able to fail a turn); the smoke
run (marker ``embedded``) runs two tasks through the same code as ``make eval``, with the
defaults a new user gets, and writes the JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from actors.log.records import Assistant, Record, ToolCall, ToolResult, User
from actors.tools.protocol.spec import ResultClass
from scripts import eval as ev
from tests.support.embedded import require_embedded

NOTES = "The garden club meets on Saturday at 10 am by the greenhouse."


def _turn(*calls: tuple[str, dict[str, object], str | None], answer: str = "ok") -> list[Record]:
    """A turn: one Assistant per call, each answered with its result (unless None)."""
    out: list[Record] = [User(content="q")]
    for i, (name, arguments, result) in enumerate(calls):
        call = ToolCall(id=f"c{i}", name=name, arguments=json.dumps(arguments))
        out.append(Assistant(content=None, reasoning=None, tool_calls=(call,)))
        if result is not None:
            out.append(ToolResult(call=i + 1, tool_call_id=call.id, content=result,
                                  class_=ResultClass.PUBLIC, untrusted=False, truncated=False))
    out.append(Assistant(content=answer, reasoning=None))
    return out


def _task(task_id: str) -> ev.Task:
    return next(t for t in ev.load_tasks() if t.id == task_id)


def test_the_task_file_has_every_kind_the_issue_names() -> None:
    tasks = ev.load_tasks()
    kinds = Counter(t.kind for t in tasks)
    assert len(tasks) >= 20
    for kind in ("list", "read", "search", "read-then-answer", "two tools", "no tool",
                 "write (approval)", "missing file"):
        assert kinds[kind] >= 1, kind
    assert all(t.tools or t.no_tools for t in tasks)


def test_the_held_out_tasks_ask_other_questions() -> None:
    """examples/eval/held-out.toml checks tuning against questions it was not chosen for."""
    held = ev.load_tasks(ev.TASKS.with_name("held-out.toml"))
    tuned = ev.load_tasks()
    assert len(held) >= 10 and all(t.tools or t.no_tools for t in held)
    assert not {t.id for t in held} & {t.id for t in tuned}
    assert not {t.prompt.lower() for t in held} & {t.prompt.lower() for t in tuned}


def test_an_unknown_key_in_the_task_file_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "tasks.toml"
    bad.write_text('[[task]]\nid = "x"\nkind = "list"\nprompt = "p"\ntool = ["list_dir"]\n')
    with pytest.raises(ValueError, match="unknown key"):
        ev.load_tasks(bad)


def test_a_read_passes_with_the_call_and_the_fact(tmp_path: Path) -> None:
    task = _task("read-notes")
    turn = _turn(("read_file", {"path": "./notes.txt"}, NOTES), answer="It meets on Saturday.")
    assert ev.score(task, "It meets on Saturday.", None, turn, tmp_path) == (True, "ok")


def test_call_tool_counts_as_the_tool_it_names(tmp_path: Path) -> None:
    task = _task("read-notes")
    turn = _turn(("call_tool", {"name": "read_file", "arguments": {"path": "notes.txt"}}, NOTES))
    assert ev.score(task, "On Saturday", None, turn, tmp_path)[0]


@pytest.mark.parametrize(
    ("turn", "answer", "why"),
    [
        (_turn(("list_dir", {}, "notes.txt 117")), "Saturday", "read_file was not called"),
        (_turn(("read_file", {"path": "todo.md"}, "x")), "Saturday", "never had"),
        (_turn(("read_file", {"path": "notes.txt"}, None)), "Saturday", "not called"),
        (_turn(("read_file", {"path": "notes.txt"}, NOTES)), "I do not know", "lacks"),
        (_turn(), '{"name": "read_file", "arguments": {"path": "notes.txt"}}', "written as text"),
        (_turn(), "", "no answer"),
    ],
)
def test_each_check_can_fail_a_read(
    tmp_path: Path, turn: list[Record], answer: str, why: str
) -> None:
    passed, reason = ev.score(_task("read-notes"), answer, None, turn, tmp_path)
    assert not passed
    assert why in reason


def test_a_turn_that_ended_in_an_error_fails(tmp_path: Path) -> None:
    assert ev.score(_task("no-tool-sum"), None, "TurnLimit: x", _turn(), tmp_path) == (
        False, "TurnLimit: x")


def test_no_tool_tasks_fail_on_any_call(tmp_path: Path) -> None:
    task = _task("no-tool-sum")
    assert ev.score(task, "42", None, _turn(), tmp_path)[0]
    passed, why = ev.score(task, "42", None, _turn(("find_tool", {"query": "add"}, "x")), tmp_path)
    assert not passed and "no tool needed" in why


def test_two_tools_must_come_in_order(tmp_path: Path) -> None:
    task = _task("two-list-read")
    good = _turn(("list_dir", {"path": "recipes"}, "soup.md"),
                 ("read_file", {"path": "recipes/soup.md"}, "simmer 25 minutes"))
    bad = _turn(("read_file", {"path": "recipes/soup.md"}, "simmer 25 minutes"),
                ("list_dir", {"path": "recipes"}, "soup.md"))
    assert ev.score(task, "25 minutes", None, good, tmp_path)[0]
    assert ev.score(task, "25 minutes", None, bad, tmp_path) == (
        False, "tools not in the order list_dir, read_file")


def test_a_write_checks_the_file_once_approval_exists(tmp_path: Path) -> None:
    task = _task("write-shopping")
    call = ("write_file", {"path": "shopping.txt", "content": "buy milk"}, "needs approval")
    turn = _turn(call, answer="Done.")
    assert ev.score(task, "Done.", None, turn, tmp_path, approval=False)[0]
    assert ev.score(task, "Done.", None, turn, tmp_path, approval=True) == (
        False, "shopping.txt was not written")
    (tmp_path / "shopping.txt").write_text("buy milk\n")
    assert ev.score(task, "Done.", None, turn, tmp_path, approval=True) == (True, "ok")
    wrong = _turn(("write_file", {"path": "shopping.txt", "content": "buy eggs"}, "x"))
    assert not ev.score(task, "Done.", None, wrong, tmp_path, approval=False)[0]


@pytest.mark.embedded
# A hang guard, not a speed check: two real-model turns beside two other workers' model
# servers on 2 cores took over 120 s once (30 s alone).
@pytest.mark.timeout(1200)
def test_smoke_two_tasks_on_the_embedded_model(tmp_path: Path) -> None:
    require_embedded()
    tasks = [_task("no-tool-sum"), _task("read-notes")]
    rows = ev.run_tasks(tasks)
    out = tmp_path / "eval.json"
    ev.write_json(rows, out, {"config": "defaults"})
    data = json.loads(out.read_text())
    assert [r["task"] for r in data["rows"]] == ["no-tool-sum", "read-notes"]
    assert data["meta"]["tasks"] == 2
    for row in rows:
        assert row.prompt_tokens > 0, row  # the model really answered, through the harness
        assert row.seconds > 0 and row.why
        assert row.passed == row.why.startswith("ok"), row
