"""Answers loopd cuts, end to end: runaway text (a repeat, a copy of the prompt) and a
request that ended after the answer began are kept, marked cut, and said (the event, the
live view, the summary line, the log); a question left unanswered is marked so for the
model when the next one comes."""

from __future__ import annotations

import io
import json
import textwrap
from collections.abc import Callable

import pytest
from rich.console import Console

from actors.base.cancel import CancelToken
from actors.base.errors import Cancelled
from actors.base.events import AnswerCut, Content, Event
from actors.cli.view import LiveView, describe, summary
from actors.inference.runaway import pieces
from actors.log.records import Assistant, Cut, Usage
from actors.session.messages import ECHOED, UNANSWERED
from actors.session.turn import run_turn
from tests.support.fake_llama import Runaway, answer, cut_stream, endless, stall
from tests.support.turn_rig import Rig
from tests.support.watch import HANG_S

Make = Callable[..., Rig]
# Notes a person pastes: ~500 pieces, no run of them repeated.
ITEMS = ("first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
         "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth "
         "twentieth next last other small large blue green red old new oak pine elm ash")
NOTES = " ".join(f"Row {k} of the store lists the {w} item by its code."
                 for k, w in enumerate(ITEMS.split(" ")))


def shown(events: list[Event]) -> str:
    buf = io.StringIO()
    live = LiveView(Console(file=buf, width=300, color_system=None))
    for event in events:
        live(event)
    live.finish()
    return buf.getvalue()


def last_cut(r: Rig) -> tuple[Usage, Cut]:
    usage, cut = r.records[-2:]
    assert isinstance(usage, Usage) and isinstance(cut, Cut)
    return usage, cut


def test_a_repeating_answer_is_cut_kept_and_said(rig: Make) -> None:
    sent = Runaway()
    r = rig([endless("Let me check the files again. ", runaway=sent), answer("Fine.")])
    out = r.turn("What is in the workspace?")
    assert out.cut and out.content.startswith("Let me check the files again. ")
    # the default limit, one period (7 pieces) and the word being cut
    assert len(pieces(out.content)) <= 256 + 7 + 1
    assert r.kinds() == ["User", "Assistant", "Usage", "Cut"]
    usage, cut = last_cut(r)
    assert (usage.finish_reason, cut.why) == ("repeat", "repeat")
    assert "loop.runaway_repeat_tokens = 256" in cut.note
    assert "answer cut" in describe(cut) and cut.note in describe(cut)  # loopd log show
    assert "answer cut: it repeated itself" in summary(out, 1.0)
    assert "loop.runaway_repeat_tokens = 256" in shown(r.events)
    assert sent.gone.wait(HANG_S)  # the stream was closed: the server stops generating
    assert r.turn("And now?").content == "Fine."  # the session goes on


def test_an_answer_copying_the_message_back_is_cut(rig: Make) -> None:
    r = rig([endless(lambda body: body["messages"][-1]["content"])])
    out = r.turn(NOTES + " Reply with OK.")
    usage, cut = last_cut(r)
    assert out.cut and (usage.finish_reason, cut.why) == ("copy", "copy")
    assert 400 <= len(pieces(out.content)) <= 400 + 8
    assert "copy the prompt word for word" in shown(r.events)
    assert "answer cut: it copied the prompt" in summary(out, 1.0)


def test_a_long_right_answer_with_a_list_and_code_is_not_cut(rig: Make) -> None:
    code = "\n".join(f"def check_{w}(x):\n    return x.{w} is not None\n" for w in
                     NOTES.split()[:60:3])
    text = "Here is the list:\n" + NOTES.replace(". ", ".\n- ") + "\n```python\n" + code + "```"
    r = rig([answer(text, chunk=3)], max_tokens=10_000)
    out = r.turn("Write the checks.")
    assert (out.content, out.cut) == (text, False)
    assert r.kinds() == ["User", "Assistant", "Usage"]


def test_a_timed_out_answer_is_kept_and_marked_cut(rig: Make) -> None:
    r = rig([stall(after_events=6), answer("Later.")], inference={"timeout_s": 1.0})
    out = r.turn("List the files in src.")
    assert out.cut and out.content == "The files ar"  # what streamed, in the log too
    assistant = r.records[-3]
    assert isinstance(assistant, Assistant) and assistant.content == "The files ar"
    usage, cut = last_cut(r)
    assert (usage.finish_reason, cut.why) == ("timeout", "timeout")
    assert "inference.timeout_s = 1 s" in cut.note and cut.note in shown(r.events)
    assert "answer cut: the request timed out" in summary(out, 1.0)
    assert [e.why for e in r.events if isinstance(e, AnswerCut)] == ["timeout"]


def test_a_cancelled_question_is_marked_unanswered_for_the_next_turn(rig: Make) -> None:
    r = rig([stall(after_events=6), answer("src holds main.py.")])
    cancel = CancelToken()

    def sink(event: Event) -> None:
        if isinstance(event, Content):
            cancel.cancel()  # the person stops turn 1 mid-answer

    with pytest.raises(Cancelled):
        run_turn(r.log, r.runtime, "The fourth one: what does it say?", sink, cancel)
    assert r.kinds() == ["User"]  # a cancel keeps nothing of the answer
    assert r.turn("List the files in src.").content == "src holds main.py."
    sent = r.fake.requests[1]["messages"]
    assert sent[-3:] == [
        {"role": "user", "content": "The fourth one: what does it say?"},
        {"role": "assistant", "content": UNANSWERED},
        {"role": "user", "content": "List the files in src."},
    ]


