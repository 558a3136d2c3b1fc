"""actors/session/limits.py: the pure parts of a turn, each on its own (the turn tests run
them whole)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.log.records import Assistant, CacheLoss, SlotState, SlotUse, ToolResult, User
from actors.session.limits import (
    ASKED_AGAIN,
    Answered,
    Repeats,
    answer_text,
    cache_outcome,
    call_key,
    cap_result,
    loss_cause,
    passages,
)
from actors.tools.protocol import wire
from actors.tools.protocol.spec import ResultClass

NOTE = re.compile(r"\n\[loopd: result cut to (\d+) of (\d+) characters\]$")


# --- answer_text ---------------------------------------------------------------------------


def test_a_result_keeps_its_text_class_and_trust() -> None:
    answer = wire.Result(7, "42 files", ResultClass.SECRET, untrusted=True)
    assert answer_text(answer) == Answered("42 files", ResultClass.SECRET, True, "result")


@pytest.mark.parametrize(
    ("answer", "text", "outcome"),
    [
        (wire.Denied(1, "outside the workspace"), "The call was denied: outside the workspace",
         "denied"),
        (wire.Failed(1, "no such file"), "The tool failed: no such file", "failed"),
        (wire.PendingApproval(1, "run rm -rf?"), ASKED_AGAIN.format(prompt="run rm -rf?"),
         "failed"),
    ],
)  # fmt: skip
def test_every_other_answer_is_a_public_trusted_text_that_says_what_happened(
    answer: wire.Answer, text: str, outcome: str
) -> None:
    assert answer_text(answer) == Answered(text, ResultClass.PUBLIC, False, outcome)


def test_a_host_asking_again_after_approval_names_its_prompt_and_says_nothing_ran() -> None:
    # the first PendingApproval is answered by actors.approval.gate's gate; answer_text only ever
    # sees one from a host that asks again for a call sent approved
    text = answer_text(wire.PendingApproval(1, "delete build/")).text
    assert "(delete build/)" in text
    assert "did not run" in text


# --- cap_result ----------------------------------------------------------------------------


def test_a_result_within_the_cap_is_untouched() -> None:
    assert cap_result("x" * 100, 100) == ("x" * 100, False)
    assert cap_result("", 1) == ("", False)


def test_a_long_result_is_cut_to_the_cap_with_a_note_of_both_sizes() -> None:
    text, cut = cap_result("abcdefghij" * 100, 200)
    assert cut
    assert len(text) <= 200
    note = NOTE.search(text)
    assert note is not None
    kept = int(note.group(1))
    assert (kept, int(note.group(2))) == (len(text) - len(note.group(0)), 1000)
    assert text[:kept] == ("abcdefghij" * 100)[:kept]


def test_the_cut_never_splits_a_character() -> None:
    """Characters, not bytes or UTF-16 units: a wide character is kept or left out whole."""
    text, cut = cap_result("😀" * 500, 100)
    assert cut
    assert set(text[: text.index("\n")]) == {"😀"}


@given(st.text(max_size=300), st.integers(min_value=1, max_value=400))
def test_a_capped_result_is_never_over_the_cap_and_keeps_a_prefix(text: str, cap: int) -> None:
    capped, cut = cap_result(text, cap)
    assert len(capped) <= cap
    assert cut == (len(text) > cap)
    if not cut:
        assert capped == text
    note = NOTE.search(capped)
    if note is not None:
        assert text.startswith(capped[: int(note.group(1))])


@pytest.mark.parametrize("cap", [1, 5, 20, 42])
def test_a_cap_smaller_than_the_note_still_holds(cap: int) -> None:
    """loop.tool_result_cap may be as small as 1: the note must not push a result past it."""
    text, cut = cap_result("x" * 100, cap)
    assert cut
    assert len(text) <= cap
    assert text == "x" * cap  # no room for the note: the record's truncated flag says it


# --- cache_outcome and loss_cause ----------------------------------------------------------


def test_no_loss_without_a_previous_request_or_a_cache_count() -> None:
    assert cache_outcome(None, {"cache_n": 0}) is None
    assert cache_outcome({}, {"cache_n": 0}) is None
    assert cache_outcome({"cache_n": 10, "prompt_n": 5}, {"prompt_n": 3}) is None


def test_no_loss_when_the_new_request_reused_the_whole_previous_prompt() -> None:
    previous = {"cache_n": 100, "prompt_n": 20}
    assert cache_outcome(previous, {"cache_n": 120}) is None
    assert cache_outcome(previous, {"cache_n": 130}) is None  # more is fine


def test_a_loss_says_what_was_expected_and_what_was_reused() -> None:
    loss = cache_outcome({"cache_n": 100, "prompt_n": 20}, {"cache_n": 119})
    assert isinstance(loss, CacheLoss)
    assert (loss.expected, loss.got, loss.cause) == (120, 119, "")


def test_a_previous_request_missing_a_count_counts_it_as_zero() -> None:
    loss = cache_outcome({"prompt_n": 50}, {"cache_n": 0})
    assert loss is not None and (loss.expected, loss.got) == (50, 0)


def test_a_loss_takes_its_cause_from_the_slot_keeper() -> None:
    slot = SlotUse("http://127.0.0.1:1", 0, SlotState.KEPT)
    loss = cache_outcome({"cache_n": 10, "prompt_n": 10}, {"cache_n": 0}, slot)
    assert loss is not None and loss.cause == "the server dropped the slot's cache"


@pytest.mark.parametrize(
    ("slot", "cause"),
    [
        (None, ""),
        (SlotUse("s", 0, SlotState.KEPT), "the server dropped the slot's cache"),
        (SlotUse("s", 0, SlotState.RESTORED, restored=4000),
         "the restore of 4000 tokens did not take"),
        (SlotUse("s", 0, SlotState.RESTORED, restored=4000, reason="the file was short"),
         "the file was short; the restore of 4000 tokens did not take"),
        (SlotUse("s", 0, SlotState.NONE), "nothing to restore"),
        (SlotUse("s", 0, SlotState.NONE, reason="evicted without a save"),
         "evicted without a save"),
    ],
)  # fmt: skip
def test_the_cause_of_a_loss_for_each_thing_the_keeper_did(
    slot: SlotUse | None, cause: str
) -> None:
    assert loss_cause(slot) == cause


# --- call_key and Repeats ------------------------------------------------------------------


def test_calls_with_the_same_json_in_another_key_order_or_spacing_are_the_same() -> None:
    assert call_key("f", '{"a": 1, "b": [1, 2]}') == call_key("f", '{"b":[1,2],"a":1}')
    assert call_key("f", '{"a": 1}') != call_key("g", '{"a": 1}')
    assert call_key("f", '{"a": 1}') != call_key("f", '{"a": 2}')


def test_arguments_that_are_not_json_are_compared_as_text_without_edge_spaces() -> None:
    assert call_key("f", "  {not json ") == ("f", "{not json")
    assert call_key("f", "{not json") != call_key("f", "{not  json")


def test_repeats_count_the_earlier_identical_calls_of_a_turn() -> None:
    repeats = Repeats()
    assert repeats.seen("read", '{"path": "a"}') == 0
    assert repeats.seen("read", '{"path": "b"}') == 0
    assert repeats.seen("read", '{ "path":"a" }') == 1
    assert repeats.seen("list", '{"path": "a"}') == 0
    assert repeats.seen("read", '{"path": "a"}') == 2
    assert Repeats().seen("read", '{"path": "a"}') == 0  # a new turn starts afresh


def test_passages_are_earlier_copies_of_a_result_given_to_another_question() -> None:
    passage = " ".join(f"word{k}" for k in range(40))
    said = "In my own words: " + " ".join(f"fact{k}" for k in range(40))
    log = [User(content="Read it."), ToolResult(1, "c1", f"head\n{passage}\ntail",
                                                 ResultClass.PUBLIC, False, False),
           Assistant(content=passage, reasoning=None), User(content="And the facts?"),
           ToolResult(2, "c2", "x", ResultClass.PUBLIC, False, False),
           Assistant(content=said, reasoning=None)]
    assert passages(log, "What now?", 32) == (passage,)  # a copy, not the own words
    assert passages(log, "read it", 32) == ()  # the same question again may quote again
    assert passages(log, "What now?", 0) == ()  # off
