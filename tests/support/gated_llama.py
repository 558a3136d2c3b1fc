"""A mocked llama-server whose answer advances one chunk per ``release()``.

With it a test knows what is in flight when: nothing is streamed until the test says so.
Its handler is served over a socket pair (tests/support/http_backend.py, given to
``Inference.start(network=...)``), so it reads each request in a thread of its own.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx

from tests.support.watch import HANG_S

__all__ = ["WAIT", "GatedServer", "delta", "sse"]

WAIT = HANG_S  # how long any single step may take before the test fails: a hang guard


def sse(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def delta(**d: Any) -> bytes:
    return sse({"id": "chatcmpl-a", "choices": [{"index": 0, "delta": d}]})


class GatedServer:
    """A mocked llama-server whose answer advances one chunk per ``release()``."""

    CHUNKS: ClassVar[list[bytes]] = [
        sse({"id": "chatcmpl-a", "choices": [{"index": 0, "delta": {"role": "assistant"}}],
             "prompt_progress": {"total": 9, "cache": 0, "processed": 9, "time_ms": 1}}),
        delta(content="Hello"),
        delta(content=", world"),
        sse({"id": "chatcmpl-a", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        sse({"id": "chatcmpl-a", "choices": [], "usage": {"prompt_tokens": 9,
                                                           "completion_tokens": 3}}),
        sse(b"[DONE]"),
    ]

    def __init__(self) -> None:
        self.gate = threading.Semaphore(0)
        self.bodies: list[dict[str, Any]] = []
        self._arrived = threading.Condition()

    def wait_for_bodies(self, n: int) -> bool:
        """Until ``n`` requests have reached the server (it reads them in its own thread)."""
        with self._arrived:
            return self._arrived.wait_for(lambda: len(self.bodies) >= n, timeout=WAIT)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    def handler(self, req: httpx.Request) -> httpx.Response:
        if req.url.path == "/props":  # the slot keeper asks once, at start: four slots
            return httpx.Response(200, json={"total_slots": 4})
        with self._arrived:
            self.bodies.append(json.loads(req.content))
            self._arrived.notify_all()

        def stream() -> Iterator[bytes]:
            for chunk in self.CHUNKS:
                assert self.gate.acquire(timeout=WAIT), "the test never released the next chunk"
                yield chunk

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream())
