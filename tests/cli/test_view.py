"""actors/cli/view.py: what the person sees (the live view, JSON lines, log lines, the summary)."""

from __future__ import annotations

import datetime as dt
import io
import json
import threading

import pytest
from rich.console import Console

from actors.base import events as ev
from actors.cli.view import JsonView, LiveView, describe, summary
from actors.log import records as rec
from actors.session.turn import TurnOutcome
from actors.tools.protocol.spec import ResultClass

WHEN = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
# Text a model or a tool may well send, that rich would read as markup if it were given it.
MARKUP = ["[bold]loud[/bold]", "a [/] b", "[red]", "x[/]", "[link=http://127.0.0.1]y[/link]"]


def _console(*, terminal: bool = False) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    console = Console(file=buf, width=200, force_terminal=terminal, color_system=None,
                      legacy_windows=False)
    return console, buf


def _shown(*events: ev.Event) -> str:
    console, buf = _console()
    live = LiveView(console)
    for event in events:
        live(event)
    live.finish()
    return buf.getvalue()


def _usage(**fields: object) -> rec.Usage:
    base: dict[str, object] = dict(timings={"cache_n": 30}, reasoning_tokens=0,
                                   thinking_capped=False, prompt_tokens=120,
                                   completion_tokens=7, finish_reason="stop", time=WHEN)
    base.update(fields)
    return rec.Usage(**base)  # type: ignore[arg-type]


# --- summary -------------------------------------------------------------------------------


def test_the_summary_line_counts_tokens_cache_time_and_tool_calls() -> None:
    outcome = TurnOutcome(content="ok", usage=_usage(), iterations=1, tool_calls=2, cut=False)
    assert summary(outcome, 1.26) == (
        "120 prompt tokens (30 from cache) · 7 generated · 1.3 s · 2 tool calls"
    )


def test_the_summary_says_one_tool_call_and_an_answer_cut_at_max_tokens() -> None:
    outcome = TurnOutcome(content="ok", usage=_usage(timings={}), iterations=1, tool_calls=1,
                          cut=True)
    line = summary(outcome, 0.04)
    assert "(0 from cache)" in line
    assert line.endswith("0.0 s · 1 tool call · answer cut at loop.max_tokens")


# --- describe ------------------------------------------------------------------------------


def test_each_record_kind_has_a_readable_line() -> None:
    baseline = rec.Baseline(system="Be brief.", tools=({"function": {"name": "read_file"}},
                                                       {"type": "function"}),
                            model="qwen", created=WHEN)
    assert describe(baseline) == "model qwen; tools: read_file, ?; system: Be brief."
    assert describe(rec.User(content="hi\n  there", time=WHEN)) == "hi there"
    call = rec.ToolCall(id="c1", name="read_file", arguments='{"path": "a"}')
    assistant = rec.Assistant(content="", reasoning="think", tool_calls=(call,), time=WHEN)
    assert describe(assistant) == (
        ' [reasoning: 5 chars] -> read_file({"path": "a"}) id=c1'
    )
    assert describe(_usage(thinking_capped=True, reasoning_tokens=3)) == (
        "120 prompt (30 cached), 7 generated, 3 reasoning, finish stop, thinking capped"
    )
    loss = rec.CacheLoss(expected=100, got=10, cause="the server dropped the slot's cache",
                         time=WHEN)
    assert describe(loss) == (
        "prompt cache lost: expected 100 tokens, reused 10 (the server dropped the slot's cache)"
    )
    result = rec.ToolResult(call=2, tool_call_id="c1", content="text", class_=ResultClass.SECRET,
                            untrusted=True, truncated=True, time=WHEN)
    assert describe(result) == "call 2 (id c1) secret untrusted truncated: text"


def test_long_text_in_a_line_is_flattened_and_shortened_with_an_ellipsis() -> None:
    line = describe(rec.User(content="word " * 100, time=WHEN))
    assert len(line) == 160
    assert line == ("word " * 100)[:157] + "..."
    assert "\n" not in describe(rec.User(content="a\n\nb\tc", time=WHEN))


def test_a_usage_line_says_what_the_slot_keeper_did() -> None:
    kept = rec.SlotUse("http://127.0.0.1:1", 0, rec.SlotState.KEPT)
    assert describe(_usage(slot=kept)).endswith(
        "; http://127.0.0.1:1 slot 0: state kept in the slot"
    )
    none = rec.SlotUse("http://127.0.0.1:1", 2, rec.SlotState.NONE)
    assert describe(_usage(slot=none)).endswith("slot 2: nothing restored (nothing saved)")
    assert describe(_usage()).endswith("finish stop")  # an old log: no slot


