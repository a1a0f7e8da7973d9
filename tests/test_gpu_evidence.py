"""Once-per-runtime evidence: bounded dedup (as in the keyhog seed, keyed by backend too)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.gpu import evidence
from otel_proofscope.gpu.backend import DeviceIdentity, Gap
from otel_proofscope.gpu.evidence import DEDUP_SINK, MAX_EVIDENCE_KEYS, Evidence, EvidenceDedup
from otel_proofscope.gpu.instruments import instruments_for
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.semconv import Attr, DropReason, EventName, GapReason, GpuCapability, Metric

VULKAN = DeviceIdentity("vulkan", "wgpu:vulkan:10de:2330", "GPU", "NVIDIA", "1.0", 0x10DE, 0x2330)
CUDA = DeviceIdentity("cuda", "GPU-uuid", "GPU", "NVIDIA", "550", 0x10DE, 0x2330)
UTIL = Gap(GpuCapability.UTILIZATION, GapReason.UNSUPPORTED, "no counter")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    evidence.reset_dispatch_state()
    yield
    evidence.reset_dispatch_state()


def test_claim_once_repeats_rejected_without_loss() -> None:
    claims = EvidenceDedup()
    assert claims.claim((1, "vulkan", "utilization"))
    for _ in range(100):
        assert not claims.claim((1, "vulkan", "utilization"))
    assert claims.lost == 0
    assert len(claims) == 1
    assert DROPS.total() == 0


def test_default_capacity_is_1024_and_overflow_counted_exactly(
        caplog: pytest.LogCaptureFixture) -> None:
    claims = EvidenceDedup()
    assert claims.capacity == MAX_EVIDENCE_KEYS == 1024
    for i in range(1024):
        assert claims.claim((i, "vulkan", "identity"))
    with caplog.at_level(logging.WARNING, logger="otel_proofscope.gpu"):
        rejected = [claims.claim((2000 + i, "vulkan", "identity")) for i in range(37)]
        # A repeat of an already-held key is not a loss, even when full.
        assert not claims.claim((5, "vulkan", "identity"))
    assert rejected == [False] * 37
    assert claims.lost == 37
    assert len(claims) == 1024
    assert DROPS.total(signal="span_events", sink=DEDUP_SINK, reason=DropReason.SIZE_CAP) == 37
    warnings = [r.getMessage() for r in caplog.records if r.name == "otel_proofscope.gpu"]
    assert len(warnings) == 37
    assert "37 record(s) lost so far" in warnings[-1]
    assert "1 record(s) lost so far" in warnings[0]


def test_overflowed_claim_is_not_recorded_later() -> None:
    claims = EvidenceDedup(capacity=1)
    assert claims.claim("a")
    assert not claims.claim("b")
    assert not claims.claim("b")  # still full: counted again, never silently recorded
    assert claims.lost == 2
    assert "b" not in claims


def test_concurrent_claims_exact() -> None:
    claims = EvidenceDedup(capacity=500)
    won: list[int] = []
    lock = threading.Lock()

    def worker(t: int) -> None:
        for i in range(200):
            if claims.claim(("k", i % 700, t % 2)):
                with lock:
                    won.append(1)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(won) == 400  # 200 distinct i × 2 parities, all fit
    assert claims.lost == 0


def test_key_includes_backend() -> None:
    """One runtime driving two backends reports the same capability for each."""
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    ev = Evidence(instruments_for(mp), EvidenceDedup())
    assert ev.capability_unsupported(7, VULKAN, UTIL)
    assert ev.capability_unsupported(7, CUDA, UTIL)
    assert not ev.capability_unsupported(7, CUDA, UTIL)
    data = reader.get_metrics_data()
    assert data is not None
    pts: list[Any] = [p for rm in data.resource_metrics for sm in rm.scope_metrics
                      for m in sm.metrics if m.name == Metric.GPU_CAPABILITY_UNSUPPORTED.name
                      for p in m.data.data_points]
    assert sorted((dict(p.attributes)[Attr.GPU_BACKEND], p.value) for p in pts) == [
        ("cuda", 1), ("vulkan", 1)]
    mp.shutdown()


def test_identity_once_per_runtime_and_backend() -> None:
    ev = Evidence(instruments_for(MeterProvider()), EvidenceDedup())
    assert ev.adapter_acquired(1, VULKAN)
    assert not ev.adapter_acquired(1, VULKAN)
    assert ev.adapter_acquired(1, CUDA)
    assert ev.adapter_acquired(2, VULKAN)


def test_events_go_to_otel_current_span_else_proof_phase_span() -> None:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    ev = Evidence(instruments_for(MeterProvider()), EvidenceDedup())
    tracer = tp.get_tracer("t")
    with tracer.start_as_current_span("user-span"):
        ev.capability_unsupported(1, VULKAN, UTIL, evidence.active_span())
    assert evidence.active_span() is None  # nothing active: no span event, no error
    pt = ProofTracer(tp, MeterProvider())
    with pt.proof(system="gkr", backend="wgpu"), pt.layer(index=0, kind="MatMul"):
        # OTel's current span is the layer; with an invalid current span we'd fall
        # back to instrumentation.current_span(), which is the same layer here.
        assert evidence.active_span() is trace.get_current_span()
        ev.capability_unsupported(2, VULKAN, UTIL, evidence.active_span())
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert [e.name for e in spans["user-span"].events] == [EventName.GPU_CAPABILITY_UNSUPPORTED]
    assert [e.name for e in spans["proof.layer"].events] == [
        EventName.GPU_CAPABILITY_UNSUPPORTED]
    assert spans["proof"].events == ()


def test_deferred_evidence_waits_for_first_dispatch() -> None:
    seen: list[object] = []
    evidence.defer_until_dispatch(seen.append)
    evidence.defer_until_dispatch(seen.append)
    assert seen == [] and evidence.pending_count() == 2
    marker = object()
    evidence.note_dispatch(marker)  # type: ignore[arg-type]
    assert seen == [marker, marker] and evidence.pending_count() == 0
    evidence.defer_until_dispatch(seen.append)  # after a dispatch: at once
    assert len(seen) == 3
