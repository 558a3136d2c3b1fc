"""`make eval`'s task files and scorer, and smoke runs of the harness.

The scorer is checked on hand-made logs (each check must be able to fail a turn). A quick
run of three tasks (a follow-up session among them, on two workspaces) goes through the same
code as ``make eval`` against the fake llama-server and the real tool hosts, so it runs
everywhere; the smoke run on the embedded model (marker ``embedded``) runs two tasks with
the defaults a new user gets, when the model is installed, and writes the JSON.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from actors.log.records import AgentLink, Assistant, Record, ToolCall, ToolResult, User
from actors.session.compaction import ELIDE_HEADER
from actors.session.messages import OUTSIDE_FRAME, SUMMARY_FRAME
from actors.tools.protocol.spec import ResultClass
from scripts import eval as ev
from tests.support.embedded import MODEL, THREADS, require_embedded
from tests.support.fake_llama import FakeLlama, Reply, answer

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


KINDS = ("list", "read", "search", "read-then-answer", "two tools", "no tool",
         "write (approval)", "missing file")


def test_every_workspace_has_tasks_of_every_kind() -> None:
    """At least four workspaces of different kinds, tuned and never tuned, each with every
    kind of task; follow-ups in one session; the garden's 22 + 14 among them."""
    files = ev.task_files()
    by_workspace: dict[str, Counter[str]] = {}
    for f in files:
        if f.set in ev.OVERALL:
            by_workspace.setdefault(f.workspace, Counter()).update(t.kind for t in f.tasks)
    assert len(by_workspace) >= 4
    for workspace, kinds in by_workspace.items():
        assert all(kinds[k] for k in KINDS), (workspace, kinds)
    assert sum(kinds["follow-up"] for kinds in by_workspace.values()) >= 4
    assert {f.set for f in files} == set(ev.SETS)
    never = {f.workspace for f in files if f.set == "never-tuned"}
    assert len(never) >= 2 and not never & {f.workspace for f in files if f.set == "tuned"}
    names = {f.name: len(f.tasks) for f in files}
    assert names["garden"] == 22 and names["garden-held-out"] == 14
    long = next(f for f in files if f.set == "long")
    assert len(ev.sessions(long.tasks)) == 1 and len(long.tasks) >= 30
    for f in files:  # every task checks something a turn can fail
        assert all(t.tools or t.tools_any or t.no_tools or t.answer_all or t.answer_any
                   for t in f.tasks), f.name


def test_the_held_out_tasks_ask_other_questions() -> None:
    """examples/eval/garden-held-out.toml checks tuning against questions it was not chosen
    for."""
    held = ev.load_tasks(ev.EVAL_DIR / "garden-held-out.toml")
    tuned = ev.load_tasks()
    assert len(held) >= 10
    assert not {t.id for t in held} & {t.id for t in tuned}
    assert not {t.prompt.lower() for t in held} & {t.prompt.lower() for t in tuned}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('workspace = "garden"\nset = "tuned"\n[[task]]\nid = "x"\nkind = "list"\n'
         'prompt = "p"\ntool = ["list_dir"]\n', "unknown key"),
        ('workspace = "garden"\nset = "tuned"\nextra = 1\n', "unknown key"),
        ('workspace = "garden"\nset = "tunned"\n', "set must be one of"),
        ('workspace = "nowhere"\nset = "tuned"\n', "is not a folder"),
        ('set = "tuned"\n', "is not a folder"),
        ('workspace = "garden"\nset = "repo"\n', "no workspace"),
        ('workspace = "garden"\nset = "tuned"\n[[task]]\nid = "x"\nkind = "k"\nprompt = "p"'
         '\n[[task]]\nid = "x"\nkind = "k"\nprompt = "q"\n', "ids repeat"),
    ],
)
def test_a_bad_task_file_is_refused(tmp_path: Path, text: str, match: str) -> None:
    bad = tmp_path / "tasks.toml"
    bad.write_text(text)
    with pytest.raises(ValueError, match=match):
        ev.load_file(bad)


