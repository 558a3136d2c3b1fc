"""The inference actor's worker pool: threads are reused, bursts still queue, stop loses nothing.

The model server is an httpx.MockTransport whose stream the test releases chunk by chunk
(``GatedServer`` from test_actor), so what is in flight when is certain.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator
from typing import cast

import httpx
import pykka
import pytest

from actors.events import Event, Queued, Waiting
from actors.inference.actor import Inference, InferenceActor, _Submit
from actors.inference.types import CancelToken, Completion, InferError, InferErrorKind
from tests.inference.conftest import config, request
from tests.inference.test_actor import WAIT, GatedServer

pytestmark = pytest.mark.timeout(60)
CHUNKS = len(GatedServer.CHUNKS)


def workers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loopd-inference-")]


@pytest.fixture
def gated() -> Iterator[tuple[GatedServer, Inference]]:
    server = GatedServer()
    inference = Inference.start(
        config("http://llama.test", parallel=1), transport=httpx.MockTransport(server.handler)
    )
    try:
        yield server, inference
    finally:
        server.release(100)  # never leave a worker blocked on the gate
        inference.stop()


def test_sequential_requests_stream_on_the_same_worker(
    gated: tuple[GatedServer, Inference],
) -> None:
    server, inference = gated
    threads: set[str] = set()

    def sink(_event: Event) -> None:
        threads.add(threading.current_thread().name)

    for _ in range(5):
        server.release(CHUNKS)
        assert inference.complete(request(), sink, CancelToken()).content == "Hello, world"
    assert len(threads) == 1 and next(iter(threads)).startswith("loopd-inference-")


def test_a_request_beyond_parallel_is_queued_then_answered(
    gated: tuple[GatedServer, Inference],
) -> None:
    """parallel = 1: the second request gets its own worker, which emits Queued and waits."""
    server, inference = gated
    first: queue.Queue[Event] = queue.Queue()
    second: queue.Queue[Event] = queue.Queue()
    out: queue.Queue[Completion | BaseException] = queue.Queue()

    def run(events: queue.Queue[Event]) -> None:
        try:
            out.put(inference.complete(request(), events.put, CancelToken()))
        except BaseException as e:
            out.put(e)

    threads = [threading.Thread(target=run, args=(q,)) for q in (first, second)]
    threads[0].start()
    try:
        assert first.get(timeout=WAIT) == Waiting()  # the first holds the only slot
        threads[1].start()
        assert second.get(timeout=WAIT) == Queued(ahead=1)
        server.release(2 * CHUNKS)
        answers = [out.get(timeout=WAIT), out.get(timeout=WAIT)]
    finally:
        server.release(100)
        for t in threads:
            t.join(WAIT)
    assert [getattr(a, "content", a) for a in answers] == ["Hello, world"] * 2
    deadline = time.monotonic() + WAIT
    while len(workers()) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)  # the burst's extra worker ends once it is idle
    assert len(workers()) == 1


class _HeldActor(InferenceActor):
    """Holds its first submit until ``go`` is set, so the test can queue behind it."""

    go = threading.Event()

    def _submit(self, message: _Submit) -> None:
        assert self.go.wait(WAIT)
        super()._submit(message)


def test_a_submit_behind_stop_is_cancelled_not_lost() -> None:
    """pykka drops tells left in a stopped actor's mailbox; their futures must still end."""
    server = GatedServer()
    server.release(100)  # the first submit streams to its end or is cancelled: no matter
    cfg = config("http://llama.test")
    _HeldActor.go.clear()
    ref = _HeldActor.start(cfg, transport=httpx.MockTransport(server.handler))
    inference = Inference(cast(pykka.ActorRef[InferenceActor], ref), cfg)
    try:
        replies: list[pykka.Future[Completion]] = [pykka.ThreadingFuture() for _ in range(2)]
        ref.tell(_Submit(request(), lambda e: None, CancelToken(), replies[0]))
        stopped = ref.stop(block=False)
        ref.tell(_Submit(request(), lambda e: None, CancelToken(), replies[1]))  # still alive
        _HeldActor.go.set()
        assert stopped.get(timeout=WAIT)
        with pytest.raises(InferError) as e:
            replies[1].get(timeout=WAIT)
        assert e.value.kind is InferErrorKind.CANCELLED
        with contextlib.suppress(InferError):
            replies[0].get(timeout=WAIT)
    finally:
        _HeldActor.go.set()
        server.release(100)
        inference.stop()
