"""Tracing's cost: a model call with tracing on against off, side by side in one run.

The fake llama-server replays a real recording from its own process (as bench_inference
does); spans go to a real OTLP/HTTP receiver on loopback (tests/support/otlp.py) through the
real exporter, batched as by default. Per round one ``Inference.complete`` with tracing off
and one with it on (its ``chat`` span: attributes, the first-token event), in turn, so both
see the same machine state. The tracer is made once; a round turns it off by hiding it (the
no-op path every hook takes when tracing is off), not by tearing it down.

Also the bare cost of one span, on against off (``telemetry.span`` entered and left), in
batches smaller than the processor's export batch with a flush between them, untimed: the
export (protobuf encoding, and the test receiver's decoding, in this same interpreter) is
the background thread's, reported as a row of its own, not the turn's. Timed in one long
loop instead, a span seemed to cost 50-250 us: mostly the receiver's work.
The goal: a model call within 5% of off.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from typing import Any

from actors.base import telemetry
from actors.base.cancel import CancelToken
from actors.base.config import InferenceConfig
from actors.base.events import Event
from actors.inference.actor import Inference
from actors.inference.types import ChatRequest
from scripts.bench_inference import FIXTURES, fake_server
from tests.support import recording
from tests.support.otlp import Receiver

__all__ = ["run"]

WORKLOADS = [("text.http", 0), ("cache_loss.http", 0)]  # 9 and 160 streamed tokens
ROUNDS = 200
WARMUP = 20
SPANS = 2000  # bare spans timed, each way (within the batch queue: none dropped)
BATCH = 100  # spans per timed batch (under the processor's export batch of 512)
SMOKE = {"ROUNDS": 3, "WARMUP": 1, "SPANS": 200}  # `bench --smoke`


def _p50_ms(times: list[float]) -> float:
    return statistics.median(times) * 1000


def run() -> list[dict[str, Any]]:
    if importlib.util.find_spec("opentelemetry.sdk") is None:
        return [{"name": "skipped", "value": None, "unit": "",
                 "note": "needs the telemetry extra (pip install 'loopd[telemetry]')"}]
    rows: list[dict[str, Any]] = []
    for i, (name, exchange) in enumerate(WORKLOADS):
        rows += _workload(name, exchange, spans=i == 0)
    return rows


def _workload(name: str, exchange: int, spans: bool) -> list[dict[str, Any]]:
    ex = recording.load(FIXTURES / name)[exchange]
    body = ex.request.json()
    request = ChatRequest(session="bench", messages=tuple(body["messages"]),
                          tools=tuple(body.get("tools") or ()), max_tokens=body.get("max_tokens"))
    events: list[Event] = []
    saved = {k: v for k, v in os.environ.items() if k.startswith("OTEL_")}
    with Receiver() as rx, fake_server(FIXTURES / name, exchange) as url:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = rx.endpoint
        os.environ.pop("OTEL_SDK_DISABLED", None)
        telemetry.reset()
        inference = Inference.start(InferenceConfig(url=url, retries=0))
        try:
            assert telemetry.enabled()
            tracer = telemetry._state.tracer  # hidden for the "off" calls, kept for "on"
            times: dict[str, list[float]] = {"off": [], "on": []}
            for i in range(WARMUP + ROUNDS):
                for kind in ("off", "on"):
                    telemetry._state.tracer = tracer if kind == "on" else None
                    events.clear()
                    start = time.perf_counter()
                    inference.complete(request, events.append, CancelToken())
                    if i >= WARMUP:
                        times[kind].append(time.perf_counter() - start)
            bare = {k: _span_cost(tracer if k == "on" else None) for k in ("off", "on")
                    } if spans else {}
            telemetry._state.tracer = tracer
            export = _export_cost() if spans else 0.0
            telemetry.flush(10)
        finally:
            inference.stop()
            telemetry.reset()
            for key in [k for k in os.environ if k.startswith("OTEL_")]:
                del os.environ[key]
            os.environ.update(saved)
    off, on = _p50_ms(times["off"]), _p50_ms(times["on"])
    received = sum(1 for s in rx.spans if s.name.startswith("chat "))
    rows: list[dict[str, Any]] = [
        {"name": f"model call p50, tracing off, {name}", "value": off, "unit": "ms",
         "note": "floor: Inference.complete, no span"},
        {"name": f"model call p50, tracing on, {name}", "value": on, "unit": "ms",
         "ratio": on / off, "note": f"chat span to OTLP/HTTP; {received} spans received"},
        {"name": f"tracing overhead per model call, {name}", "value": (on - off) * 1000,
         "unit": "us", "note": "on p50 - off p50 (goal: within 5% of off)"},
    ]
    if bare:
        rows += [
            {"name": "one span entered and left, off", "value": bare["off"], "unit": "us",
             "note": "the no-op every hook takes"},
            {"name": "one span entered and left, on", "value": bare["on"], "unit": "us",
             "ratio": bare["on"] / max(bare["off"], 1e-9),
             "note": f"median of batches of {BATCH}, flushed between them untimed"},
            {"name": "one span's export (background thread)", "value": export, "unit": "us",
             "note": "encoded and sent, and decoded by the test receiver in this process"},
        ]
    return rows


def _spans(count: int) -> None:
    for _ in range(count):
        with telemetry.span("bench", {"gen_ai.operation.name": "chat"}) as span:
            span.set("gen_ai.usage.output_tokens", 1)


def _span_cost(tracer: Any) -> float:
    """Microseconds per ``telemetry.span`` with ``tracer`` (None: off), one attribute set:
    the median batch; the spans queued are exported between batches, untimed."""
    per_batch: list[float] = []
    for _ in range(max(1, SPANS // BATCH)):
        telemetry._state.tracer = tracer
        start = time.perf_counter()
        _spans(BATCH)
        per_batch.append((time.perf_counter() - start) * 1e6 / BATCH)
        telemetry.flush(10)  # the provider's, whether the tracer is hidden or not
    return statistics.median(per_batch)


def _export_cost() -> float:
    """Microseconds per span of a flush of a batch of spans (the exporter's thread's work)."""
    per_batch: list[float] = []
    for _ in range(max(1, SPANS // BATCH // 4)):
        _spans(BATCH)
        start = time.perf_counter()
        telemetry.flush(10)
        per_batch.append((time.perf_counter() - start) * 1e6 / BATCH)
    return statistics.median(per_batch)


if __name__ == "__main__":
    for row in run():
        print(row)
