"""A network backend for httpcore that serves an httpx-style handler over a socket pair.

Tests of the inference client give it to ``LlamaClient(network=...)``/``Inference.start``
instead of a transport: the client keeps its own transport and watchdog, and each
connection is one end of ``socket.socketpair()`` whose other end a thread serves (HTTP/1.1
by h11, the handler's response streamed chunk by chunk as the handler yields it). So a test
that holds a chunk back leaves the client blocked in a real ``recv``, which only the
watchdog's ``shutdown`` can end: the same path as a real server that goes quiet.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import h11
import httpcore
import httpx

__all__ = ["HandlerBackend", "SocketStream"]

Handler = Callable[[httpx.Request], httpx.Response]


class SocketStream(httpcore.NetworkStream):
    """httpcore's view of one connected socket (what its own sync backend makes)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._sock.settimeout(timeout)
        try:
            return self._sock.recv(max_bytes)
        except TimeoutError as e:
            raise httpcore.ReadTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.ReadError(str(e)) from e

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._sock.settimeout(timeout)
        try:
            self._sock.sendall(buffer)
        except TimeoutError as e:
            raise httpcore.WriteTimeout(str(e)) from e
        except OSError as e:
            raise httpcore.WriteError(str(e)) from e

    def close(self) -> None:
        self._sock.close()

    def get_extra_info(self, info: str) -> Any:
        return self._sock if info == "socket" else None


class HandlerBackend(httpcore.NetworkBackend):
    """Every connection is served by ``handler`` in a thread of its own (ended on close)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.errors: list[BaseException] = []  # what the handler raised (the client saw EOF)
        self._threads: list[threading.Thread] = []

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None,
        local_address: str | None = None, socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        ours, theirs = socket.socketpair()
        self.connections += 1
        t = threading.Thread(target=self._serve, args=(theirs, f"{host}:{port}"),
                             name="handler-backend", daemon=True)
        self._threads.append(t)
        t.start()
        return SocketStream(ours)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("HandlerBackend serves TCP urls only")

    def sleep(self, seconds: float) -> None:
        threading.Event().wait(seconds)

    def join(self, timeout: float = 10) -> bool:
        """Wait for every connection's thread to end (after the client closed); True if all
        did."""
        for t in self._threads:
            t.join(timeout)
        return not any(t.is_alive() for t in self._threads)

    def _serve(self, sock: socket.socket, authority: str) -> None:
        conn = h11.Connection(h11.SERVER)
        with sock, contextlib.suppress(OSError, h11.ProtocolError):  # the client went away
            while True:
                request = _receive(sock, conn, authority)
                if request is None:
                    return
                try:
                    _respond(sock, conn, self.handler(request))
                except (OSError, h11.ProtocolError):
                    raise
                except Exception as e:
                    self.errors.append(e)
                    return
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()


def _receive(sock: socket.socket, conn: h11.Connection, authority: str) -> httpx.Request | None:
    head: h11.Request | None = None
    body = b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = sock.recv(65536)
            conn.receive_data(data)  # b"": the peer closed (ConnectionClosed next)
        elif isinstance(event, h11.Request):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            url = f"http://{authority}{head.target.decode()}"
            return httpx.Request(head.method.decode(), url, headers=list(head.headers),
                                 content=body)
        else:  # ConnectionClosed, or PAUSED after a request (not sent by httpcore)
            return None


def _respond(sock: socket.socket, conn: h11.Connection, response: httpx.Response) -> None:
    # h11 frames the body itself: chunked for a streamed one, by Content-Length otherwise
    framing = (b"content-length", b"transfer-encoding")
    headers = [(k, v) for k, v in response.headers.raw if k.lower() not in framing]
    try:
        sock.sendall(conn.send(h11.Response(status_code=response.status_code,
                                            headers=headers)) or b"")
        for chunk in response.iter_bytes():  # as the handler yields them (no encoding)
            if chunk:
                sock.sendall(conn.send(h11.Data(data=chunk)) or b"")
        sock.sendall(conn.send(h11.EndOfMessage()) or b"")
    finally:
        response.close()
