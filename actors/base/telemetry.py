"""Traces: OpenTelemetry spans with the GenAI semantic conventions, exported over OTLP/HTTP.

The one module that imports ``opentelemetry``, and only when tracing is on: when
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set, or the
config's ``telemetry.enabled`` (:func:`configure`), unless ``OTEL_SDK_DISABLED`` is "true".
Off, every function here is a no-op costing a global read, and nothing of OpenTelemetry is
loaded (tests/test_public.py checks a fresh interpreter). On, the rest of the standard
environment applies (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, headers,
``OTEL_BSP_*``). The decision is taken once per process, at the first span.

Export never slows a turn: spans go to a BatchSpanProcessor's queue (full: dropped) and are
sent from its thread, each export bounded by ``telemetry.export_timeout_s`` (or
``OTEL_EXPORTER_OTLP_TIMEOUT``); an endpoint that refuses or hangs costs one warning in the
log and its spans, never the turn. docs/telemetry.md says what each span means.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from typing import Any, Protocol, TypeAlias

__all__ = [
    "OFF",
    "Span",
    "calling",
    "capture_content",
    "configure",
    "current",
    "enabled",
    "flush",
    "joined",
    "record",
    "reset",
    "span",
    "traceparent",
]

log = logging.getLogger("loopd.telemetry")

Value: TypeAlias = str | bool | int | float | Sequence[str] | Sequence[int]

ENDPOINTS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Set by a process whose config turned tracing on, so the tool hosts it starts trace too.
CHILD = "LOOPD_TELEMETRY"
CAPTURE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


class Span(Protocol):
    """What loopd does with a span; the same calls on :data:`OFF` cost nothing."""

    def set(self, key: str, value: Value) -> None: ...

    def set_all(self, attributes: Mapping[str, Value]) -> None: ...

    def event(self, name: str, attributes: Mapping[str, Value] | None = None) -> None: ...

    def fail(self, kind: str, message: str) -> None: ...


class _Off:
    """Tracing off: a span, and a context manager giving itself, that does nothing."""

    __slots__ = ()

    def set(self, key: str, value: Value) -> None:
        pass

    def set_all(self, attributes: Mapping[str, Value]) -> None:
        pass

    def event(self, name: str, attributes: Mapping[str, Value] | None = None) -> None:
        pass

    def fail(self, kind: str, message: str) -> None:
        pass

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


OFF = _Off()


class _Live:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: Value) -> None:
        self._span.set_attribute(key, value)

    def set_all(self, attributes: Mapping[str, Value]) -> None:
        """Several attributes under one lock of the span (a request's answer)."""
        self._span.set_attributes(attributes)

    def event(self, name: str, attributes: Mapping[str, Value] | None = None) -> None:
        self._span.add_event(name, dict(attributes or {}))

    def fail(self, kind: str, message: str) -> None:
        self._span.set_attribute("error.type", kind)
        self._span.set_status(_state.api.error, message[:500])


class _Api:
    """What a span's hot path calls of OpenTelemetry, looked up once (imports and enum
    lookups in a function cost on every span)."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace import SpanKind, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.attach, self.detach = context.attach, context.detach
        self.current_context = context.get_current
        self.in_context, self.current_span = trace.set_span_in_context, trace.get_current_span
        self.kinds = {"internal": SpanKind.INTERNAL, "server": SpanKind.SERVER,
                      "client": SpanKind.CLIENT}
        self.error = StatusCode.ERROR
        self.propagator = TraceContextTextMapPropagator()


class _State:
    """The process's decision and, when on, its tracer provider."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.decided = False
        self.tracer: Any = None
        self.provider: Any = None
        self.meters: Any = None  # the MeterProvider
        self.histograms: dict[str, Any] = {}
        # Measurements wait here (a deque append on the turn's thread) and are recorded by
        # the metric reader's thread when it collects (_meters): the SDK's record path
        # (attribute hashing, aggregation, exemplars) costs more than a span.
        self.pending: deque[tuple[str, float, Mapping[str, Value], Any]] = deque(
            maxlen=PENDING)
        self.api: Any = None  # _Api, once tracing is on
        self.config_on = False
        self.timeout_s = 2.0
        self.service = "loopd"


PENDING = 65536  # measurements waiting for the next collection (60 s by default)

_state = _State()


def configure(enabled: bool, export_timeout_s: float = 2.0, service: str = "") -> None:
    """The config's say (``[telemetry]``), before the first span; the tool hosts this
    process starts inherit an ``enabled``. ``service``: this process's service name
    when ``OTEL_SERVICE_NAME`` gives none."""
    with _state.lock:
        _state.config_on = _state.config_on or enabled
        _state.timeout_s = export_timeout_s
        _state.service = service or _state.service
        if enabled:
            os.environ[CHILD] = "1"


def wanted(env: Mapping[str, str] | None = None, config_on: bool = False) -> bool:
    """Whether tracing is on for this environment (pure: the tests' and the bench's)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return config_on or env.get(CHILD) == "1" or any(env.get(k) for k in ENDPOINTS)


def enabled() -> bool:
    """Whether spans are recorded in this process (decides, the first time)."""
    return _tracer() is not None


def capture_content() -> bool:
    """Message content (prompts, answers, tool arguments and results) goes on spans only
    when the standard content-capture setting says so."""
    return os.environ.get(CAPTURE, "").strip().lower() == "true"


def _tracer() -> Any:
    if _state.decided:
        return _state.tracer
    with _state.lock:
        if not _state.decided:
            if wanted(config_on=_state.config_on):
                try:
                    _state.api = _Api()
                    _state.provider, _state.tracer = _start()
                    _state.meters = _meters(_state.provider.resource)
                except ImportError as e:
                    log.warning("telemetry: tracing was asked for but OpenTelemetry is not "
                                "installed (%s); install loopd[telemetry]", e)
            _state.decided = True
    return _state.tracer


def _start() -> tuple[Any, Any]:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if protocol != "http/protobuf":
        log.warning("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL=%s is not supported; loopd "
                    "exports http/protobuf (port 4318 on most collectors)", protocol)
    given = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT")
    timeout = None if given else _state.timeout_s
    exporter = _bounded(OTLPSpanExporter(timeout=timeout))
    # The exporter's own complaints, one per failed batch, become one warning (_bounded).
    # A full queue (spans dropped while the endpoint fails) would say so per span, in the
    # turn's thread.
    for name in ("opentelemetry.exporter.otlp.proto.http", "opentelemetry.sdk.trace.export",
                 "opentelemetry.sdk._shared_internal", "opentelemetry.sdk.metrics"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    extra = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": _state.service}
    provider = TracerProvider(resource=Resource.create(extra))
    provider.add_span_processor(BatchSpanProcessor(
        exporter, export_timeout_millis=int(1000 * (timeout or _state.timeout_s))))
    return provider, provider.get_tracer("loopd")


def _meters(resource: Any) -> Any:
    """The GenAI metrics' provider: OTLP/HTTP every ``OTEL_METRIC_EXPORT_INTERVAL`` (60 s),
    each export bounded like the spans'."""
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    given = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TIMEOUT")
    timeout = None if given else _state.timeout_s

    class Draining(PeriodicExportingMetricReader):
        """Records the waiting measurements (:func:`record`) before each collection: in
        its own thread every interval, in the caller's on a flush."""

        def collect(self, timeout_millis: float = 10_000) -> None:  # type: ignore[misc]
            _drain()
            super().collect(timeout_millis)

    reader = Draining(OTLPMetricExporter(timeout=timeout),
                      export_timeout_millis=1000 * (timeout or _state.timeout_s))
    return MeterProvider(resource=resource, metric_readers=[reader])


# The GenAI client metrics (histograms): name -> (unit, description).
METRICS = {
    "gen_ai.client.token.usage": ("{token}", "Tokens used per model request, by "
                                  "gen_ai.token.type (input, output)"),
    "gen_ai.client.operation.duration": ("s", "Duration of a model request"),
}


def record(name: str, value: float, attributes: Mapping[str, Value]) -> None:
    """One measurement of a GenAI metric (:data:`METRICS`); nothing when off. It waits
    (with the current context, for exemplars) until the metric reader collects."""
    if _tracer() is None or _state.meters is None:
        return
    _state.pending.append((name, value, attributes, _state.api.current_context()))


def _drain() -> None:
    """Record the waiting measurements into their histograms (the reader's thread)."""
    meters, pending = _state.meters, _state.pending
    while meters is not None:
        try:
            name, value, attributes, context = pending.popleft()
        except IndexError:
            return
        histogram = _state.histograms.get(name)
        if histogram is None:
            unit, description = METRICS[name]
            histogram = meters.get_meter("loopd").create_histogram(
                name, unit=unit, description=description)
            _state.histograms[name] = histogram
        histogram.record(value, dict(attributes), context=context)


def _bounded(inner: Any) -> Any:
    """The OTLP exporter, its failures said once (then again only after a success)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Bounded(SpanExporter):
        failing = False

        def export(self, spans: Any) -> SpanExportResult:
            try:
                result = inner.export(spans)
            except Exception as e:  # the exporter's own bug must not end its thread
                result, why = SpanExportResult.FAILURE, f"{type(e).__name__}: {e}"
            else:
                why = "refused, or no answer in time"
            if result is SpanExportResult.SUCCESS:
                self.failing = False
            elif not self.failing:
                self.failing = True
                log.warning("telemetry: the OTLP endpoint %s did not take %d spans (%s); "
                            "spans are dropped until it does",
                            getattr(inner, "_endpoint", "?"), len(spans), why)
            return result  # type: ignore[no-any-return]

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(inner.force_flush(timeout_millis))

    return Bounded()


def span(name: str, attributes: Mapping[str, Value] | None = None, *, kind: str = "internal",
         parent: str = "") -> ContextManager[Span]:
    """A span, current while the block runs; an exception that leaves it marks it failed.

    ``parent``: a W3C ``traceparent`` from another process (the tool wire's, the
    daemon's): the span joins that trace. Off: :data:`OFF`.
    """
    tracer = _tracer()
    if tracer is None:
        return OFF
    return _Current(tracer, name, attributes, kind, parent)


class _Current:
    """A live span made current for a block: started, attached, then detached and ended
    (what ``start_as_current_span`` does, without its two generator-based layers)."""

    __slots__ = ("_args", "_live", "_token")

    def __init__(self, tracer: Any, name: str, attributes: Mapping[str, Value] | None,
                 kind: str, parent: str) -> None:
        self._args = (tracer, name, attributes, kind, parent)

    def __enter__(self) -> _Live:
        tracer, name, attributes, kind, parent = self._args
        api = _state.api
        raw = tracer.start_span(
            name, context=_extract(parent) if parent else None, kind=api.kinds[kind],
            attributes=attributes, record_exception=False, set_status_on_exception=False)
        self._token = api.attach(api.in_context(raw))
        self._live = _Live(raw)
        return self._live

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: object) -> None:
        try:
            if e is not None:
                self._live.fail(type(e).__name__, str(e))
        finally:
            _state.api.detach(self._token)
            self._live._span.end()


def current() -> Span:
    """The span current in this thread (:data:`OFF` when there is none)."""
    if _tracer() is None:
        return OFF
    raw = _state.api.current_span()
    return _Live(raw) if raw.is_recording() else OFF


def calling(host: str, tool: str) -> str:
    """A call leaves for ``host``: the current (``execute_tool``) span names the host and
    the tool that runs (call_tool's target, not call_tool); the W3C ``traceparent`` for the
    request ("" when off)."""
    if _tracer() is None:
        return ""
    raw = _state.api.current_span()
    if raw.is_recording():
        raw.set_attribute("loopd.tool.host", host)
        raw.set_attribute("gen_ai.tool.name", tool)
        raw.update_name(f"execute_tool {tool}")
    return traceparent()


def traceparent() -> str:
    """The current span as a W3C ``traceparent`` for another process: loopd's own, or a
    script's that traces itself (OpenTelemetry already loaded); "" when there is none."""
    if _tracer() is None and "opentelemetry.trace" not in sys.modules:
        return ""
    api = _state.api or _Api()  # a script's own tracing: loopd's is off
    carrier: dict[str, str] = {}
    api.propagator.inject(carrier)
    return carrier.get("traceparent", "")


def joined(parent: str) -> ContextManager[object]:
    """While the block runs, ``parent`` (a W3C ``traceparent`` from another process) is
    the current context: what starts a span in it, or passes it on, joins that trace.
    No span of its own; nothing when off or ``parent`` is empty."""
    if not parent or _tracer() is None:
        return OFF
    return _attached(parent)


@contextlib.contextmanager
def _attached(parent: str) -> Iterator[object]:
    api = _state.api
    token = api.attach(_extract(parent))
    try:
        yield None
    finally:
        api.detach(token)


def _extract(parent: str) -> Any:
    return _state.api.propagator.extract({"traceparent": parent})


def flush(timeout_s: float = 5.0) -> bool:
    """Send what is queued now (a test's, the bench's, a short process's end)."""
    provider, meters = _state.provider, _state.meters
    if meters is not None:  # its reader records what waits (record), then exports
        meters.force_flush(int(timeout_s * 1000))
    return True if provider is None else bool(provider.force_flush(int(timeout_s * 1000)))


def reset() -> None:
    """Forget the decision (the provider shut down): the next span decides again from the
    environment. For tests and the bench, which turn tracing on and off in one process."""
    with _state.lock:
        provider, _state.provider, _state.tracer = _state.provider, None, None
        meters, _state.meters, _state.histograms = _state.meters, None, {}
        _state.pending.clear()
        _state.decided, _state.config_on = False, False
    if provider is not None:
        provider.shutdown()
    if meters is not None:
        meters.shutdown()