def test_a_stream_broken_after_the_retries_keeps_the_last_ones_text(rig: Make) -> None:
    r = rig([cut_stream(6) for _ in range(3)] + [answer("Next.")])  # retries = 2
    out = r.turn("List the files in src.")
    assert out.cut and out.content == "The files ar" and len(r.fake.requests) == 3
    usage, cut = last_cut(r)
    assert (usage.finish_reason, cut.why) == ("error", "error") and "closed" in cut.note
    assert "answer cut: the stream failed" in summary(out, 1.0)


DONATE = ("The Pallets organization develops and supports Click and other popular packages. "
          "In order to grow the community of contributors and users, and allow the "
          "maintainers to devote more time to the projects, [please donate today][].")
README = "".join(f"{n}: {line}\n" for n, line in enumerate((  # as read_file shows a file
    "Metadata-Version: 2.4", "Name: click", "Version: 8.5.1", "Requires-Python: >=3.10",
    "License-Expression: BSD-3-Clause", "", "# Click", "## Donate", "",
    *textwrap.wrap(DONATE, 72)), start=1))
GLOBALS = "def push_context(ctx):\n    _local.__dict__.setdefault('stack', []).append(ctx)\n"


def read(text: str) -> tuple[str, str]:
    return ("call_tool", json.dumps({"name": "echo", "arguments": {"text": text}}))


def test_a_passage_an_earlier_answer_copied_is_cut_when_given_to_another_question(
        rig: Make) -> None:
    """The long chat on click: after one read of PKG-INFO, its "Donate" paragraph was the
    answer to the version, then to the Python version, the licence and push_context. The
    first copy may be a quote; the same passage given again to another question is cut,
    said, and the session goes on."""
    r = rig([answer(tool_calls=[read(README)]), answer(DONATE),
             answer(tool_calls=[read(README)]), answer(DONATE),
             answer(tool_calls=[read(GLOBALS)]), answer(DONATE),
             answer("It requires Python 3.10 or later."),
             answer(f"{ECHOED} The licence is BSD-3-Clause.")])
    assert r.turn("Read PKG-INFO and tell me the version.").content == DONATE  # a quote, once
    for question in ("Which Python version does it require?",
                     "Read click/globals.py. What does push_context do?"):
        out = r.turn(question)
        usage, cut = last_cut(r)
        assert out.cut and (usage.finish_reason, cut.why) == ("echo", "echo")
        assert DONATE.startswith(out.content) and len(pieces(out.content)) == 32
        assert "loop.runaway_echo_tokens = 32" in cut.note and cut.note in shown(r.events)
        assert "answer cut: it gave again what an earlier answer copied" in summary(out, 1.0)
    assert r.turn("Which Python version does it require?").content.endswith("3.10 or later.")
    # the model is shown each cut answer as no answer, not the passage again
    said = [m["content"] for m in r.fake.requests[-1]["messages"] if m["role"] == "assistant"]
    assert said.count(ECHOED) == 2 and sum(DONATE[:40] in m for m in said) == 1
    # and the model copying that text (it did, once, on the chat over click) does not
    # reach the answer
    assert r.turn("Under which licence is it?").content == "The licence is BSD-3-Clause."


def test_the_same_facts_again_or_the_same_question_again_are_not_cut(rig: Make) -> None:
    """long.toml's right answers: "What does todo.txt say?" told again, word for word, what
    the answer to "Which tasks in todo.txt are done?" said in the model's own words (42
    pieces); and the same question asked again gets the same quote."""
    told = ("The tasks in todo.txt are to do this week, renew the passport, book a dentist "
            "appointment, call the plumber about the kitchen leak, pay the electricity bill, "
            "and buy a birthday present for Sam.")
    todo = ("- [x] Renew passport\n- [ ] Book dentist\n- [ ] Call plumber (kitchen leak)\n"
            "- [x] Pay electricity\n- [ ] Present for Sam\n")
    r = rig([answer(tool_calls=[read(todo)]), answer(told),
             answer(tool_calls=[read(todo)]), answer(told),
             answer(tool_calls=[read(README)]), answer(DONATE),
             answer(tool_calls=[read(README)]), answer(DONATE)])
    assert r.turn("Which tasks in todo.txt are done?").content == told
    assert r.turn("What does todo.txt say?").content == told
    assert r.turn("What does the README say about donating?").content == DONATE
    out = r.turn("What does the README say about donating?")
    assert (out.content, out.cut) == (DONATE, False)
    assert not any(isinstance(x, Cut) for x in r.records)


def test_a_file_read_with_numbered_lines_copied_out_is_cut(rig: Make) -> None:
    """read_file shows "12: " before each line; the model copies the lines without their
    numbers (a README copied out word for word). With the numbers in the way no run was
    longer than a line, and the copy ran to max_tokens."""
    lines = textwrap.wrap(NOTES, 60)
    numbered = "".join(f"{n}: {line}\n" for n, line in enumerate(lines, start=1))
    r = rig([answer(tool_calls=[read(numbered)]), answer("\n".join(lines))])
    out = r.turn("Read notes.md and say what it is for.")
    usage, cut = last_cut(r)
    assert out.cut and (usage.finish_reason, cut.why) == ("copy", "copy")
    # the limit, and where the run followed another sentence's start (they share 7 pieces)
    assert 400 <= len(pieces(out.content)) <= 420 < len(pieces(NOTES))
