"""The ACP wire on stdin/stdout: one JSON-RPC message per line, and nothing else on stdout.

:class:`StdioTransport` is the message transport the SDK's connection reads and writes
(``acp._transport.Transport``: ``send``, ``receive``, ``close``). It is loopd's own rather
than the SDK's byte-stream reader for three reasons:

- **Bad input is answered.** The SDK logs a line that is not JSON and reads on, so a client
  waits forever for an answer. Here a line that is not JSON gets a JSON-RPC parse error
  (-32700), a JSON value that is not one message (an array: ACP has no batches, a number,
  a message with neither a method nor a result) an invalid-request error (-32600), both
  with ``id: null`` unless the id could be read; then the next line is read as usual.
- **Depth has a limit.** A line nested past what the parser follows (Python's recursion
  limit: a 200 KB line of brackets) is answered with -32600, under its id when its first
  bytes name one, never ends the agent.
- **A line has a limit.** A line over :data:`MAX_MESSAGE_BYTES` is read through to its end
  and dropped (never held whole in memory) and answered with -32600 under the request's id
  when its first bytes name one, so the client's request fails instead of hanging.
- **stdout is only the protocol's.** :func:`claim_stdio` moves the protocol to private
  copies of fds 0 and 1, points fd 0 at ``/dev/null`` and fd 1 at stderr: a stray print, a
  library's warning or a child process (tool hosts, the embedded server) can never write
  into the protocol nor read from it.

End of input (or :meth:`StdioTransport.end`, on SIGTERM) first awaits ``on_end`` (the agent
winds its turns down, so the requests already read are answered), then every write is
flushed, then ``receive`` returns None and the connection closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import json
import os
import re
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from actors.base.durable import write_all

__all__ = [
    "MAX_MESSAGE_BYTES", "LineSplitter", "Oversized", "StdioTransport", "check_message",
    "claim_stdio", "id_in_head",
]  # fmt: skip

MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # one JSON-RPC line; as daemon.max_frame_bytes' default
HEAD_BYTES = 4096  # what is kept of an oversized line to find its id
_CHUNK = 1 << 16
_DRAIN_S = 10.0  # at the end: how long unsent answers may take to leave

PARSE_ERROR, INVALID_REQUEST = -32700, -32600
JsonId = str | int | float | None


def claim_stdio() -> tuple[int, int]:
    """Private copies of stdin and stdout for the protocol; fd 0 becomes /dev/null and fd 1
    stderr, so nothing else in this process (or its children) touches the protocol."""
    proto_in, proto_out = os.dup(0), os.dup(1)  # not inherited by children (PEP 446)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return proto_in, proto_out


@dataclasses.dataclass(frozen=True, slots=True)
class Oversized:
    """A line over the limit: its first bytes (for its id) and its whole size."""

    head: bytes
    size: int


class LineSplitter:
    """Bytes in, whole lines out (without their newline), none longer than ``limit``: a longer
    line comes out as :class:`Oversized`. Pure: the reader thread feeds it."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._over: int | None = None  # an oversized line's size so far (the buffer: its head)

    def feed(self, chunk: bytes) -> list[bytes | Oversized]:
        out: list[bytes | Oversized] = []
        start = 0
        while (newline := chunk.find(b"\n", start)) >= 0:
            self._take(chunk[start:newline])
            out.append(self._line())
            start = newline + 1
        self._take(chunk[start:])
        return out

    def end(self) -> list[bytes | Oversized]:
        """What is left at the end of input: a last line without its newline."""
        return [self._line()] if self._buf or self._over is not None else []

    def _take(self, piece: bytes) -> None:
        if self._over is None and len(self._buf) + len(piece) > self.limit:
            self._over = len(self._buf)  # over the limit: from here on only its head is kept
            del self._buf[HEAD_BYTES:]
        if self._over is None:
            self._buf += piece
        else:
            self._over += len(piece)
            self._buf += piece[: max(0, HEAD_BYTES - len(self._buf))]

    def _line(self) -> bytes | Oversized:
        line: bytes | Oversized = (
            bytes(self._buf) if self._over is None else Oversized(bytes(self._buf), self._over)
        )
        self._buf.clear()
        self._over = None
        return line


_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|[^\s{}\[\]:,"]+')


def id_in_head(head: bytes) -> JsonId:
    """The top-level ``"id"`` of a message's first bytes, when it is there and whole."""
    depth, key, after_colon = 0, None, False
    for m in _TOKEN.finditer(head):
        token = m.group()
        if token in (b"{", b"["):
            depth += 1
        elif token in (b"}", b"]"):
            depth -= 1
        elif token == b":":
            after_colon = depth == 1
            continue
        elif depth == 1 and after_colon and key == b'"id"' and m.end() < len(head):
            with contextlib.suppress(ValueError):
                value = json.loads(token)
                if _valid_id(value):
                    return value  # type: ignore[no-any-return]
            return None
        elif depth == 1 and not after_colon:
            key = token
        after_colon = False
    return None


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, str | int | float) and not isinstance(value, bool))


