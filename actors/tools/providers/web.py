"""``fetch_url``: a web page or file over http or https, as text for the model.

The web's rules live here (:class:`~actors.tools.providers.standard.StandardTools` calls
:func:`fetch_url`):

- **Public addresses only.** Every connection, the first and each redirect's, goes through
  a network backend that resolves the host itself and connects only to an address it
  checked: loopback, private, link-local, shared, multicast, reserved and unspecified
  addresses are refused, in every spelling (``localhost``, ``0x7f000001``, ``2130706433``,
  ``[::1]``, ``[::ffff:127.0.0.1]``, a name that resolves there), and a name cannot resolve
  to another address between the check and the connection (it is not resolved twice).
  ``tools.web.allow_private = true`` lifts this (the toolbox passes it to its web host in
  :data:`ALLOW_PRIVATE_ENV`; set that to ``1`` for a ``loopd toolhost`` started by hand).
  Proxies from the environment are not used.
- **One deadline for the whole call**, a little before the host's (:func:`time_limit`): a
  watchdog shuts the connection's socket down at the deadline, or as soon as the call is
  cancelled (the host gave up on it), so a server that trickles bytes forever cannot keep
  the worker.
- At most ``max_output`` bytes are read; the rest is not downloaded. No compression is
  asked for, so a small answer cannot unpack into a huge one.
"""

from __future__ import annotations

import codecs
import contextlib
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from actors.tools.protocol.wire import Answer, Denied, Failed, Result

__all__ = ["ALLOW_PRIVATE_ENV", "fetch_url", "refusal", "text_encoding", "time_limit"]

# The text encodings of the web (the WHATWG Encoding Standard's, as Python names them). A
# charset a server names that is not one of them is not used: Python's codecs include code
# (unicode_escape turns "\x1b" in a page into a real escape character, punycode takes time
# quadratic in the page), not only text.
_WEB_ENCODINGS = frozenset({
    "utf-8", "utf-16", "utf-16-le", "utf-16-be", "ascii", "iso8859-1", "iso8859-2",
    "iso8859-3", "iso8859-4", "iso8859-5", "iso8859-6", "iso8859-7", "iso8859-8",
    "iso8859-10", "iso8859-13", "iso8859-14", "iso8859-15", "iso8859-16", "cp1250", "cp1251",
    "cp1252", "cp1253", "cp1254", "cp1255", "cp1256", "cp1257", "cp1258", "cp874", "cp866",
    "koi8-r", "koi8-u", "mac-roman", "gbk", "gb2312", "gb18030", "big5", "big5hkscs",
    "euc_jp", "iso2022_jp", "shift_jis", "cp932", "euc_kr", "cp949",
})

ALLOW_PRIVATE_ENV = "LOOPD_WEB_ALLOW_PRIVATE"
_TICK_S = 0.05
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_KINDS = (
    ("loopback", "a loopback address"), ("link_local", "a link-local address"),
    ("multicast", "a multicast address"), ("unspecified", "an unspecified address"),
    ("private", "a private address"), ("reserved", "a reserved address"),
)


def time_limit(timeout_s: float) -> float:
    """The download's share of the host's limit: 90%, leaving at least 1 s (or half) for the
    answer to get back before the host gives up on the call."""
    return max(timeout_s * 0.5, min(timeout_s * 0.9, timeout_s - 1.0))


def text_encoding(charset: str | None) -> tuple[str, str]:
    """The codec to read a page with, for the ``charset`` its server named, and a note for
    the result when that charset was not used ("" when it was, or none was named)."""
    if not charset:
        return "utf-8", ""
    try:
        name = codecs.lookup(charset).name
    except LookupError:
        return "utf-8", f"[the page's charset {charset[:40]!r} is unknown: read as UTF-8]"
    if name not in _WEB_ENCODINGS:
        return "utf-8", (f"[the page's charset {charset[:40]!r} is not a text encoding of the "
                         "web: read as UTF-8]")
    return name, ""


