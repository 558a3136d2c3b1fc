"""Inference client overhead: loopd's streaming client versus a bare httpx stream.

The fake llama-server replays a real recording from its own process (a server thread in
this process would share its GIL and slow every client down: docs/bench.md). Per round, one
request of each kind goes in turn, so all three see the same machine state:

- floor: a bare ``httpx`` streaming POST that reads every line (no parsing);
- ``LlamaClient.chat``: SSE parsing, JSON per chunk, events to a sink, the Completion;
- ``Inference.complete``: the same, asked of an inference actor that streams in its thread.

Overhead per streamed token = (client p50 - floor p50) / the recording's delta count.
"""

from __future__ import annotations

import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from actors.base.cancel import CancelToken
from actors.base.config import InferenceConfig
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.inference.llama import LlamaClient
from actors.inference.types import ChatRequest
from tests.support import recording
from tests.support.fake_llama import in_process

__all__ = ["run"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "http"  # the real llama-server recordings
WORKLOADS = [("text.http", 0), ("cache_loss.http", 0)]  # (file, exchange): 9 and 160 tokens
ROUNDS = 200
WARMUP = 20
SMOKE = {"ROUNDS": 3, "WARMUP": 1}  # `bench --smoke`


@contextlib.contextmanager
def fake_server(path: Path, exchange: int) -> Iterator[str]:
    """The fake llama-server in its own process, replaying one exchange again and again."""
    tmp = tempfile.TemporaryDirectory(prefix="loopd-bench-")
    one = Path(tmp.name) / f"{path.stem}-{exchange}.http"
    recording.save(one, [recording.load(path)[exchange]])
    try:
        with in_process("tests.support.fake_llama", "--replay", str(one), "--cycle") as url:
            yield url
    finally:
        tmp.cleanup()


def _deltas(body: bytes) -> int:
    """Streamed tokens: data events with a reasoning, content or tool-call delta."""
    keys = (b'"reasoning_content":"', b'"content":"', b'"tool_calls":[')
    return sum(
        1 for line in body.split(b"\n")
        if line.startswith(b"data: {") and any(k in line for k in keys)
    )


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _workload(name: str, exchange: int) -> list[dict[str, Any]]:
    path = FIXTURES / name
    ex = recording.load(path)[exchange]
    body = ex.request.json()
    tokens = _deltas(ex.response.body)
    request = ChatRequest(
        session="bench", messages=tuple(body["messages"]), tools=tuple(body.get("tools") or ()),
        max_tokens=body.get("max_tokens"),
    )
    raw = ex.request.body
    events: list[Event] = []

    def sink(e: Event) -> None:
        events.append(e)

    with fake_server(path, exchange) as url:
        config = InferenceConfig(url=url, retries=0)
        bare = httpx.Client(timeout=30)
        client = LlamaClient(config)
        inference = Inference.start(config)
        try:
            def floor() -> None:
                with bare.stream("POST", url + "/v1/chat/completions", content=raw,
                                 headers={"Content-Type": "application/json"}) as r:
                    for _line in r.iter_lines():
                        pass

            def chat() -> None:
                events.clear()
                client.chat(request, sink, CancelToken())

            def actor() -> None:
                events.clear()
                inference.complete(request, sink, CancelToken())

            kinds = {"floor": floor, "chat": chat, "actor": actor}
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for i in range(WARMUP + ROUNDS):
                for k, fn in kinds.items():
                    t = _timed(fn)
                    if i >= WARMUP:
                        times[k].append(t)
        finally:
            inference.stop()
            client.close()
            bare.close()
    p50 = {k: statistics.median(v) * 1000 for k, v in times.items()}
    tag = f"{name}#{exchange}" if exchange else name
    size = f"{len(ex.response.body) / 1024:.0f} KB SSE, {tokens} tokens"
    return [
        {"name": f"bare httpx stream p50, {tag}", "value": p50["floor"], "unit": "ms",
         "note": f"floor; {size}"},
        {"name": f"LlamaClient.chat p50, {tag}", "value": p50["chat"], "unit": "ms",
         "ratio": p50["chat"] / p50["floor"]},
        {"name": f"Inference.complete (actor) p50, {tag}", "value": p50["actor"], "unit": "ms",
         "ratio": p50["actor"] / p50["floor"]},
        {"name": f"client overhead per token, {tag}",
         "value": (p50["chat"] - p50["floor"]) * 1000 / max(1, tokens), "unit": "us/token",
         "note": f"(chat p50 - floor p50) / {tokens}"},
    ]


def run() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, exchange in WORKLOADS:
        rows += _workload(name, exchange)
    return rows


if __name__ == "__main__":
    for row in run():
        print(row)