def test_tasks_that_name_a_session_run_in_it_in_order() -> None:
    def t(task_id: str, session: str = "") -> ev.Task:
        return ev.Task(id=task_id, kind="k", prompt="p", session=session)

    tasks = [t("a"), t("b", "s"), t("c"), t("d", "s"), t("e", "u")]
    assert [[x.id for x in g] for g in ev.sessions(tasks)] == [["a"], ["b", "d"], ["c"], ["e"]]
    files = [ev.TaskFile("f", "notes", "tuned", tuple(tasks))]
    picked = ev.select(files, ["d", "c"])  # d's session runs from its start
    assert [x.id for x in picked[0].tasks] == ["b", "d", "c"]
    with pytest.raises(ValueError, match="unknown task"):
        ev.select(files, ["zz"])


def test_the_summary_is_per_file_set_kind_and_overall() -> None:
    def row(task: str, file: str, set_: str, kind: str, passed: bool) -> ev.Row:
        return ev.Row(task=task, kind=kind, passed=passed, tool_calls=0, prompt_tokens=0,
                      seconds=0.0, why="", answer="", file=file, workspace=file, set=set_)

    rows = [row("a", "notes", "tuned", "read", True), row("b", "notes", "tuned", "list", False),
            row("c", "logs", "never-tuned", "read", True), row("d", "loopd", "repo", "read", False)]
    got = {group: [(t.group, t.passed, t.tasks) for t in tallies]
           for group, tallies in ev.summary(rows).items()}
    assert got == {
        "file": [("notes (notes, tuned)", 1, 2), ("logs (logs, never-tuned)", 1, 1),
                 ("loopd (loopd, repo)", 0, 1)],
        "set": [("tuned", 1, 2), ("never-tuned", 1, 1), ("repo", 0, 1)],
        "kind": [("read (tuned)", 1, 1), ("list (tuned)", 0, 1), ("read (never-tuned)", 1, 1),
                 ("read (repo)", 0, 1)],
        "overall": [("tuned + never-tuned", 2, 3)],  # the repository apart
    }


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


def test_a_file_a_child_agent_read_counts_as_read_by_the_turn(tmp_path: Path) -> None:
    task = _task("read-notes")
    link = AgentLink(parent="s", child="s.a1", task="read notes.txt", context="fresh")
    parent = [*_turn(("agent", {"task": "read notes.txt"}, "Saturday"))[:-1], link,
              Assistant(content="On Saturday.", reasoning=None)]
    child = [link, *_turn(("read_file", {"path": "notes.txt"}, NOTES))]
    logs = {"s.a1": child}
    children = ev.children_of(parent, logs.__getitem__)
    assert children == [child]  # its own link in its log: read once
    assert ev.score(task, "On Saturday.", None, parent, tmp_path, children=children) == (
        True, "ok")
    assert ev.score(task, "On Saturday.", None, parent, tmp_path)[1] == (
        "read_file was not called (called: agent)")


@pytest.mark.parametrize("answer", [
    SUMMARY_FRAME.format(summary="They read notes.txt: the club meets on Saturday."),
    OUTSIDE_FRAME.format(summary="The club meets on Saturday."),
    f"{ELIDE_HEADER}\n- The person asked: when does the club meet? Saturday.",
    "On Saturday. (3 earlier lines left out)",  # an older summary's wording
    "The earlier part of this  conversation no longer fits the context. Saturday.",
])
def test_an_answer_holding_the_compactions_frame_fails(tmp_path: Path, answer: str) -> None:
    """A compaction's frame, or a summary's own wording, is loopd's text: an answer holding
    it fails, whatever else it says (the 30-turn chat checks every answer so)."""
    turn = _turn(("read_file", {"path": "notes.txt"}, NOTES), answer=answer)
    passed, why = ev.score(_task("read-notes"), answer, None, turn, tmp_path)
    assert not passed and "compaction's frame" in why, why
    plain = "The summary of notes.txt: the club meets on Saturday, then goes on from here."
    assert ev.frame_text(plain) is None


