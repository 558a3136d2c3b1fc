"""LlamaClient against the fake llama-server over real sockets: events, body, errors, retries."""

from __future__ import annotations

import json
import socket
import types

import pytest

from actors.base.cancel import CancelToken
from actors.base.events import (
    AnswerCut,
    Content,
    Event,
    Progress,
    Reasoning,
    Retrying,
    ToolCallDelta,
)
from actors.inference import llama as client_module
from actors.inference.llama import LlamaClient
from actors.inference.types import InferError, InferErrorKind, is_context_full
from actors.log.records import ToolCall
from tests.support.fake_llama import (
    Reply,
    answer,
    close_without_response,
    context_full,
    cut_stream,
    hang,
    http_error,
    malformed,
    not_json,
    replay,
    stall,
    stream_error,
    trickle,
)
from tests.support.inference_rig import USER, MakeRig, config, request
from tests.support.recordings import FIXTURES

CALLS = [("c1", "find_tool", '{"query": "list files"}'), ("c2", "call_tool", '{"name": "x"}')]


def test_a_full_answer_gives_every_event_in_order_and_one_completion(rig: MakeRig) -> None:
    r = rig([answer("Hello there.", reasoning="Think first.", tool_calls=CALLS, chunk=3)])
    done = r.chat(request(max_tokens=500))

    kinds = r.kinds()
    assert kinds[:3] == ["Waiting", "Progress", "Progress"]
    rest = kinds[3:]
    # reasoning, then content, then tool-call fragments: each kind in one run, in order
    assert rest == sorted(rest, key=["Reasoning", "Content", "ToolCallDelta"].index)
    assert "".join(e.text for e in r.events if isinstance(e, Reasoning)) == "Think first."
    assert "".join(e.text for e in r.events if isinstance(e, Content)) == "Hello there."
    deltas = [e for e in r.events if isinstance(e, ToolCallDelta)]
    assert [d.index for d in deltas if d.name] == [0, 1]
    assert done.content == "Hello there."
    assert done.reasoning == "Think first."
    assert done.reasoning_tokens == 4  # deltas of 3 characters
    assert done.tool_calls == tuple(ToolCall(i, n, a) for i, n, a in CALLS)
    assert done.finish_reason == "tool_calls"
    assert done.usage["prompt_tokens"] == done.timings["prompt_n"] + done.timings["cache_n"]
    assert not done.thinking_capped


def test_progress_events_carry_the_servers_numbers(rig: MakeRig) -> None:
    r = rig([answer("ok"), answer("ok")])
    r.chat()
    first = [e for e in r.events if isinstance(e, Progress)]
    longer = (*USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "More?"})
    r.chat(request(messages=longer))
    second = [e for e in r.events if isinstance(e, Progress)]
    assert first[0].cache == 0 and first[-1].processed == first[-1].total
    assert second[0].cache > first[-1].total // 2  # the slot's cache was reused


def test_the_body_has_every_field_loopd_needs(rig: MakeRig) -> None:
    tools = (types.MappingProxyType({"type": "function", "function": {"name": "find_tool"}}),)
    r = rig([answer("a"), answer("b"), answer("c")])
    r.chat(request(tools=tools, max_tokens=64), slot=2)
    r.chat(request(thinking=False, thinking_budget=100))
    r.chat(request(thinking_budget=77))
    first, second, third = r.fake.requests
    assert first["messages"] == [dict(m) for m in USER]
    assert first["tools"] == [dict(t) for t in tools]
    assert first["stream"] is True
    assert first["stream_options"] == {"include_usage": True}
    assert (first["id_slot"], first["cache_prompt"], first["return_progress"]) == (2, True, True)
    assert first["max_tokens"] == 64
    assert "model" in first
    assert "chat_template_kwargs" not in first and "reasoning_budget_tokens" not in first
    assert "tools" not in second and "max_tokens" not in second
    assert second["chat_template_kwargs"] == {"enable_thinking": False}
    assert "reasoning_budget_tokens" not in second  # thinking off: no budget to send
    assert third["reasoning_budget_tokens"] == 77 and third["reasoning_control"] is True
    for headers in r.fake.headers:
        assert "x-conversation-id" not in {k.lower() for k in headers}