def check_message(message: Any) -> tuple[JsonId, str] | None:
    """None for a JSON-RPC message the connection can take; else the id to answer under and
    what is wrong (an invalid request)."""
    if not isinstance(message, dict):
        return None, (f"a message is one JSON object, not {type(message).__name__} (ACP has no "
                      "batches)")
    rid = message.get("id")
    if not _valid_id(rid):
        return None, "id must be a string, a number or null"
    if "method" in message:
        if not isinstance(message["method"], str):
            return rid, "method must be a string"
        if message.get("params") is not None and not isinstance(message["params"], dict | list):
            return rid, "params must be an object"
        return None
    if "id" in message and ("result" in message or "error" in message):
        return None  # an answer to one of our requests (a permission request)
    return rid, "a message has a method (a request or a notification) or a result or an error"


def _error(rid: JsonId, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


_EOF = object()


class StdioTransport:
    """JSON-RPC messages over two file descriptors (see the module docstring)."""

    def __init__(
        self, read_fd: int, write_fd: int, *, limit: int = MAX_MESSAGE_BYTES,
        on_end: Callable[[], Awaitable[None]] | None = None,
        on_message: Callable[[dict[str, Any]], None] = lambda _: None,
        following: Callable[[dict[str, Any]], list[dict[str, Any]]] = lambda _: [],
    ) -> None:  # fmt: skip
        self.read_fd, self.write_fd, self.limit, self.on_end = read_fd, write_fd, limit, on_end
        self.on_message = on_message  # sees each message first (what the SDK's types drop)
        # the messages to write right after one (notices of a session the answer names)
        self.following = following
        self._loop = asyncio.get_running_loop()
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._writer = concurrent.futures.ThreadPoolExecutor(1, "loopd-acp-stdout")
        self._writes: set[asyncio.Future[None]] = set()
        self._ended = False
        self._closed = False
        threading.Thread(target=self._read, name="loopd-acp-stdin", daemon=True).start()

    # --- reading: a thread of its own (any kind of fd blocks it, nothing else) ------------

    def _read(self) -> None:
        splitter = LineSplitter(self.limit)
        try:
            while chunk := os.read(self.read_fd, _CHUNK):
                for line in splitter.feed(chunk):
                    self._deliver(line)
            for line in splitter.end():
                self._deliver(line)
        except OSError:
            pass
        finally:
            self._deliver(_EOF)

    def _deliver(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: the process is ending
            self._loop.call_soon_threadsafe(self._inbox.put_nowait, item)

    def end(self) -> None:
        """End the input as if stdin had closed (SIGTERM, SIGINT)."""
        self._inbox.put_nowait(_EOF)

    async def receive(self) -> dict[str, Any] | None:
        while True:
            item = await self._inbox.get()
            if item is _EOF:
                await self._finish()
                return None
            if isinstance(item, Oversized):
                await self._answer(id_in_head(item.head), INVALID_REQUEST, (
                    f"a message of {item.size} bytes is over loopd's limit of {self.limit} "
                    "bytes per message; send less (a prompt that size would not fit the "
                    "model's context)"))
                continue
            if not item.strip():
                continue
            try:
                message = json.loads(item)
            except ValueError as e:
                await self._answer(None, PARSE_ERROR, f"Parse error: not JSON ({e})")
                continue
            except RecursionError:  # brackets nested past what the parser follows
                await self._answer(id_in_head(item[:HEAD_BYTES]), INVALID_REQUEST, (
                    "Invalid request: the message nests deeper than loopd reads; send it "
                    "flatter"))
                continue
            problem = check_message(message)
            if problem is not None:
                await self._answer(problem[0], INVALID_REQUEST, f"Invalid request: {problem[1]}")
                continue
            self.on_message(message)
            return message  # type: ignore[no-any-return]

    async def _finish(self) -> None:
        if not self._ended:
            self._ended = True
            if self.on_end is not None:
                await self.on_end()
            await self.drain()

    async def _answer(self, rid: JsonId, code: int, message: str) -> None:
        with contextlib.suppress(OSError):
            await self.send(_error(rid, code, message))

    # --- writing: one thread, in order; a client that stops reading blocks only it -------

    async def send(self, message: dict[str, Any]) -> None:
        if self._closed:
            raise ConnectionError("stdout is closed")
        writes = [self._write(m) for m in (message, *self.following(message))]
        await asyncio.gather(*writes)

    def _write(self, message: dict[str, Any]) -> asyncio.Future[None]:
        """``message`` queued for the one writer thread: written in the order queued."""
        data = (json.dumps(message, separators=(",", ":"), default=str) + "\n").encode()
        write = self._loop.run_in_executor(self._writer, write_all, self.write_fd, data)
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)
        return write

    async def drain(self) -> None:
        """Wait (up to a limit) for every message sent so far to be written."""
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=_DRAIN_S)

    async def close(self) -> None:
        if self._closed:
            return
        await self.drain()
        self._closed = True
        self._writer.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            os.close(self.write_fd)
