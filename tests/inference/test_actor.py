"""The inference actor: events arrive while the session's ask is pending; stop cancels.

The session side is a small pykka actor that calls ``Inference.complete`` from its own
thread, as the real session actor does. The model server is a handler served over a socket
pair (tests/support/http_backend.py) whose stream the test releases chunk by chunk, so what
is pending when is certain.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from actors.base.cancel import CancelToken
from actors.base.events import Content, Event, Progress, Waiting
from actors.inference.actor import Inference
from actors.inference.types import ChatRequest, Completion, InferError, InferErrorKind
from tests.support.fake_llama import FakeLlama, hang
from tests.support.gated_llama import WAIT, GatedServer
from tests.support.http_backend import HandlerBackend
from tests.support.inference_rig import config, request


class Session(pykka.ThreadingActor):
    """Stands in for the session actor: asks inference from inside its own message handler."""

    def __init__(self, inference: Inference, events: queue.Queue[Event]) -> None:
        super().__init__()
        self._inference = inference
        self._events = events

    def on_receive(self, message: Any) -> Completion:
        assert isinstance(message, ChatRequest)
        return self._inference.complete(message, self._events.put, CancelToken())


@pytest.fixture
def gated() -> Iterator[tuple[GatedServer, Inference]]:
    server = GatedServer()
    inference = Inference.start(
        config("http://llama.test"), network=HandlerBackend(server.handler)
    )
    try:
        yield server, inference
    finally:
        server.release(100)  # never leave a worker blocked on the gate
        inference.stop()


Gated = tuple[GatedServer, Inference]


def test_events_arrive_in_order_while_the_ask_is_pending(gated: Gated) -> None:
    server, inference = gated
    events: queue.Queue[Event] = queue.Queue()
    session = Session.start(inference, events)
    try:
        pending = session.ask(request(), block=False)
        assert events.get(timeout=WAIT) == Waiting()
        server.release()
        assert isinstance(events.get(timeout=WAIT), Progress)
        server.release()
        assert events.get(timeout=WAIT) == Content("Hello")
        with pytest.raises(pykka.Timeout):
            pending.get(timeout=0.01)  # still streaming: no answer yet
        server.release()
        assert events.get(timeout=WAIT) == Content(", world")
        server.release(3)
        done = pending.get(timeout=WAIT)
    finally:
        session.stop()
    assert done.content == "Hello, world" and done.finish_reason == "stop"
    assert done.usage == {"prompt_tokens": 9, "completion_tokens": 3}
    assert events.empty()
    assert server.bodies[0]["stream"] is True


def test_the_actor_is_not_deaf_while_a_stream_runs(gated: Gated) -> None:
    """A second request is taken and answered while the first one's stream is stuck."""
    server, inference = gated
    first_events: queue.Queue[Event] = queue.Queue()
    out: list[Completion] = []
    t = threading.Thread(
        target=lambda: out.append(inference.complete(request(), first_events.put, CancelToken()))
    )
    t.start()
    try:
        assert first_events.get(timeout=WAIT) == Waiting()  # first is in, and blocked
        second_events: list[Event] = []
        second_done = threading.Event()

        def second() -> None:
            out.append(inference.complete(request(), second_events.append, CancelToken()))
            second_done.set()

        t2 = threading.Thread(target=second)
        t2.start()
        server.release(12)  # both streams (6 chunks each) may now finish
        assert second_done.wait(WAIT)
        t2.join(WAIT)
    finally:
        server.release(100)
        t.join(WAIT)
    assert [c.content for c in out] == ["Hello, world", "Hello, world"]


def test_cancel_token_ends_a_pending_complete(gated: Gated) -> None:
    server, inference = gated
    cancel = CancelToken()
    events: queue.Queue[Event] = queue.Queue()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            inference.complete(request(), events.put, cancel)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert events.get(timeout=WAIT) == Waiting()
        server.release(2)
        assert isinstance(events.get(timeout=WAIT), Progress)
        cancel.cancel()
        server.release()  # the next chunk comes; the check between chunks ends it
    finally:
        t.join(WAIT)
    (error,) = errors
    assert isinstance(error, InferError) and error.kind is InferErrorKind.CANCELLED


def test_stop_cancels_what_is_in_flight_over_a_real_socket() -> None:
    with FakeLlama([hang()]) as fake:
        inference = Inference.start(config(fake.url, read_timeout_s=600.0, timeout_s=900.0))
        sent = threading.Event()
        errors: list[BaseException] = []

        def run() -> None:
            def sink(e: Event) -> None:
                if isinstance(e, Waiting):
                    sent.set()

            try:
                inference.complete(request(), sink, CancelToken())
            except BaseException as e:
                errors.append(e)

        t = threading.Thread(target=run)
        t.start()
        try:
            assert sent.wait(WAIT)
        finally:
            inference.stop()
            t.join(WAIT)
        (error,) = errors
        assert isinstance(error, InferError) and error.kind is InferErrorKind.CANCELLED
        inference.stop()  # twice is fine


def test_complete_after_stop_is_a_cancelled_error() -> None:
    inference = Inference.start(config("http://127.0.0.1:9"))
    inference.stop()
    with pytest.raises(InferError) as e:
        inference.complete(request(), lambda e: None, CancelToken())
    assert e.value.kind is InferErrorKind.CANCELLED
