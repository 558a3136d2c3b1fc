"""A hostile model server's numbers: every value is checked before it reaches a record.

Found by the attack review: a final chunk with ``timings.cache_n`` as a string
was written into Usage, and every later turn of the session crashed with a traceback;
``prompt_tokens`` above 2**64 escaped as OverflowError. Now the bad value is left out, the
answer is kept, and a log that already holds such a value still opens and runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from actors.inference.types import InferError, InferErrorKind
from actors.log import server_values
from actors.log.file import SessionLog
from actors.log.records import Assistant, Usage, User
from tests.support.fake_llama import FakeLlama, answer
from tests.support.fault_rig import MakeRig

BAD_NUMBERS: dict[str, dict[str, Any]] = {
    "timings.cache_n a string": {"timings": {"cache_n": "x", "prompt_n": 3}},
    "timings.cache_n a bool": {"timings": {"cache_n": True, "prompt_n": 3}},
    "timings.prompt_ms a map": {"timings": {"cache_n": 1, "prompt_ms": {"deep": 1}}},
    "timings not a map": {"timings": ["cache_n", 4]},
    "timings.cache_n negative": {"timings": {"cache_n": -5, "prompt_n": 3}},
    "timings.cache_n above 2**63": {"timings": {"cache_n": 2**63, "prompt_n": 3}},
    "timings at the top of the range": {"timings": {"cache_n": 2**63 - 1, "prompt_n": 2**63 - 1}},
    "prompt_tokens a string": {"usage": {"prompt_tokens": "12", "completion_tokens": 3}},
    "prompt_tokens above 2**63": {"usage": {"prompt_tokens": 2**63 + 5, "completion_tokens": 3}},
    "prompt_tokens above 2**64": {"usage": {"prompt_tokens": 2**64 + 5, "completion_tokens": 3}},
    "completion_tokens a float": {"usage": {"prompt_tokens": 1, "completion_tokens": 3.5}},
    "reasoning_tokens above 2**64 (JSON makes it a float)": {"usage": {
        "prompt_tokens": 1, "completion_tokens": 3,
        "completion_tokens_details": {"reasoning_tokens": 2**70},
    }},
}  # fmt: skip


def _in_range(usage: Usage) -> None:
    for n in (usage.prompt_tokens, usage.completion_tokens, usage.reasoning_tokens):
        assert type(n) is int and 0 <= n <= server_values.MAX_COUNT
    for value in usage.timings.values():
        assert server_values.number(value) == value


@pytest.mark.parametrize("bad", list(BAD_NUMBERS))
def test_a_bad_number_from_the_server_is_left_out_and_later_turns_run(
    turn_rig: MakeRig, bad: str
) -> None:
    script = [answer("First.", **BAD_NUMBERS[bad]), answer("Second."), answer("Third.")]
    with FakeLlama(script) as fake:
        rig = turn_rig(fake.url)
        assert rig.turn("one").content == "First."  # the answer is kept
        assert rig.turn("two").content == "Second."
        assert rig.turn("three").content == "Third."
        usages = [r for r in rig.records if isinstance(r, Usage)]
        assert len(usages) == 3
        for usage in usages:
            _in_range(usage)
        assert rig.on_disk() == rig.records


def test_good_numbers_pass_unchanged() -> None:
    timings = {"cache_n": 0, "prompt_n": server_values.MAX_COUNT, "prompt_ms": 1.5}
    assert server_values.timings(timings) == timings
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9,
             "completion_tokens_details": {"reasoning_tokens": 1}}
    assert server_values.usage(usage) == usage


def test_timings_keep_at_most_max_fields() -> None:
    flood = {f"k{i}": i for i in range(10_000)}
    assert len(server_values.timings(flood)) == server_values.MAX_FIELDS


def test_a_log_that_already_holds_a_bad_timing_opens_and_runs(turn_rig: MakeRig) -> None:
    """An older loopd wrote ``cache_n: "x"`` into a Usage: the session must still run."""
    with FakeLlama([answer("First."), answer("Next.")]) as fake:
        rig = turn_rig(fake.url)
        rig.turn("one")
        bad = Usage(
            timings={"cache_n": "x", "prompt_n": "y", "prompt_ms": 2.0}, reasoning_tokens=0,
            thinking_capped=False, prompt_tokens=5, completion_tokens=1, finish_reason="stop",
        )
        rig.log.append(User(content="two"), Assistant(content="ok", reasoning=None), bad)
        rig.log.close()
        rig.log, report = SessionLog.open(rig.path, fsync="always", name="s")
        assert report.cut_bytes == 0
        reread = rig.records[-1]
        assert isinstance(reread, Usage) and reread.timings == {"prompt_ms": 2.0}
        assert rig.turn("three").content == "Next."


def test_a_finish_reason_that_is_not_a_short_word_is_a_protocol_error(turn_rig: MakeRig) -> None:
    with FakeLlama([answer("First.", finish_reason="stop" * 250_000), answer("Next.")]) as fake:
        rig = turn_rig(fake.url)
        with pytest.raises(InferError) as caught:
            rig.turn("one")
        assert caught.value.kind is InferErrorKind.PROTOCOL
        assert "finish_reason is not a short word" in str(caught.value)
        assert rig.kinds() == ["User"]  # nothing of that answer (1 MB of it) was logged
        assert rig.turn("two").content == "Next."
