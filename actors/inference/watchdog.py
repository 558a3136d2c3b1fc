"""Ends a blocked HTTP exchange at once when its turn is cancelled or its deadline passes.

A cancel checked between chunks is not enough: llama-server sends nothing at all (not even
headers) while a request waits for its slot, and keep-alive comments come only every 30 s
during a long prompt. So the client's transport records, per thread, the socket that an
exchange is using, and one watchdog thread per client shuts that socket down when the
exchange's cancel token is set or its wall-clock deadline passes. ``shutdown(SHUT_RDWR)``
wakes a ``recv`` blocked in another thread at once (``close`` does not); the reader then
sees the connection end, and the client turns that into ``Cancelled`` or ``Timeout``.

The watch sits in the network backend, under httpcore's pool
(:class:`actors.base.http.PoolTransport`), around whatever backend makes the sockets: the
system's, or a test's (tests/support/http_backend.py serves an httpx-style handler over a
socket pair), so the watchdog works the same for both.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

from actors.base.cancel import CancelToken
from actors.base.http import PoolTransport

__all__ = ["Watch", "Watchdog", "watched_transport"]

_local = threading.local()


class Watch:
    """One exchange under watch: its cancel token, deadline and current socket."""

    __slots__ = ("_shut", "cancel", "deadline", "expired", "stream")

    def __init__(self, cancel: CancelToken, deadline: float) -> None:
        self.cancel = cancel
        self.deadline = deadline  # time.monotonic() value
        self.stream: _TrackedStream | None = None  # set by the transport, from this thread
        self.expired: str | None = None  # "cancelled" | "deadline", set by the watchdog
        self._shut: _TrackedStream | None = None

    def check(self, now: float) -> None:
        """Mark the watch expired when due, and shut the socket it is using (once each)."""
        if self.expired is None:
            if self.cancel.cancelled:
                self.expired = "cancelled"
            elif now >= self.deadline:
                self.expired = "deadline"
        stream = self.stream
        if self.expired is not None and stream is not None and stream is not self._shut:
            self._shut = stream
            stream.shutdown()


class _TrackedStream(httpcore.NetworkStream):
    """A socket stream that tells the watch of the calling thread it is in use.

    Every exchange writes its request before it reads, so ``write`` is where the stream is
    announced; ``read`` is the inner stream's own method, bound per instance, because it
    runs once per streamed token.
    """

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner
        self.read = inner.read  # type: ignore[method-assign]

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # see __init__
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        watch = getattr(_local, "watch", None)
        if watch is not None:
            watch.stream = self
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        return _TrackedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)

    def shutdown(self) -> None:
        sock = self._inner.get_extra_info("socket")
        if isinstance(sock, socket.socket):
            with contextlib.suppress(OSError):  # already closed: nothing is blocked on it
                sock.shutdown(socket.SHUT_RDWR)


class _TrackingBackend(httpcore.NetworkBackend):
    """Wraps every stream ``inner`` makes so the watch of the thread using it can shut it."""

    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _TrackedStream(
            self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        )

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        return _TrackedStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def watched_transport(
    limits: httpx.Limits, network: httpcore.NetworkBackend | None = None
) -> PoolTransport:
    """A transport whose sockets (made by ``network``, the system's by default) the
    watchdog can shut down."""
    return PoolTransport(_TrackingBackend(network or httpcore.SyncBackend()), limits)


class Watchdog:
    """One daemon thread per client, checking every ``interval`` while watches exist.

    A new watch does not wake the thread (that wake-up cost every model call a thread
    switch): the thread keeps ticking for ``linger`` seconds after the last watch
    ends, so back-to-back requests find it awake; only a parked thread is notified.
    """

    def __init__(self, interval: float = 0.05, linger: float = 2.0) -> None:
        self._interval = interval
        self._linger = linger
        self._watches: set[Watch] = set()
        self._lock = threading.Condition()
        self._closed = False
        self._parked = False  # waiting without a timeout: a new watch must notify
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, cancel: CancelToken, deadline: float) -> Iterator[Watch]:
        """Watch the exchanges the calling thread makes inside the block."""
        w = Watch(cancel, deadline)
        previous = getattr(_local, "watch", None)
        _local.watch = w
        with self._lock:
            self._watches.add(w)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="loopd-inference-watchdog", daemon=True
                )
                self._thread.start()
            elif self._parked:
                self._parked = False
                self._lock.notify()
        try:
            yield w
        finally:
            _local.watch = previous
            with self._lock:
                self._watches.discard(w)

    def _run(self) -> None:
        busy = time.monotonic()  # when a watch was last seen
        while True:
            with self._lock:
                if self._closed:
                    return
                if not self._watches and time.monotonic() - busy >= self._linger:
                    self._parked = True
                    while self._parked and not self._closed:
                        self._lock.wait()
                    continue
                watches = list(self._watches)
            now = time.monotonic()
            if watches:
                busy = now
            for w in watches:
                w.check(now)
            with self._lock:
                self._lock.wait_for(lambda: self._closed, timeout=self._interval)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
