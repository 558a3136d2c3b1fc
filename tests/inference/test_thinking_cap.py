"""The thinking cap: the server's own budget, the reasoning_end control, the thinking-off re-ask."""

from __future__ import annotations

import pytest

from actors.base.events import Content, Event, Reasoning, ThinkingCapped
from actors.inference.llama import CONTROL_GRACE
from tests.support.fake_llama import Conn, Control, Reply, answer
from tests.support.inference_rig import USER, MakeRig, request

LONG = "".join(f"step {i}. " for i in range(200))  # far more reasoning than any budget here


def capped(events: list[Event]) -> list[ThinkingCapped]:
    return [e for e in events if isinstance(e, ThinkingCapped)]


def reasoning_deltas(events: list[Event]) -> int:
    return sum(isinstance(e, Reasoning) for e in events)


def test_no_budget_means_no_cap(rig: MakeRig) -> None:
    r = rig([answer("Answer.", reasoning=LONG)])
    done = r.chat(request())
    assert "reasoning_budget_tokens" not in r.fake.requests[0]
    assert done.reasoning == LONG and not done.thinking_capped and capped(r.events) == []


def test_the_servers_budget_does_the_job(rig: MakeRig) -> None:
    r = rig([answer("Answer.", reasoning=LONG)])
    done = r.chat(request(thinking_budget=5))
    body = r.fake.requests[0]
    assert body["reasoning_budget_tokens"] == 5 and body["reasoning_control"] is True
    assert capped(r.events) == [ThinkingCapped(tokens=5, cap=5)]
    assert r.kinds().index("ThinkingCapped") < r.kinds().index("Content")
    assert r.fake.control_calls == [] and len(r.fake.requests) == 1
    assert done.thinking_capped and done.reasoning_tokens == 5 and done.content == "Answer."


def test_a_server_ignoring_the_budget_gets_the_reasoning_end_control(rig: MakeRig) -> None:
    r = rig([answer("Answer.", reasoning=LONG, honor_budget=False, control="honor")])
    done = r.chat(request(thinking_budget=5))
    (call,) = r.fake.control_calls
    assert call["action"] == "reasoning_end" and call["id"].startswith("chatcmpl-")
    assert len(r.fake.requests) == 1  # the control did it: no second request
    assert capped(r.events) == [ThinkingCapped(tokens=5, cap=5)]
    assert 6 <= done.reasoning_tokens <= 6 + CONTROL_GRACE
    assert done.thinking_capped and done.content == "Answer."


@pytest.mark.parametrize("control", ["ignore", "missing"])
def test_when_the_control_fails_the_same_messages_are_asked_again_thinking_off(
    rig: MakeRig, control: Control
) -> None:
    r = rig([
        answer("first", reasoning=LONG, honor_budget=False, control=control),
        answer("Second answer.", reasoning="never shown: thinking is off"),
    ])
    done = r.chat(request(thinking_budget=5))
    first, second = r.fake.requests
    assert len(r.fake.control_calls) == 1
    assert second["messages"] == first["messages"] == [dict(m) for m in USER]
    assert second["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_budget_tokens" not in second
    assert capped(r.events) == [ThinkingCapped(tokens=5, cap=5)]  # once, across both
    shown = reasoning_deltas(r.events)
    assert shown == (6 if control == "missing" else 6 + CONTROL_GRACE)
    assert done.content == "Second answer."
    assert done.thinking_capped and done.reasoning_tokens == shown
    assert done.reasoning == LONG[: 4 * shown]  # what was shown is kept
    assert "".join(e.text for e in r.events if isinstance(e, Content)) == "Second answer."


def test_reasoning_after_the_answer_began_is_left_to_finish(rig: MakeRig) -> None:
    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        base = {"id": "chatcmpl-late", "object": "chat.completion.chunk"}
        conn.event({**base, "choices": [{"index": 0, "delta": {"content": "Answer "}}]})
        for i in range(12):
            conn.event({**base, "choices": [{"index": 0, "delta": {"reasoning_content": f"r{i}"}}]})
        conn.event({**base, "choices": [{"index": 0, "delta": {"content": "done."}}]})
        conn.event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        conn.event("[DONE]")
        conn.end()

    r = rig([Reply("late_reasoning", serve)])
    done = r.chat(request(thinking_budget=3))
    assert r.fake.control_calls == [] and len(r.fake.requests) == 1
    assert done.content == "Answer done." and done.reasoning_tokens == 12
    assert done.thinking_capped and len(capped(r.events)) == 1


def test_thinking_off_sends_no_budget_and_is_never_capped(rig: MakeRig) -> None:
    r = rig([answer("Plain.", reasoning=LONG)])
    done = r.chat(request(thinking=False, thinking_budget=3))
    assert done.reasoning is None and not done.thinking_capped
    assert r.fake.requests[0]["chat_template_kwargs"] == {"enable_thinking": False}


def test_a_zero_budget_stops_thinking_at_once(rig: MakeRig) -> None:
    r = rig([answer("Now.", reasoning=LONG)])
    done = r.chat(request(thinking_budget=0))
    assert r.fake.requests[0]["reasoning_budget_tokens"] == 0
    assert done.reasoning is None and done.content == "Now."
