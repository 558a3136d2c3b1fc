"""Compaction's pure parts: where the verbatim part starts, and the elided summary."""

from __future__ import annotations

import datetime as dt

from actors.log.records import (
    Assistant,
    Baseline,
    Cut,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from actors.session.compaction import (
    CEILING,
    ELIDE_HEADER,
    ROOM_TURNS,
    Choice,
    choose_kept,
    elide,
    kept_turns,
    summary_budget,
    threshold,
)
from actors.session.messages import view
from actors.tools.protocol.spec import ResultClass

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
BASE = Baseline(system="sys", tools=(), model="m", created=T0)


def read(i: str, path: str) -> Assistant:
    call = ToolCall(id=i, name="read_file", arguments=f'{{"path": "{path}"}}')
    return Assistant(content=None, reasoning=None, tool_calls=(call,))


def result(i: str, content: str) -> ToolResult:
    return ToolResult(call=1, tool_call_id=i, content=content, class_=ResultClass.PUBLIC,
                      untrusted=False, truncated=False)


def usage() -> Usage:
    return Usage(timings={}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=1,
                 completion_tokens=1, finish_reason="stop")


def answer(text: str) -> Assistant:
    return Assistant(content=text, reasoning=None)


# Three whole turns, each: User, a read, its usage, the result, the answer, its usage.
RECORDS: list[Record] = [BASE]
for n, name in enumerate(["a.txt", "b.txt", "c.txt"]):
    RECORDS += [User(content=f"What does {name} say?"), read(f"c{n}", name), usage(),
                result(f"c{n}", f"{name} says {n}" * (1 + 100 * (n == 1))), answer(f"It says {n}."),
                usage()]
STARTS = [i for i, r in enumerate(RECORDS) if isinstance(r, User)]  # 1, 7, 13


def sizes(records: list[Record], each: int = 10) -> dict[int, int]:
    return {i: each for i in range(1, len(records))}


def test_keeps_the_last_whole_turns_that_fit_the_keep_budget() -> None:
    shown = view(RECORDS)
    # a turn is 4 records that render (User, call, result, answer), 10 tokens each: 40
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=85, room=1000, pending=False) \
        == Choice(kept=STARTS[1], turns=2)
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=79, room=1000, pending=False) \
        == Choice(kept=STARTS[2], turns=1)


def test_a_pending_message_may_keep_no_logged_turn() -> None:
    shown = view(RECORDS)
    end = len(RECORDS)
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=39, room=39, pending=True) \
        == Choice(kept=end, turns=1)
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=40, room=1000, pending=True) \
        == Choice(kept=STARTS[2], turns=2)


def test_the_turn_in_progress_is_kept_whole_when_it_fits_the_room_but_not_the_budget() -> None:
    shown = view(RECORDS)
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=10, room=40, pending=False) \
        == Choice(kept=STARTS[2], turns=1)


def test_the_turn_in_progress_is_cut_between_responses_only_when_it_cannot_fit_whole() -> None:
    recs = [*RECORDS[:-2]]  # turn 3 in progress: User, read, usage, result
    recs += [read("d", "d.txt"), usage(), result("d", "d" * 50)]  # a second read in it
    shown = view(recs)
    second_read = len(recs) - 3
    each = sizes(recs)
    # the turn's 5 records that render are 50 tokens; from its first read on 40, second 20,
    # and its question (10) with either: a cut between responses keeps the question (so a cut
    # at the first read, the question and all after it, is the whole turn: kept as such)
    assert choose_kept(recs, shown, each, keep=10, room=50, pending=False) \
        == Choice(kept=STARTS[2], turns=1)
    assert choose_kept(recs, shown, each, keep=10, room=49, pending=False) \
        == Choice(kept=second_read, turns=1)
    # a call is never split from its result: nothing smaller fits, nothing helps
    assert choose_kept(recs, shown, each, keep=10, room=29, pending=False) is None


def test_nothing_to_drop_nothing_helps() -> None:
    recs: list[Record] = [BASE, User(content="only")]
    assert choose_kept(recs, view(recs), sizes(recs), keep=0, room=0, pending=False) is None
    assert choose_kept([BASE], view([BASE]), {}, keep=0, room=0, pending=True) is None


def test_kept_turns_counts_the_verbatim_turn_starts() -> None:
    assert kept_turns(RECORDS, view(RECORDS)) == 3
    assert kept_turns(RECORDS, view(RECORDS).before(STARTS[1])) == 1


def test_elide_lists_messages_calls_with_result_sizes_and_answers() -> None:
    dropped = [i for i in view(RECORDS).live if i < STARTS[2]]
    text = elide(RECORDS, dropped, None, cap=4000)
    lines = text.splitlines()
    assert lines[0] == ELIDE_HEADER
    assert lines[1] == "- The person asked: What does a.txt say?"
    assert lines[2] == """  - You called read_file {"path": "a.txt"}: it returned 'a.txt says 0'"""
    assert lines[3] == "  - You answered: It says 0."
    big = len("b.txt says 1" * 101)
    assert lines[5] == (f"""  - You called read_file {{"path": "b.txt"}}: it returned {big:,} """
                        "characters")
    assert "c.txt" not in text


