"""The ``.http`` recording format: exchanges with a real llama-server, bytes as sent.

A file holds one or more exchanges, in order::

    ### request
    POST /v1/chat/completions HTTP/1.1
    Content-Type: application/json
    <blank line>
    <request body: JSON on one line>
    ### response
    HTTP/1.1 200 OK
    Content-Type: text/event-stream
    <blank line>
    <response body, byte for byte as received; for a stream, the SSE events>

A response body runs until the next ``### request`` line or the end of the file, so a
body must end with a newline (SSE streams do) and must not hold a ``### request`` line;
:func:`dump` adds the newline where one is missing and refuses the other. Used by the
tests, the fake llama-server (replay) and ``scripts/record.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from actors.base.errors import RecordingError

__all__ = [
    "Exchange",
    "Request",
    "Response",
    "dump",
    "load",
    "parse",
    "save",
]

_REQUEST = b"### request\n"
_RESPONSE = b"### response\n"
_SPLIT = re.compile(rb"^### request\n", re.MULTILINE)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str, default: str = "") -> str:
        for key, value in self.headers:
            if key.lower() == name.lower():
                return value
        return default

    @property
    def content_type(self) -> str:
        return self.header("Content-Type")


@dataclasses.dataclass(frozen=True, slots=True)
class Exchange:
    request: Request
    response: Response


def load(path: str | os.PathLike[str]) -> list[Exchange]:
    """The exchanges of one .http file, in order."""
    p = Path(path)
    try:
        return parse(p.read_bytes())
    except RecordingError as e:
        raise RecordingError(f"{p}: {e}") from None


def parse(data: bytes) -> list[Exchange]:
    if not data.startswith(_REQUEST):
        raise RecordingError("must start with a '### request' line")
    parts = _SPLIT.split(data)[1:]
    return [_exchange(part, i + 1) for i, part in enumerate(parts)]


def _exchange(part: bytes, number: int) -> Exchange:
    where = f"exchange {number}"
    cut = part.find(b"\n" + _RESPONSE)
    if cut < 0:
        raise RecordingError(f"{where}: no '### response' line")
    request_text, response_text = part[: cut + 1], part[cut + 1 + len(_RESPONSE) :]
    start, headers, body = _head(request_text, where + " request")
    try:
        method, path, _version = start.split(" ", 2)
    except ValueError:
        raise RecordingError(f"{where}: bad request line {start!r}") from None
    if body.endswith(b"\n"):
        body = body[:-1]  # the line break before '### response' is not part of the body
    status_line, rheaders, rbody = _head(response_text, where + " response")
    try:
        _v, status, reason = [*status_line.split(" ", 2), ""][:3]
        code = int(status)
    except ValueError:
        raise RecordingError(f"{where}: bad status line {status_line!r}") from None
    return Exchange(Request(method, path, headers, body), Response(code, reason, rheaders, rbody))


def _head(text: bytes, where: str) -> tuple[str, tuple[tuple[str, str], ...], bytes]:
    head, sep, body = text.partition(b"\n\n")
    if not sep:
        raise RecordingError(f"{where}: no blank line after the headers")
    try:
        lines = head.decode("utf-8").split("\n")
    except UnicodeDecodeError:
        raise RecordingError(f"{where}: the head is not UTF-8") from None
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise RecordingError(f"{where}: bad header line {line!r}")
        headers.append((name.strip(), value.strip()))
    return lines[0], tuple(headers), body


def dump(exchanges: list[Exchange]) -> bytes:
    """The .http bytes of ``exchanges``; the inverse of :func:`parse`."""
    out = bytearray()
    for i, ex in enumerate(exchanges, 1):
        req, resp = ex.request, ex.response
        if b"\n" in req.body:
            raise RecordingError(f"exchange {i}: the request body must be one line")
        body = resp.body if resp.body.endswith(b"\n") or not resp.body else resp.body + b"\n"
        if _SPLIT.search(body) or body.startswith(_REQUEST):
            raise RecordingError(f"exchange {i}: the response body holds a '### request' line")
        out += _REQUEST
        out += f"{req.method} {req.path} HTTP/1.1\n".encode()
        out += b"".join(f"{k}: {v}\n".encode() for k, v in req.headers)
        out += b"\n" + req.body + b"\n"
        out += _RESPONSE
        out += f"HTTP/1.1 {resp.status} {resp.reason}\n".encode()
        out += b"".join(f"{k}: {v}\n".encode() for k, v in resp.headers)
        out += b"\n" + body
    return bytes(out)


def save(path: str | os.PathLike[str], exchanges: list[Exchange], *, append: bool = False) -> None:
    """Write ``exchanges`` to ``path`` (after the exchanges already there with ``append``)."""
    p = Path(path)
    before = load(p) if append and p.exists() else []
    p.write_bytes(dump(before + exchanges))
