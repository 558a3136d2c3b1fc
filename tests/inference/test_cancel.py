"""Cancellation: mid-stream, before any byte, during backoff, while queued; and the deadline.

Timeouts here are generous (read timeouts of minutes): a cancel that is not acted on at
once makes the test hang until pytest-timeout fails it, rather than pass slowly.
"""

from __future__ import annotations

import threading

import pytest

from actors.base.events import Content, Event, Retrying, Waiting
from actors.inference.types import InferError, InferErrorKind
from tests.support.fake_llama import Conn, Reply, answer, hang, http_error
from tests.support.inference_rig import MakeRig
from tests.support.watch import HANG_S

SLOW = {"read_timeout_s": 600.0, "timeout_s": 900.0}


def gone_after_content() -> tuple[Reply, threading.Event]:
    """Some content, then nothing until the client closes; ``gone`` is set when it does."""
    gone = threading.Event()

    def serve(conn: Conn) -> None:
        conn.head(200, "text/event-stream")
        for word in ("One ", "two ", "three "):
            conn.event({"id": "chatcmpl-c", "choices": [{"index": 0, "delta": {"content": word}}]})
        conn.wait_until_gone()
        if not conn.stopping:
            gone.set()

    return Reply("gone_after_content", serve), gone


def test_cancel_mid_stream_closes_the_stream_and_returns_nothing(rig: MakeRig) -> None:
    reply, gone = gone_after_content()
    r = rig([reply], **SLOW)

    def sink(e: Event) -> None:
        if isinstance(e, Content) and e.text == "two ":
            r.cancel.cancel()

    with pytest.raises(InferError) as e:
        r.chat(sink=sink)
    assert e.value.kind is InferErrorKind.CANCELLED
    assert gone.wait(HANG_S)  # the server saw the connection close
    assert len(r.fake.requests) == 1  # and nothing was retried


def test_cancel_from_another_thread_while_the_server_is_silent(rig: MakeRig) -> None:
    reply, gone = gone_after_content()
    r = rig([reply], **SLOW)
    started = threading.Event()

    def sink(e: Event) -> None:
        if isinstance(e, Content) and e.text == "three ":
            started.set()

    def cancel_when_started() -> None:
        if started.wait(HANG_S):
            r.cancel.cancel()

    canceller = threading.Thread(target=cancel_when_started)
    canceller.start()
    try:
        with pytest.raises(InferError) as e:
            r.chat(sink=sink)
    finally:
        canceller.join(HANG_S)
    assert e.value.kind is InferErrorKind.CANCELLED
    assert gone.wait(HANG_S)


def test_cancel_before_any_byte_came_back(rig: MakeRig) -> None:
    r = rig([hang()], **SLOW)

    def sink(e: Event) -> None:
        if isinstance(e, Waiting):
            threading.Timer(0.05, r.cancel.cancel).start()  # while blocked on the headers

    with pytest.raises(InferError) as e:
        r.chat(sink=sink)
    assert e.value.kind is InferErrorKind.CANCELLED


def test_cancel_during_backoff(rig: MakeRig) -> None:
    r = rig([http_error(503, {"error": {"code": 503, "message": "Loading model"}})] * 2,
            backoff_s=600.0, **SLOW)

    def sink(e: Event) -> None:
        if isinstance(e, Retrying):
            r.cancel.cancel()

    with pytest.raises(InferError) as e:
        r.chat(sink=sink)
    assert e.value.kind is InferErrorKind.CANCELLED
    assert len(r.fake.requests) == 1


def test_already_cancelled_sends_nothing(rig: MakeRig) -> None:
    r = rig([answer("never")])
    r.cancel.cancel()
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.kind is InferErrorKind.CANCELLED and r.fake.requests == []


def test_the_deadline_ends_a_request_the_server_never_answers(rig: MakeRig) -> None:
    r = rig([hang()], read_timeout_s=600.0, timeout_s=0.3)
    with pytest.raises(InferError) as e:
        r.chat()
    assert e.value.kind is InferErrorKind.TIMEOUT and "timeout_s" in e.value.message
