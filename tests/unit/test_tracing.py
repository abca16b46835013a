"""Tracing off (the default) records nothing and creates no exporter: OpenTelemetry is not even
imported. On with the OTLP exporter missing, the process stops with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from common import tracing
from worker.settings import WorkerSettings

OFF = """
import sys
from common import tracing
from worker.runtime import job_trace
from worker.settings import WorkerSettings
from control_plane.settings import Settings

tracing.configure("worker", WorkerSettings())
tracing.configure("api", Settings())
assert not tracing.enabled() and tracing.tracer() is None
assert tracing.current_traceparent() is None
assert tracing.context_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") is None
assert tracing.start_span("s") is None
with tracing.span("s") as s:
    assert s is None
assert job_trace.start({"job_id": "j", "traceparent": "x"}, "w", None, 0) is None
loaded = [m for m in sys.modules if m.startswith("opentelemetry")]
assert not loaded, loaded
"""


def test_tracing_off_creates_no_span_and_no_exporter() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PLATFORM_", "OTEL_"))}
    done = subprocess.run(
        [sys.executable, "-c", OFF], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_the_otlp_exporter_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(tracing.TracingUnavailable, match=r"platform-serverless\[otlp\]"):
        tracing.configure("worker", WorkerSettings(otel_exporter="otlp"))
    assert not tracing.enabled()


def test_the_exporter_setting_is_validated() -> None:
    with pytest.raises(ValueError):
        WorkerSettings(otel_exporter="zipkin")


def test_a_malformed_traceparent_starts_a_new_trace() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        for bad in ("garbage", "00-zz-yy-01", b"\xff\xfe", "", None):
            with tracing.span("s", parent=tracing.context_of(bad)) as s:
                assert s is not None and tracing.traceparent_of(s) is not None
        good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        with tracing.span("child", parent=tracing.context_of(good)) as s:
            assert tracing.current_traceparent() == tracing.traceparent_of(s)
    finally:
        tracing.install(None)
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert [s.parent for s in spans[:5]] == [None] * 5
    assert spans[5].context.trace_id == 0x4BF92F3577B34DA6A3CE929D0E0E4736