def test_api_key_is_sent_as_a_bearer_token(rig: MakeRig) -> None:
    r = rig([answer("a")], api_key="s3cret")
    r.chat()
    assert r.fake.headers[0]["Authorization"] == "Bearer s3cret"


def test_max_tokens_cut_keeps_finish_reason_length(rig: MakeRig) -> None:
    r = rig([answer("one two three four five six seven", chunk=2)])
    done = r.chat(request(max_tokens=3))
    assert done.finish_reason == "length"
    assert done.content == "one tw"


# --- errors and retries ---------------------------------------------------------------------


def retries(events: list[Event]) -> list[Retrying]:
    return [e for e in events if isinstance(e, Retrying)]


def test_503_while_loading_is_retried_then_answers(rig: MakeRig) -> None:
    r = rig([*replay(FIXTURES / "loading.http"), answer("ready")])
    done = r.chat()
    assert done.content == "ready"
    (retry,) = retries(r.events)
    assert retry.attempt == 1 and "Loading model" in retry.reason and "503" in retry.reason
    assert len(r.fake.requests) == 2


def test_500_is_retried_up_to_retries_then_raises(rig: MakeRig) -> None:
    boom = {"error": {"code": 500, "message": "Compute error.", "type": "server_error"}}
    r = rig([http_error(500, boom)] * 4, retries=3)
    with pytest.raises(InferError) as e:
        r.chat()
    assert (e.value.kind, e.value.status) == (InferErrorKind.HTTP, 500)
    assert "Compute error." in str(e.value)
    assert [x.attempt for x in retries(r.events)] == [1, 2, 3]
    assert len(r.fake.requests) == 4


def test_backoff_grows(rig: MakeRig) -> None:
    r = rig([http_error(500, "x")] * 3 + [answer("ok")], backoff_s=0.01)
    r.chat()
    delays = [x.delay for x in retries(r.events)]
    # base 0.01 doubling, jitter 0.5x..1.5x: each step lies in its own band
    assert 0.005 <= delays[0] <= 0.015 and 0.01 <= delays[1] <= 0.03 and 0.02 <= delays[2] <= 0.06


def test_an_idle_connection_is_dropped_before_llama_server_would_close_it() -> None:
    """A kept connection is not reused once llama-server may have closed it (idle 5 s):
    one reused as the server closed it failed a /tokenize of the real-model compaction test
    ("Server disconnected without sending a response")."""
    client = LlamaClient(config("http://127.0.0.1:9"))
    try:
        pool = client._http._transport._pool  # type: ignore[attr-defined]
        assert pool._keepalive_expiry < client_module.SERVER_KEEPALIVE_S / 2
    finally:
        client.close()


def test_connect_refused_is_retried_then_a_connect_error() -> None:
    with socket.socket() as s:  # a port that was free a moment ago and has no listener
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = LlamaClient(config(f"http://127.0.0.1:{port}", retries=2))
    events: list[Event] = []
    try:
        with pytest.raises(InferError) as e:
            client.chat_with_retry(request(), events.append, CancelToken())
    finally:
        client.close()
    assert e.value.kind is InferErrorKind.CONNECT
    assert "is llama-server running there?" in str(e.value)
    assert len(retries(events)) == 2


def test_an_error_event_in_the_stream_is_retried_and_the_partial_answer_dropped(
    rig: MakeRig,
) -> None:
    r = rig([*replay(FIXTURES / "model_output_error.http"), answer("clean answer")])
    done = r.chat()
    kinds = r.kinds()
    first_retry = kinds.index("Retrying")
    assert "ToolCallDelta" in kinds[:first_retry]  # the partial call was streamed...
    assert done.tool_calls == () and done.content == "clean answer"  # ...and dropped
    assert "does not match the expected peg-native format" in retries(r.events)[0].reason


def test_an_error_event_before_the_answer_without_retries_is_an_http_500(rig: MakeRig) -> None:
    r = rig([stream_error(after_events=3, message="Invalid input batch.")])  # no content yet
    with pytest.raises(InferError) as e:
        r.chat(retry=False)
    assert (e.value.kind, e.value.status) == (InferErrorKind.HTTP, 500)
    assert "Invalid input batch." in e.value.message
    assert e.value.error_body()["type"] == "server_error"