def test_a_fact_in_an_unnamed_file_must_be_looked_for(tmp_path: Path) -> None:
    task = ev.Task(id="x", kind="unnamed file", prompt="When is the launch?",
                   tools_any=("read_file", "search_files"), answer_all=("14 june",))
    made_up = _turn(answer="On 14 June.")
    assert ev.score(task, "On 14 June.", None, made_up, tmp_path) == (
        False, "none of read_file, search_files was called")
    searched = _turn(("search_files", {"pattern": "launch"}, "notes.md:3: launch 14 June"))
    assert ev.score(task, "On 14 June.", None, searched, tmp_path) == (True, "ok")


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


def _script(body: dict[str, object]) -> Reply:
    """The fake model: lists, then reads what the session's first answer named second."""
    messages = body["messages"]
    assert isinstance(messages, list)
    last = messages[-1]
    if last["role"] == "tool":
        return answer(content=f"It says: {last['content']}")
    asked = last["content"]
    if "second one" in asked:
        earlier = " ".join(str(m.get("content")) for m in messages if m["role"] == "assistant")
        second = earlier.split("The files: ")[1].split(", ")[1]
        return answer(tool_calls=[("read_file", json.dumps({"path": second}))])
    if "journal" in asked:
        return answer(content="The files: journal/monday.md, journal/tuesday.md")
    return answer(content="The files: budget.txt, notes.txt, plants.csv, todo.md")


def test_the_harness_runs_sessions_on_fresh_workspaces_against_a_server(tmp_path: Path) -> None:
    """The same code as `make eval`, against the fake llama-server and the real tool hosts:
    a follow-up runs in its question's session (the answer before it is in its prompt), each
    file's session on a fresh copy of its own workspace, and the rows say where they ran."""
    garden = ev.select([ev.load_file(ev.TASKS)], ["list-root"])
    notes = ev.select([ev.load_file(ev.EVAL_DIR / "notes.toml")], ["n-journal-second"])
    with FakeLlama(_script) as fake:
        base = ev.cfg.parse({}, {"inference": {"url": fake.url}})
        rows = ev.run_tasks([*garden, *notes], base, timeout_s=60)
        opened = [m["content"] for m in fake.requests[-2]["messages"] if m["role"] == "user"]
    got = [(r.task, r.file, r.workspace, r.set, r.passed, r.why) for r in rows]
    assert got == [
        ("list-root", "garden", "garden", "tuned", True, "ok"),
        ("n-journal-list", "notes", "notes", "tuned", True, "ok"),
        ("n-journal-second", "notes", "notes", "tuned", True, "ok"),
    ], rows
    assert opened == ["Which files are in the journal folder?", "What does the second one say?"]
    assert "met aisha" in rows[-1].answer.lower() and rows[-1].tool_calls == 1  # notes/ file


@pytest.mark.embedded
@pytest.mark.baseline("defaults")  # restored, not processed: what is shown is the harness
# A hang guard, not a speed check: two real-model turns beside two other workers' model
# servers on 2 cores took over 120 s once (30 s alone).
@pytest.mark.timeout(1200)
def test_smoke_two_tasks_on_the_embedded_model(tmp_path: Path) -> None:
    require_embedded()
    garden, code = ev.load_file(ev.TASKS), ev.load_file(ev.EVAL_DIR / "code.toml")
    # a turn's timeout well above the hang guard's share: the machine may be loaded
    # the defaults but for the server's threads (tests/support/embedded.py: THREADS)
    base = ev.cfg.Config().replace("embedded", threads=THREADS, model=MODEL)
    rows = ev.run_tasks(ev.select([garden, code], ["read-notes", "c-no-tool-minus"]), base,
                        timeout_s=500)
    out = tmp_path / "eval.json"
    ev.write_json(rows, out, {"config": "defaults"})
    data = json.loads(out.read_text())
    assert [r["task"] for r in data["rows"]] == ["read-notes", "c-no-tool-minus"]
    assert data["meta"]["tasks"] == 2
    for row in rows:
        assert row.prompt_tokens > 0, row  # the model really answered, through the harness
        assert row.seconds > 0 and row.why
        assert row.passed == row.why.startswith("ok"), row
    # "What is 15 minus 6?": after the word "ANSWER " (not "ANSWER: ") the model ended the
    # number after its first digit, "1" (actors/session/smallmodel/decision_word.py)
    assert rows[-1].answer.strip(" .") == "9", rows[-1]
