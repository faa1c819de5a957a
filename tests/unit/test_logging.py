"""Logs are JSON lines off a terminal, with the request id and trace id bound."""

from __future__ import annotations

import json

import pytest
import structlog
from opentelemetry.sdk.trace import TracerProvider

from tiermesh.core.logging import configure_logging, get_logger


def test_json_log_carries_request_and_trace_ids(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("gateway", "info", "json")
    tracer = TracerProvider().get_tracer("t")
    try:
        with tracer.start_as_current_span("request") as span:
            structlog.contextvars.bind_contextvars(request_id="abc123")
            get_logger("x").info("routed", stream="tm:q:mlp@1.fp32:center:p1:b0")
            trace_id = format(span.get_span_context().trace_id, "032x")
    finally:
        structlog.contextvars.clear_contextvars()
        structlog.reset_defaults()
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["event"] == "routed"
    assert line["request_id"] == "abc123"
    assert line["trace_id"] == trace_id
    assert line["service"] == "gateway"
    assert line["level"] == "info"
