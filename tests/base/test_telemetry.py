"""Tracing's switch and its no-op: what decides it, and what off costs (nothing loaded)."""

from __future__ import annotations

import pytest

from actors.base import telemetry


@pytest.mark.parametrize(
    ("env", "config_on", "on"),
    [
        ({}, False, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, False, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, False, True),
        ({}, True, True),
        ({telemetry.CHILD: "1"}, False, True),  # a tool host of a process the config turned on
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False, False),
        ({"OTEL_SDK_DISABLED": "TRUE"}, True, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": ""}, False, False),
    ],
)
def test_what_turns_tracing_on(env: dict[str, str], config_on: bool, on: bool) -> None:
    assert telemetry.wanted(env, config_on) is on


def test_off_every_call_is_the_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in (*telemetry.ENDPOINTS, telemetry.CHILD):
        monkeypatch.delenv(key, raising=False)
    telemetry.reset()
    try:
        with telemetry.span("chat x", {"a": 1}) as span:
            span.set("b", 2)
            span.event("e")
        assert span is telemetry.OFF
        assert telemetry.current() is telemetry.OFF
        assert telemetry.traceparent() == ""
        assert not telemetry.enabled()
        assert telemetry.flush()
    finally:
        telemetry.reset()


def test_content_is_captured_only_when_the_setting_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(telemetry.CAPTURE, raising=False)
    assert not telemetry.capture_content()
    monkeypatch.setenv(telemetry.CAPTURE, "true")
    assert telemetry.capture_content()
