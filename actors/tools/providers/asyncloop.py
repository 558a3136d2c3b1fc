"""A sync/async bridge: an asyncio loop in a thread of its own, for threads that block.

A tool host runs each call in a worker thread of its own, and a provider written against an
asyncio SDK (the MCP SDK) must let each of them wait for its own coroutine without holding
up the others. :class:`LoopThread` runs the loop; :meth:`LoopThread.wait` waits for one
coroutine's result, giving up when the caller's cancel flag is set or its deadline passes
(the coroutine is cancelled then, so its own clean-up runs on the loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread", "Stopped"]

_T = TypeVar("_T")
_POLL_S = 0.1  # how often a waiting thread looks at its cancel flag


class Stopped(enum.Enum):
    """Why :meth:`LoopThread.wait` returned without the coroutine's result."""

    CANCELLED = "cancelled"  # the caller's cancel flag was set
    TIMED_OUT = "timed out"  # the caller's deadline passed
    CLOSED = "closed"  # the loop was closed under it


class LoopThread:
    """An asyncio event loop running in a daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coro`` on the loop; its future, for any thread to wait on."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(
        self, coro: Coroutine[Any, Any, _T], timeout_s: float, cancel: threading.Event
    ) -> _T | Stopped:
        """``coro``'s result, or why there is none: ``cancel`` set or ``timeout_s`` passed
        (the coroutine is cancelled on the loop), or the loop closed. Exceptions of the
        coroutine are raised here."""
        future = self.submit(coro)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=_POLL_S)
            except concurrent.futures.TimeoutError:
                if cancel.is_set():
                    future.cancel()
                    return Stopped.CANCELLED
                if time.monotonic() >= deadline:
                    future.cancel()
                    return Stopped.TIMED_OUT
            except concurrent.futures.CancelledError:
                return Stopped.CLOSED

    def close(self, last: Callable[[], Coroutine[Any, Any, Any]] | None = None,
              timeout_s: float = 10.0) -> None:
        """Run ``last()`` on the loop (at most ``timeout_s``), then stop the loop and its
        thread. Idempotent."""
        if self.loop.is_running():
            if last is not None:
                with contextlib.suppress(Exception):
                    self.submit(last()).result(timeout=timeout_s)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()
