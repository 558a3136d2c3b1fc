"""`make eval`'s conversations longer than the context (set ``overflow``).

The task files are checked for what makes them measure compaction: at least four sessions
of 20+ turns whose reads add up to several contexts, late questions whose answer is only in
an early turn and others whose answer is only in the file read just before. The harness's
new part (a new session when the context is full, the tokens the server processed, the
per-way tallies) runs against the fake llama-server, which answers "exceeds the context"
once a conversation holds more than a few questions.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from actors.session.compaction import SUMMARY_REQUEST
from scripts import eval as ev
from scripts import eval_overflow as ov
from tests.support.fake_llama import FakeLlama, Reply, answer, context_full, render_prompt

CONTEXT = 8192  # the embedded model's tokens a slot
CHARS_PER_TOKEN = 4  # English prose and code, roughly (the model's tokenizer says ~3.5-4)


def _overflow_files() -> list[ev.TaskFile]:
    return [f for f in ev.task_files() if f.set == "overflow"]


def _read(task: ev.Task) -> str | None:
    path = task.args.get("read_file", {}).get("path")
    return str(path) if path else None


def test_at_least_four_conversations_of_twenty_turns_that_fill_the_context_twice() -> None:
    files = _overflow_files()
    assert len(files) >= 4
    for f in files:
        assert len(ev.sessions(f.tasks)) == 1 and len(f.tasks) >= 20, f.name
        read = sum((ev.WORKSPACES / f.workspace / p).stat().st_size
                   for t in f.tasks if (p := _read(t)))
        capped = sum(min((ev.WORKSPACES / f.workspace / p).stat().st_size, 16_000)
                     for t in f.tasks if (p := _read(t)))  # loop.tool_result_cap
        assert capped == read or capped < read
        assert capped / CHARS_PER_TOKEN >= 2 * CONTEXT, (f.name, capped)


def test_late_questions_need_an_early_turn_or_the_file_just_read() -> None:
    """An early fact's answer is said in the first turns only (the person's words, an early
    question, an early file); a recent fact's answer is in a file read by one of the two
    turns before it, and its question names no file."""
    for f in _overflow_files():
        tasks = list(f.tasks)
        early = [i for i, t in enumerate(tasks) if t.kind == ov.EARLY]
        recent = [i for i, t in enumerate(tasks) if t.kind == ov.RECENT]
        assert len(early) >= 3 and len(recent) >= 3, f.name
        assert min(early) >= len(tasks) * 2 // 3, f.name  # asked late
        first = tasks[: len(tasks) // 4]
        for i in early:
            words = tasks[i].answer_all or tasks[i].answer_any
            said = " ".join(
                [t.prompt for t in first] + [" ".join(t.answer_all + t.answer_any) for t in first]
                + [(ev.WORKSPACES / f.workspace / p).read_text() for t in first
                   if (p := _read(t))]
            ).lower()
            assert any(w.lower() in said for w in words), (tasks[i].id, words)
            later = " ".join(t.prompt for t in tasks[len(tasks) // 4: i]).lower()
            again = [w for w in words if re.search(rf"(?<!\w){re.escape(w.lower())}(?!\w)", later)]
            assert not again, (tasks[i].id, again)  # not said again since
        for i in recent:
            assert _read(tasks[i]) is None and ".md" not in tasks[i].prompt, tasks[i].id
            files = [p for t in tasks[max(0, i - 2): i] if (p := _read(t))]
            assert files, f"{tasks[i].id}: no file read just before"
            text = " ".join((ev.WORKSPACES / f.workspace / p).read_text()[:16_000]
                            for p in files).lower()
            words = tasks[i].answer_all or tasks[i].answer_any
            assert any(w.lower() in text for w in words), (tasks[i].id, words, files)


def test_a_way_names_a_known_compaction() -> None:
    base = ev.cfg.Config()
    with pytest.raises(ValueError, match="unknown way"):
        ov.way_config(base, "summarise")
    with pytest.raises(ValueError, match="needs no compact_at"):
        ov.way_config(base, "new-session@0.5")
    elide = ov.way_config(base, "elide@0.5").session
    assert (elide.compaction, elide.compact_at) == ("elide", 0.5)
    assert ov.way_config(base, "summary").session.compaction == "summary"
    assert ov.way_config(base, "new-session").session.compaction == "off"


def _full_after(questions: int) -> object:
    """The fake model: "exceeds the context" once a prompt holds more than ``questions``
    questions, else an answer that repeats the question."""

    def script(body: dict[str, object]) -> Reply:
        messages = body["messages"]
        assert isinstance(messages, list)
        asked = [m for m in messages if m["role"] == "user"]
        if len(asked) > questions:
            return context_full()
        return answer(content=f"You asked: {asked[-1]['content']}")

    return script


def _tasks(n: int, pad: str = "") -> ev.TaskFile:
    tasks = tuple(ev.Task(id=f"t{i}", kind=ov.RECENT if i % 2 else "no tool",
                          prompt=f"question {i}{pad}", session="s", answer_all=(f"question {i}",))
                  for i in range(1, n + 1))
    return ev.TaskFile("fake", "notes", "overflow", tasks)


def test_a_full_context_goes_on_in_a_new_session(tmp_path: Path) -> None:
    """Without compaction, the turn the context cannot hold is asked again in a new session
    (its prompt holds that question only), and the conversation goes on there; the tally
    counts the turns survived, the sessions and the tokens the server processed."""
    with FakeLlama(_full_after(2)) as fake:
        base = ov.way_config(ev.cfg.parse({}, {"inference": {"url": fake.url}}), "new-session")
        rows = ev.run_tasks([_tasks(5)], base, timeout_s=60, restart=True, way="new-session")
        prompts = [[m["content"] for m in r["messages"] if m["role"] == "user"]
                   for r in fake.requests]
    assert [(r.task, r.passed, r.restarted) for r in rows] == [
        ("t1", True, False), ("t2", True, False), ("t3", True, True), ("t4", True, False),
        ("t5", True, True),
    ], rows
    answered = [p for p in prompts if len(p) <= 2]
    assert answered[2] == ["question 3"] and answered[3] == ["question 3", "question 4"]
    assert all(r.processed > 0 and r.way == "new-session" for r in rows)
    (tally,) = ov.tallies(rows)
    assert (tally.turns, tally.passed, tally.survived, tally.sessions) == (5, 5, 2, 3)
    assert tally.recent == (3, 3) and tally.processed == sum(r.processed for r in rows)
    out = tmp_path / "eval.json"
    ev.write_json(rows, out, {"overflow": ov.summary_json(rows)})
    data = json.loads(out.read_text())
    assert data["meta"]["overflow"]["per_way"][0]["sessions"] == 3
    assert data["meta"]["tasks"] == 0  # the overflow rows are reported apart


def test_a_restarted_turn_counts_what_the_full_session_spent_on_it() -> None:
    """The turn the context cannot hold first calls a tool in the full session (700 tokens
    processed) and fails on the call's result; asked again in a new session it calls and
    answers (700 + 10). Its row counts both attempts: 1,410 tokens, not 710."""

    def script(body: dict[str, object]) -> Reply:
        messages = body["messages"]
        assert isinstance(messages, list)
        asked = [m for m in messages if m["role"] == "user"]
        if messages[-1]["role"] == "tool":
            if len(asked) > 2:
                return context_full()
            return answer(content=f"You asked: {asked[-1]['content']}",
                          timings={"prompt_n": 10})
        if asked[-1]["content"] == "question 3":
            return answer(tool_calls=[("list_dir", "{}")], timings={"prompt_n": 700})
        return answer(content=f"You asked: {asked[-1]['content']}", timings={"prompt_n": 10})

    with FakeLlama(script) as fake:
        base = ov.way_config(ev.cfg.parse({}, {"inference": {"url": fake.url}}), "new-session")
        rows = ev.run_tasks([_tasks(4)], base, timeout_s=60, restart=True, way="new-session")
    assert [(r.task, r.passed, r.restarted) for r in rows] == [
        ("t1", True, False), ("t2", True, False), ("t3", True, True), ("t4", True, False),
    ], rows
    assert [r.processed for r in rows] == [10, 10, 1410, 10], rows


def test_without_restart_every_later_turn_fails_full(tmp_path: Path) -> None:
    """What restart=True changes: without it the full session fails each later turn."""
    with FakeLlama(_full_after(2)) as fake:
        base = ov.way_config(ev.cfg.parse({}, {"inference": {"url": fake.url}}), "new-session")
        rows = ev.run_tasks([_tasks(4)], base, timeout_s=60)
    assert [r.passed for r in rows] == [True, True, False, False]
    assert all(r.why.startswith("SessionFull") for r in rows[2:]), rows
    assert ov.tallies(rows)[0].survived == 4 and not any(r.restarted for r in rows)


def test_with_compaction_the_conversation_survives_in_one_session() -> None:
    """Way elide on a 1,000-token context: the turns past compact_at compact instead of
    starting over; the rows count the compactions, the tally one session, every turn
    survived."""
    echo = lambda body: answer(  # noqa: E731
        content=f"You asked: {[m for m in body['messages'] if m['role'] == 'user'][-1]['content']}")
    with FakeLlama(echo, props={"n_ctx": 1000}) as fake:
        base = ov.way_config(ev.cfg.parse({}, {"inference": {"url": fake.url}}), "elide")
        rows = ov.run_overflow([_tasks(10, " more" * 60)], base, ["elide"], timeout_s=60)
    (tally,) = ov.tallies(rows)
    assert (tally.turns, tally.passed, tally.survived, tally.sessions) == (10, 10, 10, 1), rows
    assert tally.compactions >= 2 and not any(r.restarted for r in rows)
    assert tally.processed == sum(r.processed for r in rows) > 0
    assert tally.written == 0  # no model wrote a summary


def test_a_summary_requests_tokens_count_in_the_turn_that_compacted() -> None:
    """Way summary: the summary request writes no Usage record, yet its prompt tokens
    processed (the server's prompt_n) count in the turn that compacted, and the tokens it
    wrote are tallied apart."""

    def script(body: dict[str, object]) -> Reply:
        messages = body["messages"]
        assert isinstance(messages, list)
        last = str(messages[-1]["content"])
        if last.startswith(SUMMARY_REQUEST[:40]):  # more than any prompt of this context
            return answer(content="The person asked questions.", timings={"prompt_n": 5000},
                          usage={"prompt_tokens": 900, "completion_tokens": 45})
        asked = [m for m in messages if m["role"] == "user"][-1]["content"]
        return answer(content=f"You asked: {asked}")

    with FakeLlama(script, props={"n_ctx": 1000}) as fake:
        base = ov.way_config(ev.cfg.parse({}, {"inference": {"url": fake.url}}), "summary")
        rows = ov.run_overflow([_tasks(10, " more" * 60)], base, ["summary"], timeout_s=60)
    (tally,) = ov.tallies(rows)
    assert (tally.passed, tally.sessions) == (10, 1) and tally.compactions >= 2, rows
    for r in rows:
        assert (r.processed >= 5000) == (r.compactions > 0), r
        assert r.written == 45 * r.compactions, r
    assert tally.written == 45 * tally.compactions


def test_the_overflow_set_runs_only_when_asked_for() -> None:
    files = ev.task_files()
    sets = {f.set for f in ev.chosen(files, [], [])}
    assert "overflow" not in sets and {"tuned", "never-tuned"} <= sets
    assert {f.set for f in ev.chosen(files, ["overflow"], [])} == {"overflow"}
    (one,) = ev.chosen(files, [], ["od-03"])
    assert [t.id for t in one.tasks] == ["od-01", "od-02", "od-03"]
    assert ev.chosen(_overflow_files()[:1], [], [], named=True) == _overflow_files()[:1]


_PATH = re.compile(r"(?:[\w-]+/)*[\w-]+\.(?:md|py|toml)|Makefile")


def _reader(n_ctx: int) -> object:
    """A fake model that reads the file a question names and answers in one sentence, and
    answers "exceeds the context" as llama-server does (the fake's 4 characters a token)."""

    def script(body: dict[str, object]) -> Reply:
        tokens = len(render_prompt(body)) // 4
        if tokens > n_ctx:
            return context_full(tokens, n_ctx)
        messages = body["messages"]
        assert isinstance(messages, list)
        text = str(messages[-1].get("content") or "")
        found = _PATH.search(text)
        if messages[-1]["role"] == "user" and not text.startswith("Question:") and found:
            return answer(tool_calls=[("read_file", json.dumps({"path": found.group(0)}))])
        return answer(content="From what I read, the answer is in that file.")

    return script


def test_each_conversation_overflows_the_context_at_least_twice() -> None:
    """On the embedded model's context with its baseline, each conversation's reads fill the
    context at least twice: compaction (elide) compacts at least twice and every turn
    survives; without it, at least two new sessions are needed."""
    files = _overflow_files()
    embedded = ev.cfg.Config().embedded
    with FakeLlama(_reader(CONTEXT), props={"n_ctx": CONTEXT}) as fake:
        base = ev.cfg.parse({}, {"inference": {"url": fake.url}, "session": {
            "system": embedded.system, "pinned": list(embedded.pinned), "tool_results": "user"}})
        rows = ov.run_overflow(files, base, ["elide", "new-session"], timeout_s=60)
    found = {(t.file, t.way): t for t in ov.tallies(rows)}
    assert len(found) == 2 * len(files)
    for f in files:
        elide, fresh = found[f.name, "elide"], found[f.name, "new-session"]
        assert elide.compactions >= 2 and elide.survived == elide.turns, elide
        assert elide.sessions == 1 and fresh.compactions == 0, (elide, fresh)
        assert fresh.sessions >= 3 and fresh.survived < fresh.turns, fresh
