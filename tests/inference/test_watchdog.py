"""The watchdog thread: it ticks while watches exist, parks when idle, and wakes for a new one.

Unit tests of the thread alone (no socket: a watch without a stream is only marked
expired); the real-socket cases against the fake llama-server are in test_cancel, and the
same cases over the tests' own network backend (what the actor tests use) are below.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from actors.base.cancel import CancelToken
from actors.base.events import Event, Waiting
from actors.inference.llama import LlamaClient
from actors.inference.types import InferError, InferErrorKind
from actors.inference.watchdog import Watchdog
from tests.support.http_backend import HandlerBackend
from tests.support.inference_rig import config, request
from tests.support.watch import HANG_S

WAIT = HANG_S


def eventually(ok: Callable[[], bool]) -> bool:
    end = time.monotonic() + WAIT
    while not ok():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


@pytest.fixture
def dog() -> Iterator[Watchdog]:
    wd = Watchdog(interval=0.01, linger=0.0)
    try:
        yield wd
    finally:
        wd.close()


def test_a_watch_made_while_the_thread_is_parked_is_still_checked(dog: Watchdog) -> None:
    far = time.monotonic() + 3600
    with dog.watch(CancelToken(), far) as first:
        pass
    assert first.expired is None
    assert eventually(lambda: dog._parked)  # idle past its linger: waits with no timeout
    cancel = CancelToken()
    cancel.cancel()
    with dog.watch(cancel, far) as w:
        assert eventually(lambda: w.expired == "cancelled")


def test_a_watch_made_while_the_thread_ticks_is_checked(dog: Watchdog) -> None:
    now = time.monotonic()
    with dog.watch(CancelToken(), now + 3600), dog.watch(CancelToken(), now - 1) as late:
        assert eventually(lambda: late.expired == "deadline")


def test_close_ends_a_parked_thread(dog: Watchdog) -> None:
    with dog.watch(CancelToken(), time.monotonic() + 3600):
        pass
    assert eventually(lambda: dog._parked)
    thread = dog._thread
    dog.close()
    assert thread is not None and not thread.is_alive()


# --- over the tests' network backend (a handler on a socket pair): the watchdog is on too ---


def _silent_after_headers(gate: threading.Event) -> Callable[[httpx.Request], httpx.Response]:
    """A server that answers /props, and for a chat sends its headers and then nothing."""

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/props":
            return httpx.Response(200, json={"total_slots": 1})

        def quiet() -> Iterator[bytes]:
            yield b": waiting for a slot\n\n"  # a comment: no event, the reader goes on waiting
            gate.wait(WAIT)

        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=quiet())

    return handler


@pytest.mark.parametrize("how", ["cancel", "deadline"])
def test_the_watchdog_ends_a_blocked_read_on_the_test_backend(how: str) -> None:
    """Nothing arrives and httpx's read timeout is far away: only the watchdog's shutdown of
    the socket can end the read, so the client returning at all shows it worked."""
    gate = threading.Event()
    backend = HandlerBackend(_silent_after_headers(gate))
    timeout_s = 1.0 if how == "deadline" else 3600.0
    client = LlamaClient(config("http://llama.test", retries=0, timeout_s=timeout_s,
                                read_timeout_s=3600.0), network=backend)
    cancel, events = CancelToken(), queue.Queue[Event]()
    outcome: queue.Queue[BaseException | object] = queue.Queue()

    def ask() -> None:
        try:
            outcome.put(client.chat(request(), events.put, cancel))
        except BaseException as e:
            outcome.put(e)

    t = threading.Thread(target=ask)
    t.start()
    try:
        assert events.get(timeout=WAIT) == Waiting()
        if how == "cancel":
            cancel.cancel()
        error = outcome.get(timeout=WAIT)
    finally:
        gate.set()
        t.join(WAIT)
        client.close()
    assert isinstance(error, InferError)
    assert error.kind is (InferErrorKind.CANCELLED if how == "cancel" else InferErrorKind.TIMEOUT)
    assert backend.connections == 1 and backend.join()  # one exchange, and its server ended