# --- the live view -------------------------------------------------------------------------


def test_reasoning_then_the_answer_stream_each_on_lines_of_their_own() -> None:
    shown = _shown(ev.Reasoning("Let me "), ev.Reasoning("think."), ev.Content("The "),
                   ev.Content("answer."))
    assert shown == "Let me think.\nThe answer.\n"


def test_a_tool_call_interrupts_the_answer_on_a_new_line_with_its_result() -> None:
    shown = _shown(
        ev.Content("Looking."),
        ev.ToolCallStarted(name="read_file", call=1, arguments='{"path": "a.txt"}'),
        ev.ToolResultEvent(name="read_file", call=1, class_="public", truncated=True,
                           outcome="result"),
    )
    assert shown.splitlines() == [
        "Looking.", '→ read_file {"path": "a.txt"}', "  ← read_file: result, public (truncated)",
    ]


def test_long_arguments_are_shortened_to_120_characters() -> None:
    shown = _shown(ev.ToolCallStarted(name="write_file", call=1, arguments="x" * 500))
    assert shown == "→ write_file " + "x" * 117 + "...\n"


def test_a_retry_after_streamed_text_says_the_partial_answer_is_dropped() -> None:
    shown = _shown(ev.Content("Half an ans"), ev.Retrying(attempt=2, delay=0.5, reason="HTTP 503"))
    assert shown.splitlines() == [
        "Half an ans", "retrying (2) in 0.5 s: HTTP 503 (the partial answer above is dropped)",
    ]
    assert _shown(ev.Retrying(attempt=1, delay=1.0, reason="refused")) == (
        "retrying (1) in 1.0 s: refused\n"
    )


def test_notices_for_a_cache_loss_capped_thinking_and_a_queue() -> None:
    shown = _shown(
        ev.CacheLossEvent(expected=100, got=4, cause="the restore of 96 tokens did not take"),
        ev.ThinkingCapped(tokens=2048, cap=2048),
        ev.Queued(ahead=2, waiting_for="a free slot"),
    )
    assert shown.splitlines() == [
        "prompt cache lost: 4 of 100 tokens reused (the restore of 96 tokens did not take)",
        "thinking capped at 2048 tokens",
        "queued: waiting for a free slot (2 in line)",
    ]


def test_the_prompt_bar_goes_away_before_the_answer() -> None:
    """Transient: the bar is drawn while the prompt is processed, then its line is erased
    (cursor up, erase line) so that only the answer is left on the terminal."""
    console, buf = _console(terminal=True)
    live = LiveView(console)
    live(ev.Progress(processed=10, total=100, cache=5))
    live(ev.Progress(processed=100, total=100, cache=5))
    live(ev.Content("Done."))
    live.finish()
    drawn, after = buf.getvalue().split("100/100 tokens (5 cached)")
    assert "prompt" in drawn
    assert after.endswith("\x1b[1A\x1b[2KDone.\n")


def test_the_answer_can_stream_to_its_own_console() -> None:
    view, view_buf = _console()
    answer, answer_buf = _console()
    live = LiveView(view, answer=answer)
    live(ev.Reasoning("hmm"))
    live(ev.Content("42"))
    live(ev.ToolCallStarted(name="f", call=1, arguments="{}"))
    live.finish()
    assert answer_buf.getvalue() == "42\n"
    assert view_buf.getvalue() == "hmm\n→ f {}\n"


@pytest.mark.parametrize("text", MARKUP)
def test_answer_and_reasoning_text_is_shown_as_it_is(text: str) -> None:
    assert _shown(ev.Content(text)) == text + "\n"
    assert _shown(ev.Reasoning(text)) == text + "\n"


@pytest.mark.parametrize("text", MARKUP)
def test_markup_in_a_tool_call_is_shown_as_it_is(text: str) -> None:
    """A model's arguments (and its tool names) are text: "[/]" must not raise, "[bold]"
    must not vanish into a style."""
    shown = _shown(
        ev.ToolCallStarted(name=f"n{text}", call=1, arguments=f'{{"q": "{text}"}}'),
        ev.ToolResultEvent(name=f"n{text}", call=1, class_="public", truncated=False,
                           outcome="result"),
    )
    assert shown.splitlines() == [
        f'→ n{text} {{"q": "{text}"}}', f"  ← n{text}: result, public",
    ]


