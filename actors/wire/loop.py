"""One thread's ZeroMQ loop: its sockets, a waker for other threads, timers and heartbeats.

ZeroMQ sockets are not thread-safe, so every loopd process that speaks ZeroMQ gives its
sockets to one thread that polls them (the daemon and its Python client, a tool host and the
session side's connection to it). This is that thread's loop, written once:

- **sockets**: :meth:`Loop.add` a socket and a handler; each message read (up to
  ``_BATCH`` per wake-up, so timers and other work are not starved by a flood) is passed to
  the handler as its list of frames.
- **a waker**: any thread (or a signal handler) hands work to the loop with :meth:`Loop.post`;
  the work runs in the loop's thread, in the order posted. The loop sleeps in ``poll`` over
  its sockets and one descriptor that posting writes: an ``eventfd`` where the system has one,
  a pipe elsewhere. Measured here (2 shared cores): a wake-up through an eventfd or a pipe
  costs about half of one through an ``inproc://`` PAIR (the PAIR also needs a lock, its
  socket being no more thread-safe than any other), and the eventfd's write and read cost
  1.5 us against the pipe's 2.3 us with one descriptor instead of two. Wake-ups coalesce: one
  write wakes the loop for everything posted before it looks.
- **timers**: :meth:`Loop.call_at`, :meth:`Loop.call_later`, :meth:`Loop.every`, run in the
  loop's thread; ``poll`` sleeps until the next one is due.
- **signals**: :class:`SignalWake` wakes a loop in the main thread when a signal arrives.
  The kernel may hand a process's signal to any of its threads; Python runs the handler in
  the main thread only once that thread runs Python code again, and a loop with no timer
  due sleeps in ``poll`` for ever (a SIGTERM that reached a worker thread left the daemon
  serving). The signal's byte, written by Python's C handler to a pipe the loop polls
  (``signal.set_wakeup_fd``), wakes it whichever thread took the signal.
- **heartbeats**: :class:`Heartbeat` pings a peer every interval (when given a ping) and
  reports it silent after ``misses`` intervals without hearing from it (the zguide's
  "Paranoid Pirate": any message counts as a sign of life).

:meth:`Loop.stop` (from any thread, or a signal handler) ends :meth:`Loop.run`, which
first runs everything posted before the stop: nothing handed to the loop is lost.

Where a quick answer is likely (a tool host that has just handed a call to a worker), the
owner may set :attr:`Loop.linger`: after reading, the loop waits that long on its queue of
posted work before polling again, and a thread posting meanwhile need not write the waker
(waking from a queue is cheaper than from ``poll``).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import math
import os
import queue
import signal
import time
from collections.abc import Callable
from typing import Any, cast

import zmq

__all__ = ["Heartbeat", "Loop", "SignalWake", "Timer"]

_BATCH = 256  # messages read from one socket per wake-up before timers and posts get a turn
_COMPACT = 64  # cancelled timers tolerated in the heap before it is rebuilt without them

Handler = Callable[[list[bytes]], None]


class _Waker:
    """A descriptor ``poll`` watches, that any thread can make readable."""

    def __init__(self) -> None:
        self.closed = False
        if hasattr(os, "eventfd"):
            self.fd = self._w = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - not Linux
            self.fd, self._w = os.pipe()
            for fd in (self.fd, self._w):
                os.set_blocking(fd, False)
                os.set_inheritable(fd, False)

    def wake(self) -> None:
        if self.closed:  # its loop has ended: the descriptor's number may be another file's
            return
        with contextlib.suppress(OSError):  # a full pipe wakes the loop already
            os.write(self._w, b"\x01\0\0\0\0\0\0\0")  # eventfd: add 1; pipe: 8 bytes

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # nothing to read: woken by another round
            os.read(self.fd, 4096)

    def close(self) -> None:
        self.closed = True
        os.close(self.fd)
        if self._w != self.fd:
            os.close(self._w)


class Timer:
    """A call the loop makes when it is due (again every ``interval`` when one is given)."""

    __slots__ = ("args", "cancelled", "fn", "interval", "when")

    def __init__(
        self, when: float, fn: Callable[..., Any], args: tuple[Any, ...], interval: float | None
    ) -> None:
        self.when, self.fn, self.args, self.interval = when, fn, args, interval
        self.cancelled = False  # set by Loop.cancel, or once a one-off timer has run


class Loop:
    """Polls its sockets and its waker; runs posted work and due timers; in one thread.

    Everything but :meth:`post` and :meth:`stop` is for the loop's own thread (its sockets'
    owner); the loop may be built in another thread before it runs.
    """

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._waker = _Waker()
        self._poller.register(self._waker.fd, zmq.POLLIN)
        self._handlers: dict[zmq.Socket[Any], Handler] = {}
        self._fds: dict[int, Callable[[], None]] = {}  # plain descriptors: fd -> on readable
        self._inbox: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._wake_pending = False  # a wake-up is on its way: posting need not write again
        self._lingering = False  # the loop waits on the inbox itself (see linger)
        self._timers: list[tuple[float, int, Timer]] = []
        self._cancelled = 0
        self._seq = itertools.count()
        self._stopping = False
        # After reading: how long to wait for posted work before polling again (0: do not).
        self.linger: Callable[[], float] | None = None

    # --- from any thread -------------------------------------------------------------------

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the loop's thread, after what was posted before it."""
        self._inbox.put((fn, args))
        if not self._lingering and not self._wake_pending:
            self._wake_pending = True
            self._waker.wake()

    def stop(self) -> None:
        """End :meth:`run` (safe from any thread and from a signal handler)."""
        self._stopping = True
        self._waker.wake()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # --- sockets and timers: the loop's thread ---------------------------------------------

    def add(self, sock: zmq.Socket[Any], handler: Handler) -> None:
        """Pass each message ``sock`` receives to ``handler`` (as its frames)."""
        self._handlers[sock] = handler
        self._poller.register(sock, zmq.POLLIN)

    def remove(self, sock: zmq.Socket[Any]) -> None:
        """Stop watching ``sock`` (its owner closes it)."""
        if self._handlers.pop(sock, None) is not None:
            self._poller.unregister(sock)

    def add_fd(self, fd: int, on_readable: Callable[[], None]) -> None:
        """Call ``on_readable()`` when descriptor ``fd`` can be read (it must drain it)."""
        self._fds[fd] = on_readable
        self._poller.register(fd, zmq.POLLIN)

    def remove_fd(self, fd: int) -> None:
        if self._fds.pop(fd, None) is not None:
            self._poller.unregister(fd)

    def call_at(self, when: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` once at ``when`` (``time.monotonic()``) or soon after."""
        return self._push(Timer(when, fn, args, None))

    def call_later(self, delay_s: float, fn: Callable[..., Any], *args: Any) -> Timer:
        return self._push(Timer(time.monotonic() + delay_s, fn, args, None))

    def every(self, interval_s: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run ``fn(*args)`` every ``interval_s`` (from the end of one run to the next), the
        first time one interval from now."""
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"a repeating timer's interval must be positive, not {interval_s!r}")
        return self._push(Timer(time.monotonic() + interval_s, fn, args, interval_s))

    def cancel(self, timer: Timer | None) -> None:
        """Cancel ``timer`` (None: nothing); the heap is rebuilt when many are cancelled."""
        if timer is None or timer.cancelled:
            return
        timer.cancelled = True
        self._cancelled += 1
        if self._cancelled > _COMPACT and self._cancelled * 2 > len(self._timers):
            self._timers = [entry for entry in self._timers if not entry[2].cancelled]
            heapq.heapify(self._timers)
            self._cancelled = 0

    def _push(self, timer: Timer) -> Timer:
        heapq.heappush(self._timers, (timer.when, next(self._seq), timer))
        return timer

    # --- running -----------------------------------------------------------------------------

    def run(self) -> None:
        """Poll and dispatch until :meth:`stop`; then run what was posted before the stop."""
        while not self._stopping:
            self.run_once()
        self._run_posted()

    def run_once(self, max_wait_s: float | None = None) -> None:
        """Wait for a message, posted work or a timer (at most ``max_wait_s``), and handle
        what is there."""
        timeout = self._timeout_ms(max_wait_s)
        read = False
        for what, _ in self._poller.poll(timeout):
            if what == self._waker.fd:
                self._waker.drain()
                continue
            if isinstance(what, int):
                on_readable = self._fds.get(what)
                if on_readable is not None:
                    on_readable()
                continue
            sock = cast("zmq.Socket[Any]", what)
            handler = self._handlers.get(sock)
            if handler is not None:  # not removed by an earlier handler of this round
                self._read(sock, handler)
                read = True
        if read and self.linger is not None:
            self._linger(self.linger())
        self._wake_pending = False  # before the inbox is read: a later post wakes again
        self._run_posted()
        self._run_timers()

    def _timeout_ms(self, max_wait_s: float | None) -> int:
        wait = math.inf if max_wait_s is None else max_wait_s
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
            self._cancelled = max(0, self._cancelled - 1)
        if self._timers:
            wait = min(wait, self._timers[0][0] - time.monotonic())
        if not self._inbox.empty():  # posted while the last round ran
            wait = 0.0
        if math.isinf(wait):
            return -1
        return max(0, math.ceil(wait * 1000))

    def _read(self, sock: zmq.Socket[Any], handler: Handler) -> None:
        for _ in range(_BATCH):
            if not cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:  # cheaper than Again
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handler(frames)
            if self._handlers.get(sock) is not handler:  # the handler removed its socket
                return

    def _linger(self, wait_s: float) -> None:
        if wait_s <= 0 or not self._inbox.empty():
            return
        self._lingering = True
        try:
            fn, args = self._inbox.get(timeout=wait_s)
        except queue.Empty:
            return
        finally:
            self._lingering = False  # then the inbox is read: a late post is run or woken for
        fn(*args)

    def pending(self) -> bool:
        """Whether posted work waits (any thread may ask)."""
        return not self._inbox.empty()

    def run_posted(self) -> None:
        """Run what was posted before now: for an owner that drives the loop from several
        threads in turn (:class:`actors.daemon.client.Client`), before it uses the socket."""
        self._run_posted()

    def _run_posted(self) -> None:
        for _ in range(self._inbox.qsize()):  # what is there now: later posts wake the loop
            fn, args = self._inbox.get_nowait()
            fn(*args)

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                self._cancelled = max(0, self._cancelled - 1)
                continue
            if timer.interval is None:
                timer.cancelled = True  # done: a later cancel is a no-op
            timer.fn(*timer.args)
            if timer.interval is not None and not timer.cancelled:  # a full interval apart
                timer.when = time.monotonic() + timer.interval
                self._push(timer)

    def close(self) -> None:
        """Let go of the waker (after :meth:`run`; the sockets are their owners' to close)."""
        if not self._waker.closed:
            self._waker.close()


class SignalWake:
    """While open, a signal wakes ``loop`` (run in the main thread), whichever thread the
    kernel delivered it to: Python then runs the signal's handler before the loop polls
    again. Build and close it in the main thread (``signal.set_wakeup_fd`` is main-only)."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop
        self._r, self._w = os.pipe()
        for fd in (self._r, self._w):
            os.set_blocking(fd, False)
        loop.add_fd(self._r, self._drain)
        try:
            self._previous = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        except BaseException:
            self._release()
            raise

    def _drain(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: drained
            while os.read(self._r, 4096):
                pass

    def _release(self) -> None:
        self.loop.remove_fd(self._r)
        os.close(self._r)
        os.close(self._w)

    def close(self) -> None:
        signal.set_wakeup_fd(self._previous)
        self._release()

    def __enter__(self) -> SignalWake:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Heartbeat:
    """A peer's liveness, kept by the loop's timers.

    Every ``interval_s`` it calls ``ping`` (when given; a side that only answers pings gives
    none); when nothing was :meth:`heard` from the peer for ``misses`` intervals it calls
    ``on_silent`` with the seconds of silence, once, and stops.
    """

    def __init__(
        self, loop: Loop, interval_s: float, on_silent: Callable[[float], None], *,
        ping: Callable[[], None] | None = None, misses: int = 3,
    ) -> None:  # fmt: skip
        if not (math.isfinite(interval_s) and interval_s > 0):
            raise ValueError(f"a heartbeat's interval must be positive, not {interval_s!r}")
        self.loop, self.interval, self.misses = loop, interval_s, misses
        self.on_silent, self.ping = on_silent, ping
        self.last_rx = self._last_ping = time.monotonic()
        self._timer: Timer | None = loop.call_at(self._due(), self._tick)

    def heard(self) -> None:
        """The peer sent something: it is alive."""
        self.last_rx = time.monotonic()

    def cancel(self) -> None:
        self.loop.cancel(self._timer)
        self._timer = None

    def _due(self) -> float:
        silent_at = self.last_rx + self.misses * self.interval
        if self.ping is None:
            return silent_at
        return min(silent_at, self._last_ping + self.interval)

    def _tick(self) -> None:
        now = time.monotonic()
        silence = now - self.last_rx
        if silence >= self.misses * self.interval:
            self._timer = None
            self.on_silent(silence)
            return
        if self.ping is not None and now - self._last_ping >= self.interval:
            self._last_ping = now
            self.ping()
        self._timer = self.loop.call_at(self._due(), self._tick)
