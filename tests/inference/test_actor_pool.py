"""The inference actors: each streams in its own thread, ``parallel`` of them at most, and a
request beyond that is queued (``Queued``), can be cancelled or time out while it waits, and
is never lost when inference stops.

The model server is a handler served over a socket pair (tests/support/http_backend.py)
whose stream the test releases chunk by chunk (``GatedServer``, tests/support/gated_llama.py),
so what is in flight when is certain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections.abc import Iterator

import pykka
import pytest

from actors.base.cancel import CancelToken
from actors.base.events import Content, Event, Queued, Waiting
from actors.inference.actor import Inference, InferenceActor
from actors.inference.types import Completion, InferError, InferErrorKind
from tests.support.gated_llama import WAIT, GatedServer
from tests.support.http_backend import HandlerBackend
from tests.support.inference_rig import config, request

CHUNKS = len(GatedServer.CHUNKS)
Outcome = Completion | BaseException


@pytest.fixture
def gated() -> Iterator[tuple[GatedServer, Inference]]:
    server = GatedServer()
    inference = Inference.start(
        config("http://llama.test", parallel=1), network=HandlerBackend(server.handler)
    )
    try:
        yield server, inference
    finally:
        server.release(100)  # never leave an actor blocked on the gate
        inference.stop()


def in_thread(
    inference: Inference, events: queue.Queue[Event], out: queue.Queue[Outcome],
    cancel: CancelToken | None = None, session: str = "test",
) -> threading.Thread:
    def run() -> None:
        try:
            out.put(inference.complete(request(session=session), events.put,
                                       cancel or CancelToken()))
        except BaseException as e:
            out.put(e)

    t = threading.Thread(target=run)
    t.start()
    return t


def actor_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(InferenceActor.__name__)]


def test_each_request_streams_in_the_actors_thread_not_the_callers(
    gated: tuple[GatedServer, Inference],
) -> None:
    server, inference = gated
    threads: set[str] = set()

    def sink(_event: Event) -> None:
        threads.add(threading.current_thread().name)

    for _ in range(5):
        server.release(CHUNKS)
        assert inference.complete(request(), sink, CancelToken()).content == "Hello, world"
    assert threading.current_thread().name not in threads
    assert len(threads) == 1 and threads <= set(actor_threads())


def test_parallel_actors_are_started_and_all_stopped() -> None:
    before = set(actor_threads())
    inference = Inference.start(config("http://llama.test", parallel=3),
                                network=HandlerBackend(GatedServer().handler))  # fmt: skip
    started = set(actor_threads()) - before
    inference.stop()
    assert len(started) == 3
    assert not started & set(actor_threads())


@dataclasses.dataclass(frozen=True, slots=True)
class Queue2:
    """The second request, queued behind the first, which holds the only actor."""

    second: queue.Queue[Event]
    out: queue.Queue[Outcome]  # both requests' ends, in the order they end
    cancel: CancelToken  # the second's


@contextlib.contextmanager
def held_and_queued(server: GatedServer, inference: Inference) -> Iterator[Queue2]:
    first: queue.Queue[Event] = queue.Queue()
    q = Queue2(queue.Queue(), queue.Queue(), CancelToken())
    threads = [in_thread(inference, first, q.out)]
    try:
        assert first.get(timeout=WAIT) == Waiting()  # the first holds the only actor
        assert server.wait_for_bodies(1)  # and is at the server
        threads.append(in_thread(inference, q.second, q.out, q.cancel, session="other"))
        assert q.second.get(timeout=WAIT) == Queued(ahead=1, sessions="test")  # on whom
        yield q
    finally:
        server.release(100)
        for t in threads:
            t.join(WAIT)


def test_a_request_beyond_parallel_is_queued_and_never_reaches_the_server_early(
    gated: tuple[GatedServer, Inference],
) -> None:
    server, inference = gated
    with held_and_queued(server, inference) as q:
        assert len(server.bodies) == 1  # parallel = 1: one request at the server at a time
        server.release(2 * CHUNKS)
        answers = [q.out.get(timeout=WAIT), q.out.get(timeout=WAIT)]
        assert q.second.get(timeout=WAIT) == Waiting()  # it went out once the first ended
    assert [getattr(a, "content", a) for a in answers] == ["Hello, world"] * 2
    assert len(server.bodies) == 2


def test_cancel_while_queued_ends_it_and_sends_nothing(
    gated: tuple[GatedServer, Inference],
) -> None:
    server, inference = gated
    with held_and_queued(server, inference) as q:
        q.cancel.cancel()
        outcome = q.out.get(timeout=WAIT)
        assert len(server.bodies) == 1  # the queued one never reached the server
    assert isinstance(outcome, InferError) and outcome.kind is InferErrorKind.CANCELLED


def test_a_queued_request_times_out_at_its_deadline() -> None:
    # The deadline is the stimulus; it must pass after the second request was queued, which
    # takes milliseconds alone and can take a second or more on a loaded machine. The first
    # request holds the only actor in its sink (the actor's own thread), where no deadline
    # reaches it, so the actor stays busy past the second's deadline however late that is.
    server = GatedServer()
    inference = Inference.start(
        config("http://llama.test", parallel=1, timeout_s=5.0),
        network=HandlerBackend(server.handler),
    )
    holding, let_go = threading.Event(), threading.Event()

    def held(event: Event) -> None:
        if isinstance(event, Content):
            holding.set()
            let_go.wait(WAIT)

    def ask_first() -> None:
        with contextlib.suppress(InferError):  # its own deadline passes while it is held
            inference.complete(request(), held, CancelToken())

    first = threading.Thread(target=ask_first)
    second_events: queue.Queue[Event] = queue.Queue()
    second_out: queue.Queue[Outcome] = queue.Queue()
    threads = [first]
    try:
        first.start()
        server.release(2)  # the role, then "Hello": the first holds the actor in its sink
        assert holding.wait(WAIT)
        threads.append(in_thread(inference, second_events, second_out, session="other"))
        assert isinstance(second_events.get(timeout=WAIT), Queued)
        outcome = second_out.get(timeout=WAIT)
        assert len(server.bodies) == 1  # the queued one never reached the server
    finally:
        let_go.set()
        server.release(100)
        for t in threads:
            t.join(WAIT)
        inference.stop()
    assert isinstance(outcome, InferError) and outcome.kind is InferErrorKind.TIMEOUT
    assert "queued behind inference.parallel = 1" in outcome.message


def test_stop_ends_the_streaming_and_the_queued_request_and_loses_neither(
    gated: tuple[GatedServer, Inference],
) -> None:
    server, inference = gated
    with held_and_queued(server, inference) as q:
        stopper = threading.Thread(target=inference.stop)
        stopper.start()
        server.release(1)  # the streaming one sees its cancel at the next chunk
        outcomes = [q.out.get(timeout=WAIT), q.out.get(timeout=WAIT)]
        stopper.join(WAIT)
    for outcome in outcomes:
        assert isinstance(outcome, InferError) and outcome.kind is InferErrorKind.CANCELLED
    assert not any(ref.is_alive() for ref in inference._refs)


def test_an_ask_left_in_a_stopped_actors_mailbox_is_cancelled_not_lost() -> None:
    """pykka fails asks behind a stop with ActorDeadError; the handle makes that CANCELLED."""
    server = GatedServer()
    inference = Inference.start(
        config("http://llama.test", parallel=1), network=HandlerBackend(server.handler)
    )
    ref = inference._refs[0]
    ref.stop()
    with pytest.raises(pykka.ActorDeadError):
        ref.ask("anything")
    with pytest.raises(InferError) as e:
        inference.complete(request(), lambda e: None, CancelToken())  # lends the dead actor
    assert e.value.kind is InferErrorKind.CANCELLED and "stopped" in e.value.message
    inference.stop()
    assert server.bodies == []