@pytest.mark.parametrize("text", MARKUP)
def test_markup_in_a_retry_reason_or_a_cache_loss_cause_is_shown_as_it_is(text: str) -> None:
    """A server's error text and the keeper's reasons come from outside loopd too."""
    shown = _shown(
        ev.Retrying(attempt=1, delay=1.0, reason=text),
        ev.CacheLossEvent(expected=10, got=0, cause=text),
        ev.Queued(ahead=1, waiting_for=text),
    )
    assert shown.splitlines() == [
        f"retrying (1) in 1.0 s: {text}",
        f"prompt cache lost: 0 of 10 tokens reused ({text})",
        f"queued: waiting for {text} (1 in line)",
    ]


# --- JSON lines ----------------------------------------------------------------------------


def test_every_event_is_one_json_line_with_its_name_and_fields() -> None:
    out = io.StringIO()
    view = JsonView(out)
    view(ev.Content("héllo [/]"))
    view(ev.ToolResultEvent(name="f", call=1, class_="secret", truncated=False, outcome="result",
                            content="42"))
    first, second = out.getvalue().splitlines()
    assert first == '{"event": "content", "text": "héllo [/]"}'  # not ASCII-escaped
    assert json.loads(second) == {"event": "tool_result", "name": "f", "call": 1,
                                  "class": "secret", "truncated": False, "outcome": "result",
                                  "content": "42"}


def test_lines_written_from_many_threads_stay_whole() -> None:
    out = io.StringIO()
    view = JsonView(out)

    def write(n: int) -> None:
        for i in range(200):
            view(ev.Content(f"{n}:{i} " + "x" * 50))

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = out.getvalue().splitlines()
    assert len(lines) == 800
    assert {json.loads(line)["text"].split()[0] for line in lines} == {
        f"{n}:{i}" for n in range(4) for i in range(200)
    }


def test_time_left_is_said_once_the_rate_is_known() -> None:
    from actors.cli.view import time_left

    assert time_left(0, 4000, 0.0) == ""  # nothing processed yet: no rate
    assert time_left(1000, 3000, 2.0) == "about 6 s left"
    assert time_left(1000, 3000, 60.0) == "about 3 min left"
    assert time_left(4000, 10, 1.0) == "under a second left"
    assert time_left(1000, 0, 2.0) == ""  # done


def test_a_child_agent_is_shown_indented_under_its_name() -> None:
    shown = _shown(
        ev.AgentStarted(agent="s.a1", task="read a.txt", context="fresh"),
        ev.AgentEvent("s.a1", ev.Content("not streamed")),
        ev.AgentEvent("s.a1", ev.ToolCallStarted("read_file", 1, '{"path": "a.txt"}')),
        ev.AgentEvent("s.a1", ev.ToolResultEvent("read_file", 1, "public", False, "result")),
        ev.AgentDone(agent="s.a1", ok=True, tokens=12, seconds=1.25),
    )
    assert shown.splitlines() == [
        "⇉ agent s.a1 (fresh): read a.txt",
        '    s.a1 → read_file {"path": "a.txt"}',
        "    s.a1 ← read_file: result, public",
        "  ⇇ agent s.a1: answered (12 tokens, 1.2 s)",
    ]
    assert "not streamed" not in shown
    line = ev.to_json(ev.AgentEvent("s.a1", ev.Content("x")))
    assert line == {"event": "content", "text": "x", "agent": "s.a1"}


def test_a_child_agents_notices_are_the_same_words_as_the_turns_own() -> None:
    loss = ev.CacheLossEvent(expected=100, got=4, cause="the restore did not take")
    compacted = ev.Compacted(why="auto", tokens_before=7000, tokens_after=900,
                             turns_kept=2, ms=1500)
    own = _shown(loss, compacted).splitlines()
    child = _shown(ev.AgentEvent("s.a1", loss), ev.AgentEvent("s.a1", compacted)).splitlines()
    assert len(own) == 2 and child == [f"    s.a1 {line}" for line in own]
    assert own[1].startswith("compacted: 7,000 -> about 900 tokens")


def test_an_agent_link_has_a_readable_line() -> None:
    link = rec.AgentLink(parent="s", child="s.a1", task="read a.txt", context="fork", time=WHEN)
    assert describe(link) == "agent: session s handed session s.a1 a task (fork): read a.txt"
