"""An OTLP/HTTP receiver on loopback: decodes what the real exporter sends (the protobuf
``ExportTraceServiceRequest`` of opentelemetry-proto) into plain spans a test can read.

``with Receiver() as rx: ... rx.endpoint`` (for ``OTEL_EXPORTER_OTLP_ENDPOINT``);
``rx.wait(lambda spans: ...)`` blocks until the spans received so far satisfy it.
:func:`traced` (a fixture's helper) turns tracing on for the test's process and for what it
starts: to the receiver, batches sent at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Point", "Receiver", "Span", "traced"]


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root
    kind: int  # 1 internal, 2 server, 3 client (the protobuf's numbers)
    service: str
    attributes: dict[str, Any]
    events: tuple[tuple[str, dict[str, Any]], ...]
    status: int  # 0 unset, 1 ok, 2 error


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def decode(body: bytes) -> list[Span]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for rs in request.resource_spans:
        service = str(_attrs(rs.resource.attributes).get("service.name", ""))
        for scope in rs.scope_spans:
            for s in scope.spans:
                spans.append(Span(
                    name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(), kind=s.kind, service=service,
                    attributes=_attrs(s.attributes),
                    events=tuple((e.name, _attrs(e.attributes)) for e in s.events),
                    status=s.status.code,
                ))
    return spans


def traced(monkeypatch: Any, endpoint: str, **env: str) -> None:
    """Tracing on to ``endpoint`` here and in the processes started after (their
    environment): no other OTEL_ setting, batches sent every 20 ms; the decision taken
    again (:func:`actors.base.telemetry.reset`; the caller resets it again at the end)."""
    from actors.base import telemetry

    for key in [k for k in os.environ if k.startswith("OTEL_") or k == telemetry.CHILD]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    telemetry.reset()


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One histogram data point of a metric."""

    metric: str
    unit: str
    count: int
    sum: float
    attributes: dict[str, Any]


def decode_metrics(body: bytes) -> list[Point]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    return [Point(m.name, m.unit, p.count, p.sum, _attrs(p.attributes))
            for rm in request.resource_metrics for scope in rm.scope_metrics
            for m in scope.metrics for p in m.histogram.data_points]


class Receiver:
    """Takes ``POST /v1/traces`` and ``/v1/metrics`` (protobuf) and keeps what they hold."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.points: list[Point] = []
        self.posts = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                got = decode(body) if self.path == "/v1/traces" else []
                points = decode_metrics(body) if self.path == "/v1/metrics" else []
                known = self.path in ("/v1/traces", "/v1/metrics")
                self.send_response(200 if known else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()
                with receiver._changed:
                    receiver.spans.extend(got)
                    receiver.points.extend(points)
                    receiver.posts += 1
                    receiver._changed.notify_all()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def wait_points(self, done: Callable[[list[Point]], bool],
                    timeout: float = 60.0) -> list[Point]:
        """The metrics' points once ``done`` says they are enough (as :meth:`wait`)."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(list(self.points)), timeout):
                raise AssertionError(f"not the points wanted: {self.points}")
            return list(self.points)

    def wait(self, done: Callable[[list[Span]], bool], timeout: float = 60.0) -> list[Span]:
        """The spans once ``done`` says they are enough (AssertionError after ``timeout``:
        a hang guard, not a speed limit)."""
        with self._changed:
            if not self._changed.wait_for(lambda: done(list(self.spans)), timeout):
                raise AssertionError(f"not the spans wanted: {[s.name for s in self.spans]}")
            return list(self.spans)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def receiving(monkeypatch: Any) -> Iterator[Receiver]:
    """A receiver with tracing on to it (:func:`traced`), the decision reset when done."""
    from actors.base import telemetry

    with Receiver() as rx:
        traced(monkeypatch, rx.endpoint)
        try:
            yield rx
        finally:
            telemetry.reset()
