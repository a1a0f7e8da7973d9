"""Shared fixtures: real SDK pipelines with in-memory sinks next to the real file sinks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from metric_helpers import metric_points
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import instrumentation
from otel_proofscope.pipeline.config import Telemetry, configure
from otel_proofscope.pipeline.drops import DROPS, REJECTIONS
from otel_proofscope.pipeline.privacy import local


@pytest.fixture(autouse=True)
def _clean_ledgers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
                "PROOFSCOPE_RERUN", "PROOFSCOPE_CAPTURE_WITNESS", "PROOFSCOPE_EXPORT_WITNESS"):
        monkeypatch.delenv(var, raising=False)
    DROPS.reset()
    REJECTIONS.reset()
    yield
    instrumentation.set_capture_witness(False)


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
