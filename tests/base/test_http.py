"""PoolTransport: httpx over an httpcore pool with the caller's network backend, errors as
httpx's (what loopd's callers catch)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpcore
import httpx
import pytest

from actors.base.http import PoolTransport
from tests.support.http_backend import HandlerBackend

pytestmark = pytest.mark.timeout(60)


def _echo(req: httpx.Request) -> httpx.Response:
    def body() -> Iterator[bytes]:
        yield b"you sent "
        yield req.method.encode() + b" " + req.url.raw_path + b" " + req.content

    return httpx.Response(201, headers={"x-seen": req.headers.get("x-mine", "")}, content=body())


def test_a_request_goes_through_the_given_backend_and_streams_back() -> None:
    backend = HandlerBackend(_echo)
    with httpx.Client(transport=PoolTransport(backend)) as client:
        r = client.post("http://h.test:81/p?q=1", content=b"abc", headers={"x-mine": "1"})
        assert (r.status_code, r.text, r.headers["x-seen"]) == (
            201, "you sent POST /p?q=1 abc", "1")
        with client.stream("GET", "http://h.test:81/s") as streamed:
            assert list(streamed.iter_raw()) != [] and streamed.is_stream_consumed
        client.get("http://h.test:81/again")
    assert backend.connections == 1  # kept alive and reused by the pool
    assert backend.join() and backend.errors == []


def test_a_refused_connection_is_httpx_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with httpx.Client(transport=PoolTransport(httpcore.SyncBackend())) as client, \
                pytest.raises(httpx.ConnectError):
            client.get(f"http://127.0.0.1:{port}/")


def _serve_once(answer: bytes) -> tuple[socket.socket, threading.Thread]:
    """A loopback server that reads one request, sends ``answer`` and closes."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return server, t


@pytest.mark.parametrize(("answer", "error"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", httpx.RemoteProtocolError),
    (b"nonsense\r\n\r\n", httpx.RemoteProtocolError),
])
def test_a_server_breaking_the_protocol_is_httpx_protocol_error(
    answer: bytes, error: type[Exception]
) -> None:
    server, t = _serve_once(answer)
    with server, httpx.Client(transport=PoolTransport(httpcore.SyncBackend())) as client:
        with pytest.raises(error):
            client.get(f"http://127.0.0.1:{server.getsockname()[1]}/")
        t.join(10)


def test_a_silent_server_is_httpx_read_timeout() -> None:
    server = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    transport = PoolTransport(httpcore.SyncBackend())
    with server, httpx.Client(transport=transport, timeout=httpx.Timeout(5, read=0.2)) as client, \
            pytest.raises(httpx.ReadTimeout):  # always: the server never answers
        client.get(f"http://127.0.0.1:{server.getsockname()[1]}/")
