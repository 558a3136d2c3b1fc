"""An httpx transport over an httpcore pool whose network backend the caller chooses.

httpx's own ``HTTPTransport`` builds its pool with httpcore's default backend and offers no
way to pass another; loopd needs one in two places: the inference client's sockets must be
reachable by its watchdog (actors/inference/watchdog.py), and fetch_url's connections must
go only to addresses it allows (actors/tools/providers/web.py). This is the part of
``HTTPTransport`` loopd uses (no proxy), over ``httpcore.ConnectionPool(network_backend=...)``
and public API only. httpcore's errors become httpx's, as httpx's transport maps them.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterable, Iterator

import httpcore
import httpx

__all__ = ["PoolTransport"]

# httpcore's error -> httpx's, most specific first (the first the raised error is wins)
_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.NetworkError, httpx.NetworkError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
)


@contextlib.contextmanager
def _as_httpx_errors() -> Iterator[None]:
    try:
        yield
    except Exception as e:
        for theirs, ours in _ERRORS:
            if isinstance(e, theirs):
                raise ours(str(e)) from e
        raise


class _Body(httpx.SyncByteStream):
    """The response body as httpcore streams it, its errors as httpx's."""

    def __init__(self, inner: Iterable[bytes]) -> None:
        self._inner = inner

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx_errors():
            yield from self._inner

    def close(self) -> None:
        close = getattr(self._inner, "close", None)
        if close is not None:
            with _as_httpx_errors():
                close()


class PoolTransport(httpx.BaseTransport):
    """httpx requests over ``httpcore.ConnectionPool(network_backend=backend)``."""

    def __init__(
        self,
        backend: httpcore.NetworkBackend,
        limits: httpx.Limits = httpx.Limits(),  # noqa: B008 (immutable: httpx's own default)
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=backend,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        assert isinstance(request.stream, httpx.SyncByteStream)
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port,
                             target=url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx_errors():
            response = self._pool.handle_request(core)
        assert isinstance(response.stream, Iterable)
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=_Body(response.stream), extensions=response.extensions)

    def close(self) -> None:
        self._pool.close()