def test_elide_keeps_every_question_and_the_newest_details_within_its_cap() -> None:
    dropped = list(view(RECORDS).live)
    whole = elide(RECORDS, dropped, None, cap=10_000)
    short = elide(RECORDS, dropped, None, cap=250)
    assert len(short) <= 250
    assert short.splitlines()[0] == ELIDE_HEADER
    asked = [line for line in whole.splitlines() if line.startswith("- The person asked")]
    assert [line for line in short.splitlines() if line.startswith("- The")] == asked
    assert short.splitlines()[-1] == whole.splitlines()[-1]  # the newest detail stays
    assert "lines left out" not in short and "again to see them" not in whole


def test_the_persons_questions_survive_every_compaction_the_first_included() -> None:
    """Forty turns, compacted one at a time, each summary made from the one before: the
    first question (and the newest) is still there, within the cap; before, the oldest lines
    went first ("What was the first question I asked you?" could not be answered)."""
    summary: str | None = None
    records: list[Record] = [BASE]
    for n in range(1, 41):
        start = len(records)
        records += [User(content=f"Question {n}: what does file{n}.txt say about the plan? "
                                 + "Please be thorough. " * 10),
                    read(f"c{n}", f"file{n}.txt"), usage(), result(f"c{n}", "x" * 900),
                    answer(f"It says {n}. " * 20), usage()]
        summary = elide(records, list(range(start, len(records))), summary, cap=2048)
        assert len(summary) <= 2048
        assert "Question 1:" in summary and f"Question {n}:" in summary, (n, summary)
    assert summary is not None and sum("Question" in line for line in summary.splitlines()) > 20
    old = "\n".join([ELIDE_HEADER, "(61 earlier lines left out)", "- The person asked: a"])
    assert elide([BASE], [], old, cap=2048).splitlines()[1:] == ["- The person asked: a"]


def test_elide_of_call_tool_shows_the_inner_arguments_and_a_missing_result() -> None:
    inner = ToolCall(id="x", name="call_tool",
                     arguments='{"name": "list_dir", "arguments": {"path": "src"}}')
    recs: list[Record] = [BASE, User(content="ls"),
                          Assistant(content=None, reasoning=None, tool_calls=(inner,))]
    text = elide(recs, [1, 2], "earlier line", cap=1000)
    assert text.splitlines()[1:] == [
        "earlier line", "- The person asked: ls",
        """  - You called list_dir {"path": "src"}: no result""",
    ]


def test_the_threshold_stays_compact_at_where_the_baseline_leaves_room() -> None:
    """The embedded default's 0.4 at 8,192 tokens, a 1,170-token baseline, short turns: the
    share measured on the long chat (3,276 tokens), unchanged."""
    fixed = 1170 + 40 + summary_budget(512, 8192)
    assert threshold(8192, 0.4, fixed, turn=60) == int(0.4 * 8192)
    assert threshold(8192, 0.8, fixed, turn=60) == int(0.8 * 8192)


def test_the_threshold_leaves_room_for_turns_after_what_a_compaction_cannot_free() -> None:
    """0.4 of 4,096 is 1,638 tokens: less than the baseline (1,170) and one pasted page (456)
    with the summary's budget (409). Raised to the baseline, the frame, the budget and three
    turns of the current size: the one sent with the compaction and two more after it."""
    budget = summary_budget(512, 4096)
    assert budget == 409
    fixed = 1170 + 40 + budget
    assert threshold(4096, 0.4, fixed, turn=456) == fixed + ROOM_TURNS * 456 == 2987
    assert threshold(4096, 0.4, fixed, turn=456) - fixed - 456 >= 2 * 456  # two turns after
    # never past CEILING of the context, whatever the turn; never below compact_at
    assert threshold(4096, 0.4, fixed, turn=2000) == int(CEILING * 4096)
    assert threshold(4096, 0.9, fixed, turn=2000) == int(0.9 * 4096)
    assert threshold(4096, 0.4, 0, turn=0) == int(0.4 * 4096)


def test_the_turn_before_that_read_something_is_kept_past_the_budget_when_it_fits_the_room(
        ) -> None:
    """A read, then a follow-up that compacts: the file just read stays (it was dropped at
    once, and the follow-up answered from nothing). A turn that read nothing is not."""
    shown, end = view(RECORDS), len(RECORDS)
    assert choose_kept(RECORDS, shown, sizes(RECORDS), keep=39, room=40, pending=True) \
        == Choice(kept=STARTS[2], turns=2)
    talk: list[Record] = [BASE, User(content="a"), answer("1"), usage(), User(content="b"),
                          answer("2"), usage()]
    assert choose_kept(talk, view(talk), sizes(talk), keep=19, room=1000, pending=True) \
        == Choice(kept=len(talk), turns=1)
    assert end == STARTS[2] + 6


def test_an_answer_cut_as_an_echo_is_not_in_the_summary() -> None:
    """Its passage, written in the summary as an answer, would be given again."""
    usage = Usage(timings={}, reasoning_tokens=0, thinking_capped=False, prompt_tokens=1,
                  completion_tokens=1, finish_reason="echo")
    recs: list[Record] = [BASE, User(content="Which Python?"),
                          Assistant(content="The Pallets organization develops", reasoning=None),
                          usage, Cut(why="echo", note="answer cut"), User(content="And now?")]
    text = elide(recs, [1, 2, 3, 4], None, cap=4000)
    assert "Pallets" not in text and "- The person asked: Which Python?" in text
    recs[4] = Cut(why="copy", note="answer cut")
    assert "You answered: The Pallets" in elide(recs, [1, 2, 3, 4], None, cap=4000)
