"""Completion: what the log keeps of one model response (its Assistant and Usage records)."""

from __future__ import annotations

import dataclasses

from actors.inference.types import Completion
from actors.log.records import Assistant, SlotState, SlotUse, ToolCall, Usage


def test_the_records_of_a_completion_carry_every_field_the_log_keeps() -> None:
    slot = SlotUse("http://h", 1, SlotState.RESTORED, restored=40)
    done = Completion(
        content=None, reasoning="hmm", tool_calls=(ToolCall("c1", "find_tool", "{}"),),
        timings={"prompt_n": 3}, usage={"prompt_tokens": 12, "completion_tokens": 5},
        reasoning_tokens=2, thinking_capped=True, finish_reason="tool_calls", slot=slot,
    )
    said = done.assistant()
    assert said == Assistant(content=None, reasoning="hmm", tool_calls=done.tool_calls,
                             time=said.time)
    usage = done.usage_record()
    assert usage == Usage(
        timings={"prompt_n": 3}, reasoning_tokens=2, thinking_capped=True, prompt_tokens=12,
        completion_tokens=5, finish_reason="tool_calls", slot=slot, time=usage.time,
    )
    # a server that sent no usage counts nothing (not an error)
    bare = dataclasses.replace(done, usage={}, slot=None).usage_record()
    assert (bare.prompt_tokens, bare.completion_tokens, bare.slot) == (0, 0, None)
