"""CancelToken.linked: a child cancelled with its parent at once, never the other way."""

from __future__ import annotations

import threading

from actors.base.cancel import CancelToken
from tests.support.watch import HANG_S

WAIT = HANG_S


def test_cancelling_the_parent_wakes_a_child_waiting_at_once() -> None:
    parent = CancelToken()
    with parent.linked() as child:
        woke = threading.Event()

        def waiter() -> None:
            if child.wait(WAIT):  # a long wait: it must end by the cancel, not the timeout
                woke.set()

        t = threading.Thread(target=waiter)
        t.start()
        parent.cancel()
        t.join(WAIT)
        assert woke.is_set() and child.cancelled


def test_cancelling_the_child_leaves_the_parent_alone() -> None:
    parent = CancelToken()
    with parent.linked() as child:
        child.cancel()
        assert child.cancelled
    assert not parent.cancelled


def test_a_child_of_a_cancelled_parent_starts_cancelled() -> None:
    parent = CancelToken()
    parent.cancel()
    with parent.linked() as child:
        assert child.cancelled


def test_a_child_is_unlinked_when_its_block_ends() -> None:
    """A turn's token outlives many requests: their children must not pile up on it."""
    parent = CancelToken()
    kept = []
    for _ in range(100):
        with parent.linked() as child:
            kept.append(child)
    parent.cancel()
    assert not any(child.cancelled for child in kept)
    assert len(parent._children) == 0
