"""Shared fixtures: real SDK pipelines with in-memory sinks next to the real file sinks."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from metric_helpers import metric_points
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import instrumentation, phase_cost
from otel_proofscope.ledger import DROPS, REJECTIONS
from otel_proofscope.pipeline.privacy import local
from otel_proofscope.setup import Telemetry, configure


@pytest.fixture(autouse=True)
def _clean_ledgers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
                "PROOFSCOPE_RERUN", "PROOFSCOPE_CAPTURE_WITNESS", "PROOFSCOPE_EXPORT_WITNESS",
                "PROOFSCOPE_MAP", "PROOFSCOPE_EXPORT_PROCESS"):
        monkeypatch.delenv(var, raising=False)
    DROPS.reset()
    REJECTIONS.reset()
    yield
    instrumentation.set_capture_witness(False)
    # A test that started an NVML sampler and did not stop it must not leave its
    # process-wide energy meter to the next test.
    phase_cost.set_energy_meter(None)
    _reset_otel_globals()


def _reset_otel_globals() -> None:
    """Forget the process-wide providers a CLI command installed in this test.

    In-process CLI tests (`main(["import", …])`) install and then shut down global
    providers, which the OTel API lets a process set only once: every later
    `get_meter()` would warn and hand out a no-op meter. This is what
    opentelemetry-test-utils' reset_*_globals do.
    """
    import opentelemetry.trace as trace_api
    from opentelemetry.metrics import _internal as metrics_api
    from opentelemetry.trace import ProxyTracerProvider
    from opentelemetry.util._once import Once

    trace_api._TRACER_PROVIDER_SET_ONCE = Once()
    trace_api._TRACER_PROVIDER = None
    trace_api._PROXY_TRACER_PROVIDER = ProxyTracerProvider()
    metrics_api._METER_PROVIDER_SET_ONCE = Once()
    metrics_api._METER_PROVIDER = None
    metrics_api._PROXY_METER_PROVIDER = metrics_api._ProxyMeterProvider()


class Pipeline:
    def __init__(self, telemetry: Telemetry, spans: InMemorySpanExporter,
                 metrics: InMemoryMetricReader, out_dir: Path) -> None:
        self.telemetry = telemetry
        self.tracer = telemetry.tracer
        self.memory = spans
        self.metrics = metrics
        self.out_dir = out_dir

    def finished(self) -> list:  # type: ignore[type-arg]
        self.telemetry.force_flush(5)
        return list(self.memory.get_finished_spans())

    def metric_points(self) -> dict[str, list]:  # type: ignore[type-arg]
        return metric_points(self.metrics)


@pytest.fixture
def pipeline(tmp_path: Path) -> Iterator[Pipeline]:
    """configure() with its real file sinks plus an in-memory span sink and metric reader."""
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    telemetry = configure(service_name="test-prover", out_dir=tmp_path, set_global=False,
                          span_exporters=[("memory", local(spans))], metric_readers=[reader],
                          rerun="off")
    yield Pipeline(telemetry, spans, reader, tmp_path)
    telemetry.shutdown()


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A "collector" that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()
