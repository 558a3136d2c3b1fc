"""Model server faults at the turn level: retried where docs/inference.md#retries says, else
a clean InferError.

The fake llama-server (real HTTP on loopback) injects each fault into a real turn: the
inference actor, a real session log with fsync, run_turn. For each one:

- a retryable fault (connection refused, 503 while loading, 500, an error event in a 200
  stream, a stream cut before [DONE], a connection closed with no response) followed by a
  good answer gives one answer, and only the good one is logged (no partial output);
- a fault that lasts (or is not retryable: a malformed chunk, a 200 that is not an event
  stream, a 4xx, a response that never ends) ends the turn with ``InferError`` of the right kind
  after the right number of requests, and the log holds nothing for it: ``[..., User]``,
  in memory and on disk;
- the next turn on the same session works.

The client-level behaviour of each fault is tested in tests/inference; these tests prove
the turn around it keeps the log clean.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest

from actors.base.events import Retrying
from actors.inference.types import InferError, InferErrorKind
from actors.log.records import Assistant, Baseline, User
from tests.support.fake_llama import (
    FakeLlama,
    Reply,
    answer,
    close_without_response,
    cut_stream,
    hang,
    http_error,
    malformed,
    not_json,
    stream_error,
    trickle,
)
from tests.support.fault_rig import MakeRig, TurnRig

RETRIES = 2  # the rig's inference.retries
LOADING = {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}
BROKEN = {"error": {"code": 500, "message": "kaput", "type": "server_error"}}
GOOD = "The answer, whole."


def _next_turn_works(rig: TurnRig, before: int) -> None:
    outcome = rig.turn("And now?")
    assert outcome.content == "next"
    assert rig.kinds(before) == ["User", "Assistant", "Usage"]
    assert rig.on_disk() == rig.records


def _failed_cleanly(rig: TurnRig, content: str) -> None:
    """The failed turn left exactly its User record, in memory and on disk."""
    assert rig.kinds() == ["User"]
    assert isinstance(rig.records[0], Baseline)
    assert rig.records[1] == User(content=content, time=rig.records[1].time)
    assert rig.on_disk() == rig.records


# --- retried, then answered ------------------------------------------------------------------

RETRIED: dict[str, Callable[[], Reply]] = {
    "503 while loading": lambda: http_error(503, LOADING),
    "500": lambda: http_error(500, BROKEN),
    "stream cut mid-answer": lambda: cut_stream(6),
    "error event inside a 200 stream": lambda: stream_error(6),
    "closed with no response": close_without_response,
}


@pytest.mark.parametrize("fault", list(RETRIED))
def test_a_retryable_fault_then_ok_logs_only_the_good_answer(turn_rig: MakeRig, fault: str) -> None:
    with FakeLlama([RETRIED[fault](), answer(GOOD), answer("next")]) as fake:
        rig = turn_rig(fake.url)
        outcome = rig.turn("Hi?")
        assert outcome.content == GOOD
        assert len(fake.requests) == 2
        assert [e.attempt for e in rig.events if isinstance(e, Retrying)] == [1]
        assert rig.kinds() == ["User", "Assistant", "Usage"]
        assistant = rig.records[2]
        assert isinstance(assistant, Assistant) and assistant.content == GOOD  # no partial text
        assert rig.on_disk() == rig.records
        _next_turn_works(rig, 4)


# --- given up: a clean InferError, nothing logged ----------------------------------------------

FAILED: dict[str, tuple[Callable[[], Reply], int, InferErrorKind, str]] = {
    # fault: (reply, requests made, kind, in the message)
    "500 every time": (lambda: http_error(500, BROKEN), RETRIES + 1, InferErrorKind.HTTP, "kaput"),
    "503 every time": (
        lambda: http_error(503, LOADING), RETRIES + 1, InferErrorKind.HTTP, "Loading model"
    ),
    # cut before the answer began (after it, the last one's text is kept, cut:
    # tests/session/turn/test_runaway_turn.py)
    "stream cut every time": (
        lambda: cut_stream(3), RETRIES + 1, InferErrorKind.PROTOCOL, "closed"
    ),
    "malformed chunk": (malformed, 1, InferErrorKind.PROTOCOL, "not JSON"),
    "a chunk that is not JSON": (
        lambda: malformed(3, "data: not json at all\n\n"), 1, InferErrorKind.PROTOCOL,
        "a stream chunk is not JSON",
    ),
    "a chunk that is JSON but not a chunk": (
        lambda: malformed(3, 'data: {"choices": "x"}\n\n'), 1, InferErrorKind.PROTOCOL,
        "choices is not a list",
    ),
    "a 200 that is not an event stream": (
        not_json, 1, InferErrorKind.PROTOCOL, "not an event stream"
    ),
    "400 bad request": (
        lambda: http_error(400, {"error": {"code": 400, "message": "bad field",
                                           "type": "invalid_request_error"}}),
        1, InferErrorKind.HTTP, "bad field",
    ),
}  # fmt: skip


@pytest.mark.parametrize("fault", list(FAILED))
def test_a_lasting_fault_is_a_clean_infer_and_logs_nothing(turn_rig: MakeRig, fault: str) -> None:
    reply, requests, kind, says = FAILED[fault]
    script = [reply() for _ in range(requests)] + [answer("next")]
    with FakeLlama(script) as fake:
        rig = turn_rig(fake.url)
        with pytest.raises(InferError) as caught:
            rig.turn("Hi?")
        assert caught.value.kind is kind
        assert says in str(caught.value)
        assert str(caught.value).startswith("The model server failed: ")
        assert len(fake.requests) == requests  # retried exactly as docs/inference.md#retries says
        _failed_cleanly(rig, "Hi?")
        _next_turn_works(rig, 2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_connection_refused_is_retried_then_a_connect_error_and_the_next_turn_works(
    turn_rig: MakeRig,
) -> None:
    port = _free_port()
    rig = turn_rig(f"http://127.0.0.1:{port}")
    with pytest.raises(InferError) as caught:
        rig.turn("Hi?")
    assert caught.value.kind is InferErrorKind.CONNECT
    assert "is llama-server running there?" in str(caught.value)
    assert len([e for e in rig.events if isinstance(e, Retrying)]) == RETRIES
    _failed_cleanly(rig, "Hi?")
    with FakeLlama([answer("next")], port=port):  # the server comes up where it was expected
        _next_turn_works(rig, 2)


@pytest.mark.parametrize("fault", ["trickle", "hang"])
def test_a_response_that_never_ends_meets_the_wall_clock_deadline(
    turn_rig: MakeRig, fault: str
) -> None:
    never = trickle(0.05) if fault == "trickle" else hang()
    with FakeLlama([never, answer("next")]) as fake:
        rig = turn_rig(fake.url, timeout_s=1.0, read_timeout_s=10.0)
        with pytest.raises(InferError) as caught:
            rig.turn("Hi?")
        assert caught.value.kind is InferErrorKind.TIMEOUT
        assert "inference.timeout_s = 1 s" in str(caught.value)
        assert len(fake.requests) == 1  # the deadline covers retries too: none is made
        _failed_cleanly(rig, "Hi?")
        _next_turn_works(rig, 2)


# --- lines the SSE format says to ignore -------------------------------------------------------


@pytest.mark.parametrize(
    "line",
    ["a line with no colon\n\n", ": a comment\n\n", "retry: soon\n\n", "\xff\xfe\n\n"],
)
def test_sse_lines_that_carry_no_event_are_ignored(turn_rig: MakeRig, line: str) -> None:
    with FakeLlama([malformed(3, line), answer("next")]) as fake:
        rig = turn_rig(fake.url)
        outcome = rig.turn("Hi?")
        assert outcome.content == "The files are notes.txt, plan.md and src/."
        assert rig.kinds() == ["User", "Assistant", "Usage"]
        _next_turn_works(rig, 4)


@pytest.mark.parametrize("line", ["event: ping\n\n", "retry: 3000\n\n", "id: 7\n\n"])
def test_sse_blocks_without_data_are_not_chunks(turn_rig: MakeRig, line: str) -> None:
    """Found by this suite: httpx-sse yields such a block with empty data, which failed the
    turn ("a stream chunk is not JSON"); by the SSE spec it dispatches nothing. Now fixed."""
    with FakeLlama([malformed(3, line), answer("next")]) as fake:
        rig = turn_rig(fake.url)
        outcome = rig.turn("Hi?")
        assert outcome.content == "The files are notes.txt, plan.md and src/."
