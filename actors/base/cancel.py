"""The cancel token of a turn: one flag, set once, seen by every thread the turn uses.

It lives apart from the session, inference and tool modules because all of them (the tool
client included) wait on it, and none of them may import another for it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from actors.base.errors import LoopdError

__all__ = ["CancelToken", "wait_out"]

T = TypeVar("T")


class CancelToken:
    """Set once to cancel a turn; checked between stream chunks and while waiting on tools.

    ``linked()`` gives a child token that is cancelled with its parent (at once, no polling)
    or on its own: the inference handle cancels a request's child when it stops, without
    cancelling the caller's whole turn.
    """

    __slots__ = ("_children", "_event", "_lock")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._children: set[CancelToken] = set()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            self._event.set()
            children = list(self._children)
        for child in children:
            child.cancel()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float) -> bool:
        return self._event.wait(timeout)

    @contextlib.contextmanager
    def linked(self) -> Iterator[CancelToken]:
        """A child token for the block: cancelled with this one; unlinked when the block ends."""
        child = CancelToken()
        with self._lock:
            if self._event.is_set():
                child._event.set()
            else:
                self._children.add(child)
        try:
            yield child
        finally:
            with self._lock:
                self._children.discard(child)


def wait_out(step: Callable[[], T | None], cancel: Callable[[], None]) -> T:
    """Call ``step`` until it gives a result: a turn waited for by the person's command.

    Ctrl-C (KeyboardInterrupt) while waiting calls ``cancel`` and waits on for the turn to
    wind down (its LoopdError, e.g. Cancelled, is raised as usual). A subclass of
    KeyboardInterrupt (the CLI's SIGTERM) cancels the same way and is raised again once the
    turn has ended, so it ends the command too."""
    ending: KeyboardInterrupt | None = None
    while True:
        try:
            result = step()
        except KeyboardInterrupt as e:
            cancel()
            if type(e) is not KeyboardInterrupt:
                ending = e
            continue
        except LoopdError:
            if ending is not None:
                raise ending from None
            raise
        if result is not None:
            break
    if ending is not None:
        raise ending
    return result
