"""An export our shutdown cuts short is counted once, and the official OTLP exporter's
``ERROR … CANCELLED … Channel closed!`` for it is not logged a second time; an export
that fails on its own still is. Real exporters over real gRPC on 127.0.0.1."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from otel_proofscope.ledger import DropLedger
from otel_proofscope.pipeline.cut_exports import UPSTREAM_EXPORTER_LOGGERS
from otel_proofscope.pipeline.metric_export import CountingMetricExporter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.semconv import DropReason

UPSTREAM = "opentelemetry.exporter.otlp.proto"


@pytest.fixture(autouse=True)
def _fresh_duplicate_filters() -> None:
    """The gRPC exporter's DuplicateFilter logs a message once per 20 s: an earlier
    test's line would hide this test's, whichever the order."""
    for name in UPSTREAM_EXPORTER_LOGGERS:
        for f in logging.getLogger(name).filters:
            if hasattr(f, "last_log"):
                del f.last_log


def _upstream_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name.startswith(UPSTREAM) and r.levelno >= logging.ERROR]


def _some_metrics() -> object:
    reader = InMemoryMetricReader()
    MeterProvider(metric_readers=[reader]).get_meter("t").create_counter("c").add(3)
    return reader.get_metrics_data()


def _in_flight(exporter: CountingMetricExporter, data: object) -> threading.Thread:
    thread = threading.Thread(target=exporter.export, args=(data,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    while not exporter._exporting_threads and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # inside the gRPC call, waiting on the silent collector
    return thread


def test_a_metric_export_cut_by_our_shutdown_is_counted_not_logged_again(
        black_hole: int, caplog: pytest.LogCaptureFixture) -> None:
    ledger = DropLedger()
    exporter = CountingMetricExporter(
        OTLPMetricExporter(endpoint=f"127.0.0.1:{black_hole}", insecure=True, timeout=30),
        sink="otlp", ledger=ledger)
    caplog.set_level(logging.WARNING)
    thread = _in_flight(exporter, _some_metrics())
    exporter.shutdown()
    thread.join(10)
    assert not thread.is_alive()
    assert exporter.points_lost == 1
    assert ledger.total(signal="metric_points", sink="otlp") == 1
    assert _upstream_errors(caplog) == []


def test_a_span_export_cut_by_our_shutdown_is_counted_not_logged_again(
        black_hole: int, caplog: pytest.LogCaptureFixture) -> None:
    ledger = DropLedger()
    processor = BoundedBatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"127.0.0.1:{black_hole}", insecure=True, timeout=30),
        sink="otlp", ledger=ledger, schedule_delay_s=0.01)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    caplog.set_level(logging.WARNING)
    with provider.get_tracer("t").start_as_current_span("layer"):
        pass
    deadline = time.monotonic() + 5
    while processor._in_flight is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    processor.shutdown(timeout_millis=200)
    assert ledger.total(signal="spans", sink="otlp", reason=DropReason.SHUTDOWN) == 1
    assert processor._worker is not None
    processor._worker.join(10)  # the cut export ends once the exporter's channel closes
    assert not processor._worker.is_alive()
    assert _upstream_errors(caplog) == []


def test_an_export_that_fails_on_its_own_is_still_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as s:  # a port nothing listens on: refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ledger = DropLedger()
    exporter = CountingMetricExporter(
        OTLPMetricExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=0.5),
        sink="otlp", ledger=ledger)
    caplog.set_level(logging.WARNING)
    exporter.export(_some_metrics())  # type: ignore[arg-type]
    exporter.shutdown()
    assert ledger.total(signal="metric_points", sink="otlp",
                        reason=DropReason.EXPORT_FAILED) == 1
    assert any("Failed to export" in m for m in _upstream_errors(caplog))