def test_an_error_event_after_the_answer_began_keeps_what_streamed_cut(rig: MakeRig) -> None:
    r = rig([stream_error(after_events=5, message="Invalid input batch.")])
    done = r.chat(retry=False)
    assert done.content == "The file"  # two content chunks of 4 characters came
    assert done.finish_reason == "error" and done.cut is not None
    assert done.cut.why == "error" and "Invalid input batch." in done.cut.note
    assert [e.why for e in r.events if isinstance(e, AnswerCut)] == ["error"]


@pytest.mark.parametrize(
    "failure", [close_without_response(), cut_stream(after_events=5)], ids=["no_response", "cut"]
)
def test_a_closed_connection_is_retried(rig: MakeRig, failure: Reply) -> None:
    r = rig([failure, answer("second try")])
    done = r.chat()
    assert done.content == "second try"
    assert len(retries(r.events)) == 1 and len(r.fake.requests) == 2


@pytest.mark.parametrize(
    "failure", [close_without_response(), cut_stream(after_events=3)], ids=["no_response", "cut"]
)
def test_a_closed_connection_before_the_answer_is_a_protocol_error(
    rig: MakeRig, failure: Reply
) -> None:
    r = rig([failure])
    with pytest.raises(InferError) as e:
        r.chat(retry=False)
    assert e.value.kind is InferErrorKind.PROTOCOL
    assert "closed" in e.value.message


def test_eof_without_done_is_retried_then_kept_cut(rig: MakeRig) -> None:
    from tests.support.fake_llama import Conn, Reply

    def serve(conn: Conn) -> None:  # a clean chunked end, but no [DONE]
        conn.head(200, "text/event-stream")
        conn.event({"choices": [{"index": 0, "delta": {"content": "half"}}], "id": "x"})
        conn.end()

    r = rig([Reply("no_done", serve)] * 2, retries=1)
    done = r.chat()
    assert len(r.fake.requests) == 2  # retried once, then what the last one streamed is kept
    assert (done.content, done.finish_reason) == ("half", "error")
    assert done.cut is not None and "no [DONE]" in done.cut.note


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_4xx_is_never_retried(rig: MakeRig, status: int) -> None:
    body = {"error": {"code": status, "message": "no good", "type": "invalid_request_error"}}
    r = rig([http_error(status, body), answer("never")])
    with pytest.raises(InferError) as e:
        r.chat()
    assert (e.value.kind, e.value.status) == (InferErrorKind.HTTP, status)
    assert e.value.message == "no good"
    assert retries(r.events) == [] and len(r.fake.requests) == 1


def test_context_full_from_the_real_recording(rig: MakeRig) -> None:
    r = rig(replay(FIXTURES / "context_full.http"))
    with pytest.raises(InferError) as e:
        r.chat()
    assert is_context_full(e.value)
    assert e.value.error_body()["n_ctx"] == 4096 and e.value.error_body()["n_prompt_tokens"] == 6266
    assert len(r.fake.requests) == 1


def test_context_full_from_the_fake_and_other_400s_are_not(rig: MakeRig) -> None:
    r = rig([context_full(9000, 8192), http_error(400, {"error": {"type": "x", "message": "m"}})])
    with pytest.raises(InferError) as full:
        r.chat()
    with pytest.raises(InferError) as other:
        r.chat()
    assert is_context_full(full.value) and not is_context_full(other.value)


def test_a_malformed_chunk_is_a_protocol_error_not_retried(rig: MakeRig) -> None:
    r = rig([malformed(after_events=3), answer("never")])
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.kind is InferErrorKind.PROTOCOL and "not JSON" in e.value.message
    assert len(r.fake.requests) == 1


def test_a_server_that_is_not_llama_server_is_named(rig: MakeRig) -> None:
    r = rig([not_json(), answer("never")])
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.kind is InferErrorKind.PROTOCOL
    assert "is inference.url a llama-server?" in e.value.message and "text/html" in e.value.message
    assert len(r.fake.requests) == 1


def test_a_stream_trickling_keep_alives_forever_ends_with_a_timeout(rig: MakeRig) -> None:
    r = rig([trickle(0.02), answer("never")], timeout_s=0.5, read_timeout_s=5.0)
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.kind is InferErrorKind.TIMEOUT and "timeout_s" in e.value.message
    assert len(r.fake.requests) == 1  # the deadline is for the whole request: no retry