def refusal(address: str) -> str:
    """What kind of non-public address ``address`` is ("a loopback address"), "" if public."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in _NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = refusal(str(embedded))
            return f"{inner} (as {embedded})" if inner else ""
    for kind, text in _KINDS:
        if getattr(ip, f"is_{kind}"):
            return text
    return "" if ip.is_global else "not a public address"


class _Refused(Exception):
    """A connection to a non-public address, refused before it was made."""


class _Watched:
    """The sockets of one call, shut down at its deadline or when it is cancelled."""

    def __init__(self, deadline: float, cancel: threading.Event) -> None:
        self.deadline = deadline
        self.cancel = cancel
        self.stopped = ""  # why the watchdog ended the call: "time" or "cancel"
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fetch_url-deadline",
                                        daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            if self.stopped:
                _shut(sock)

    def _watch(self) -> None:
        while not self._done.wait(_TICK_S):
            why = "cancel" if self.cancel.is_set() else ""
            why = why or ("time" if time.monotonic() >= self.deadline else "")
            if why:
                with self._lock:
                    self.stopped = why
                    for sock in self._sockets:
                        _shut(sock)
                return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


def _backend(watched: _Watched, allow_private: bool) -> Any:
    import httpcore

    class Guarded(httpcore.SyncBackend):
        """Resolves the host once, connects only to an address it checked, tracks sockets."""

        def connect_tcp(
            self, host: str, port: int, timeout: float | None = None,
            local_address: str | None = None,
            socket_options: Iterable[Any] | None = None,
        ) -> httpcore.NetworkStream:
            remaining = max(0.001, watched.deadline - time.monotonic())
            timeout = remaining if timeout is None else min(timeout, remaining)
            try:
                found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except OSError as e:
                raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from None
            addresses = list(dict.fromkeys(str(info[4][0]) for info in found))
            why = {a: "" if allow_private else refusal(a) for a in addresses}
            allowed = [a for a in addresses if not why[a]]
            if not allowed:
                first = addresses[0]
                raise _Refused(f"{first} is {why[first]}" if first == host
                               else f"{host} resolves to {first}, {why[first]}")
            error: Exception | None = None
            for address in allowed:
                try:
                    stream = super().connect_tcp(address, port, timeout, local_address,
                                                 socket_options)
                except httpcore.ConnectError as e:
                    error = e
                    continue
                watched.add(stream.get_extra_info("socket"))
                return stream
            assert error is not None
            raise error

    return Guarded()


def _client(watched: _Watched, allow_private: bool, timeout_s: float) -> Any:
    import httpx  # slow to import: only hosts that fetch pay for it

    from actors.base.http import PoolTransport

    # no proxy from the environment; httpcore's own pool limits, as before (ten connections)
    transport = PoolTransport(
        _backend(watched, allow_private),
        httpx.Limits(max_connections=10, max_keepalive_connections=None, keepalive_expiry=None),
        ssl_context=httpx.create_ssl_context(trust_env=False),
    )
    return httpx.Client(transport=transport, follow_redirects=True, max_redirects=5,
                        timeout=timeout_s, trust_env=False)


def fetch_url(url: str, *, timeout_s: float, max_output: int, cancel: threading.Event,
              allow_private: bool | None = None) -> Answer:
    """GET ``url`` and answer its status, content type and text (cut at ``max_output`` bytes).

    ``allow_private`` None: from :data:`ALLOW_PRIVATE_ENV` (``1`` allows).
    """
    limit = time_limit(timeout_s)  # from the call's start: httpx's import counts too
    deadline = time.monotonic() + limit
    import httpx

    if not url.startswith(("http://", "https://")):
        return Failed(message=f"fetch_url: {url!r} is not an http:// or https:// URL")
    if allow_private is None:
        allow_private = os.environ.get(ALLOW_PRIVATE_ENV) == "1"
    watched = _Watched(deadline, cancel)
    data = bytearray()
    more = late = False
    head, encoding = "", "utf-8"
    try:
        with (
            _client(watched, allow_private, limit) as client,
            client.stream("GET", url, headers={"user-agent": "loopd-fetch_url",
                                               "accept-encoding": "identity"}) as r,
        ):
            kind = r.headers.get("content-type", "")
            head = f"HTTP {r.status_code} {r.reason_phrase}\ncontent-type: {kind}"
            encoding, said = text_encoding(r.charset_encoding)
            for chunk in r.iter_raw():
                data += chunk
                if len(data) > max_output:
                    more = True
                    del data[max_output:]
                    break
    except _Refused as e:
        return Denied(reason=(
            f"fetch_url reaches public addresses only: {e} (tools.web.allow_private = true "
            "allows loopback and private addresses)"
        ))
    except httpx.InvalidURL as e:  # not an HTTPError
        return Failed(message=f"fetch_url: {url!r} is not a valid URL: {e}")
    except httpx.HTTPError as e:
        # httpx's own timeout (the same limit, counted from a later start) can beat the
        # watchdog's tick on a busy machine: past the deadline it is the deadline all the same
        late = time.monotonic() >= deadline
        if not (watched.stopped or late):
            return Failed(message=f"fetch_url could not fetch {url}: {type(e).__name__}: {e}")
    finally:
        watched.close()
    stopped = watched.stopped or ("time" if late else "")
    if stopped == "cancel":
        return Failed(message="fetch_url was cancelled; the download was stopped")
    if stopped and not head:
        return Failed(message=f"fetch_url: {url} did not answer within {limit:.3g} s")
    text = bytes(data).decode(encoding, "replace") if head else ""
    note = f"\n{said}" if head and said else ""
    if more:
        note += f"\n[cut at {max_output} bytes: the rest was not fetched]"
    elif stopped:
        note += (f"\n[stopped at the time limit ({limit:.3g} s) after {len(data)} bytes: the "
                "rest was not fetched]")
    return Result(content=f"{head}\n\n{text}{note}", untrusted=True)
