"""Watching processes and threads from a test: bounded waits, a call in the background, peaks.

Bounds here are hang guards (a test fails instead of hanging), never timing assertions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import psutil

from actors.base.processes.trees import is_alive

__all__ = ["HANG_S", "Background", "Peak", "living", "wait_until"]

T = TypeVar("T")

# How long a wait for something that will happen (a process up, a thread done, an answer)
# may take before the test fails: a hang guard, never a timing. Generous, because on a
# loaded machine (2 cores, other test workers, other jobs) a process start can take seconds;
# a wait that succeeds returns at once, so a passing test never pays for it.
HANG_S = 60.0


def wait_until(predicate: Callable[[], bool], timeout: float = HANG_S, what: str = "it") -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.01)


def living(argv: Sequence[str]) -> list[psutil.Process]:
    """Living processes whose command line starts with ``argv`` (anywhere on the machine)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd[: len(argv)] == list(argv) and is_alive(p):
            found.append(p)
    return found


class Background(Generic[T]):
    """``fn()`` in a thread; :meth:`join` gives its value or raises what it raised."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self._value: list[T] = []
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Callable[[], T]) -> None:
        try:
            self._value.append(fn())
        except BaseException as e:
            self._error.append(e)

    def join(self, timeout: float = 60.0) -> T:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"the background call did not end within {timeout} s")
        if self._error:
            raise self._error[0]
        return self._value[0]


class Peak:
    """Samples ``measure()`` every ``interval`` s in a thread until :meth:`stop`; keeps the max."""

    def __init__(self, measure: Callable[[], int], interval: float = 0.005) -> None:
        self._measure = measure
        self._interval = interval
        self._stop = threading.Event()
        self.peak = measure()
        self.samples = 1
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                value = self._measure()
            except psutil.Error:
                continue
            self.peak = max(self.peak, value)
            self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        return self.peak