def test_silence_before_the_first_byte_is_a_read_timeout_and_retried(rig: MakeRig) -> None:
    # the read limit is the stimulus for the two silent answers, and must also let the last
    # one's chunks through on a loaded machine
    r = rig([hang(), hang(), answer("finally")], read_timeout_s=2.0, retries=2)
    done = r.chat()
    assert done.content == "finally"
    assert all("read_timeout_s" in x.reason for x in retries(r.events))
    assert len(retries(r.events)) == 2


def test_silence_after_the_answer_began_is_a_timeout_not_retried(rig: MakeRig) -> None:
    from tests.support.fake_llama import Conn, Reply

    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        conn.event({"choices": [{"index": 0, "delta": {"content": "Half"}}], "id": "x"})
        conn.wait_until_gone()

    # the read limit is the stimulus for the silence, and must also let the first chunk
    # (written right after the headers) through on a loaded machine: a chunk starved past it
    # would be silence before the first byte, retried, and "never" the answer
    r = rig([Reply("stall", serve), answer("never")], read_timeout_s=2.0)
    done = r.chat()
    assert (done.content, done.finish_reason) == ("Half", "timeout")  # kept, cut
    assert done.cut is not None and "read_timeout_s" in done.cut.note
    assert len(r.fake.requests) == 1


def test_an_answer_past_the_deadline_keeps_what_streamed(rig: MakeRig) -> None:
    """inference.timeout_s ends a stalled answer (the watchdog shuts its socket): what
    streamed is the answer, cut, with its tool call still being written left out."""
    r = rig([stall(after_events=6)], timeout_s=0.5, read_timeout_s=30.0)
    done = r.chat()
    assert (done.content, done.finish_reason, done.tool_calls) == ("The files ar", "timeout", ())
    assert done.cut is not None and "inference.timeout_s = 0.5 s" in done.cut.note
    cuts = [e for e in r.events if isinstance(e, AnswerCut)]
    assert [(c.why, c.tokens) for c in cuts] == [("timeout", 3)]
    assert done.completion_tokens == 3 and done.prompt_tokens > 0  # from the stream itself


def test_a_stream_broken_with_no_time_left_to_retry_keeps_what_streamed(rig: MakeRig) -> None:
    r = rig([cut_stream(after_events=6), answer("never")], backoff_s=100.0, timeout_s=20.0)
    done = r.chat()
    assert (done.content, done.finish_reason) == ("The files ar", "error")
    assert retries(r.events) == [] and len(r.fake.requests) == 1


def test_a_cancelled_answer_keeps_nothing(rig: MakeRig) -> None:
    r = rig([stall(after_events=6)])

    def cancel_on_content(event: Event) -> None:
        if isinstance(event, Content):
            r.cancel.cancel()

    with pytest.raises(InferError) as e:
        r.chat(sink=cancel_on_content)
    assert e.value.kind is InferErrorKind.CANCELLED


def test_script_exhausted_is_a_clear_500(rig: MakeRig) -> None:
    r = rig([answer("only one")], retries=0)
    r.chat()
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.status == 500 and "script exhausted" in e.value.message


def test_an_empty_url_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match=r"inference\.url is empty"):
        LlamaClient(config(""))


def test_json_of_the_sent_messages_round_trips(rig: MakeRig) -> None:
    weird = ({"role": "user", "content": "quote \" backslash \\ unicode é \u2028 end"},)
    r = rig([answer("ok")])
    r.chat(request(messages=weird))
    assert r.fake.requests[0]["messages"] == [dict(weird[0])]
    assert json.dumps(r.fake.requests[0]["messages"])  # plain JSON types only


def test_the_connection_is_kept_for_the_next_request(rig: MakeRig) -> None:
    r = rig([answer("one"), answer("two"), answer("three")])
    assert [r.chat().content for _ in range(3)] == ["one", "two", "three"]
    assert r.fake.connections == 1


def test_a_server_that_holds_the_stream_open_after_done_still_answers(
    rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "_DRAIN_S", 0.05)
    from tests.support.fake_llama import Conn

    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        conn.event({"choices": [{"index": 0, "delta": {"content": "Done."}}], "id": "x"})
        conn.event("[DONE]")
        conn.wait_until_gone()

    r = rig([Reply("held", serve), answer("next")], **{"read_timeout_s": 600.0})
    assert r.chat().content == "Done."
    assert r.chat().content == "next"  # on a new connection
    assert r.fake.connections == 2
