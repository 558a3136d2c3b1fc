"""The watchdog thread: it ticks while watches exist, parks when idle, and wakes for a new one.

Unit tests of the thread alone (no socket: a watch without a stream is only marked
expired); the real-socket cases are in test_cancel.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from actors.base.cancel import CancelToken
from actors.inference.watchdog import Watchdog

pytestmark = pytest.mark.timeout(60)
WAIT = 10.0


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
