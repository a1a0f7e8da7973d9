"""The out-of-process Rerun exporters: real child process, real .rrd read back."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.process import (
    METRICS,
    SPANS,
    Counts,
    RerunProcessMetricExporter,
    RerunProcessSpanExporter,
)
from otel_proofscope.semconv import DropReason

LOGGER = "otel_proofscope.rerun.process"


def proof_spans(layers: int = 3, system: str = "gkr") -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    with tracer.proof(system=system, layers=layers):
        for i in range(layers):
            with tracer.layer(index=i, kind="MatMul", rounds=2):
                tracer.sumcheck_round(0, [1, 2], 3)
                tracer.sumcheck_round(1, [1, 2], 4)
    return list(memory.get_finished_spans())


def events(spans: list[ReadableSpan]) -> int:
    return sum(len(s.events) for s in spans)


def content(rec: readback.Recording) -> dict[str, list[dict[str, object]]]:
    """Every entity's temporal rows' values, without row ids (they differ per run)."""
    return {path: [row.values for row in rec.rows(path)] for path in rec.entities}


def test_same_recording_as_in_process(tmp_path: Path) -> None:
    spans = proof_spans()
    inproc = RerunSpanExporter(f"file:{tmp_path / 'in.rrd'}")
    inproc.export(spans)
    inproc.shutdown()
    outproc = RerunProcessSpanExporter(f"file:{tmp_path / 'out.rrd'}")
    try:
        outproc.export(spans[:4])
        outproc.export(spans[4:])
        assert outproc.force_flush(20_000)
    finally:
        outproc.shutdown()
    expected = readback.read(tmp_path / "in.rrd")
    got = readback.read(tmp_path / "out.rrd")
    assert any(p.startswith("/gkr/walk") for p in expected.paths())
    assert got.paths() == expected.paths()
    assert content(got) == content(expected)
    # Static rows match too, except the recording's own start time.
    assert {p: v for p, v in got.statics.items() if p != "/__properties"} == \
        {p: v for p, v in expected.statics.items() if p != "/__properties"}
    assert DROPS.total() == 0


def test_metrics_reach_the_same_child_and_recording(tmp_path: Path) -> None:
    target = f"file:{tmp_path / 'shared.rrd'}"
    span_exporter = RerunProcessSpanExporter(target)
    metric_exporter = RerunProcessMetricExporter(target)
    try:
        assert span_exporter.worker is metric_exporter.worker  # one child per target
        # The child's start-up is bounded by the exporters' deadline; on a loaded machine
        # it can take longer than that, which this test is not about: wait for it.
        assert span_exporter.worker is not None and span_exporter.worker.ready.wait(60)
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        reader = InMemoryMetricReader()
        tracer = ProofTracer(tracer_provider, MeterProvider(metric_readers=[reader]))
        with tracer.proof(system="gkr", layers=1), \
                tracer.layer(index=0, kind="MatMul", rounds=1):
            tracer.sumcheck_round(0, [1, 2], 3)
        data = reader.get_metrics_data()
        assert data is not None
        metric_exporter.export(data)
    finally:
        span_exporter.shutdown()  # the child stays up for the metric exporter
    assert metric_exporter.worker is not None and metric_exporter.worker.proc.poll() is None
    metric_exporter.export(data)
    metric_exporter.shutdown()
    assert readback.recording_count(tmp_path / "shared.rrd") == 1
    rec = readback.read(tmp_path / "shared.rrd")
    assert "/gkr/walk/nodes" in rec.paths()
    series = [p for p in rec.paths() if p.startswith("/proof/layer_duration/")]
    assert series == ["/proof/layer_duration/cpu_MatMul_gkr"]
    assert DROPS.total() == 0


def test_killed_child_is_one_warning_and_counted_losses(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    exporter = RerunProcessSpanExporter(f"file:{tmp_path / 'k.rrd'}", shutdown_timeout_s=5)
    assert exporter.worker is not None
    before = proof_spans()
    after = [proof_spans(system=f"s{i}") for i in range(5)]
    caplog.set_level(logging.WARNING, logger=LOGGER)
    try:
        exporter.export(before)
        assert exporter.force_flush(20_000)  # settled: none of these may be counted lost
        exporter.worker.proc.kill()
        exporter.worker.proc.wait(10)
        for batch in after:
            exporter.export(batch)  # no exception, whether queued, written or refused
        assert not exporter.force_flush(5_000)
    finally:
        exporter.shutdown()
    lost = [s for batch in after for s in batch]
    unavailable = DropReason.SINK_UNAVAILABLE
    assert DROPS.total(signal="spans", sink="rerun", reason=unavailable) == len(lost)
    assert DROPS.total(signal="span_events", sink="rerun", reason=unavailable) == events(lost)
    assert DROPS.total() == len(lost) + events(lost)
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "died" in warnings[0].getMessage()


def test_stuck_child_is_killed_at_the_shutdown_deadline(tmp_path: Path) -> None:
    exporter = RerunProcessSpanExporter(f"file:{tmp_path / 's.rrd'}", shutdown_timeout_s=1)
    assert exporter.worker is not None
    first, stuck = proof_spans(), proof_spans(system="late")
    exporter.export(first)
    assert exporter.force_flush(20_000)
    os.kill(exporter.worker.proc.pid, signal.SIGSTOP)  # alive, but reads nothing
    try:
        exporter.export(stuck)
    finally:
        exporter.shutdown()
    assert exporter.worker.proc.poll() is not None
    # Written to the pipe of a child that never confirmed them: unconfirmed, not "lost
    # for sure" (a child that is only slow may have drawn some).
    assert DROPS.total(signal="spans", reason=DropReason.UNCONFIRMED) == len(stuck)
    assert DROPS.total(signal="span_events", reason=DropReason.UNCONFIRMED) == events(stuck)
    assert DROPS.total() == len(stuck) + events(stuck)
    assert any(line.startswith("  (unconfirmed: handed to a child process")
               for line in DROPS.summary_lines())


def test_at_the_deadline_what_the_child_never_had_is_lost_and_what_it_had_unconfirmed(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    exporter = RerunProcessSpanExporter(f"file:{tmp_path / 'u.rrd'}", shutdown_timeout_s=1)
    worker = exporter.worker
    assert worker is not None
    assert exporter.force_flush(20_000)  # the child is up
    os.kill(worker.proc.pid, signal.SIGSTOP)  # alive, reads nothing: the pipe fills up
    caplog.set_level(logging.WARNING, logger=LOGGER)
    batches = [proof_spans(layers=40, system=f"s{i}") for i in range(40)]
    try:
        for batch in batches:
            exporter.export(batch)
        deadline = time.monotonic() + 10
        while worker._queued_bytes == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # until the writer is blocked on the full pipe
        assert worker._queued_bytes > 0, "the pipe never filled"
    finally:
        exporter.shutdown()
    spans = sum(len(b) for b in batches)
    unconfirmed = DROPS.total(signal="spans", reason=DropReason.UNCONFIRMED)
    shutdown = DROPS.total(signal="spans", reason=DropReason.SHUTDOWN)
    assert unconfirmed > 0 and shutdown > 0
    assert unconfirmed + shutdown + DROPS.total(signal="spans",
                                                reason=DropReason.QUEUE_FULL) == spans
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1 and f"{unconfirmed} span(s) of them as unconfirmed" in warnings[0]


def test_malformed_frames_are_counted_by_the_child_once(tmp_path: Path) -> None:
    exporter = RerunProcessSpanExporter(f"file:{tmp_path / 'm.rrd'}")
    worker = exporter.worker
    assert worker is not None
    good = proof_spans()
    try:
        worker.submit(SPANS, b"\xff" * 16, Counts(spans=3, span_events=5))
        worker.submit(METRICS, b"\xff" * 16, Counts(metric_points=2))
        exporter.export(good)  # the stream stays in step after a bad payload
        assert exporter.force_flush(20_000)
        assert exporter.force_flush(20_000)  # a second report adds nothing
    finally:
        exporter.shutdown()
    invalid = DropReason.INVALID
    assert DROPS.total(signal="spans", sink="rerun", reason=invalid) == 3
    assert DROPS.total(signal="span_events", sink="rerun", reason=invalid) == 5
    assert DROPS.total(signal="metric_points", sink="rerun", reason=invalid) == 2
    assert DROPS.total() == 10
    assert any(p.startswith("/gkr/walk") for p in readback.read(tmp_path / "m.rrd").paths())


def test_off_target_starts_no_child() -> None:
    exporter = RerunProcessSpanExporter("off")
    assert exporter.worker is None
    exporter.export(proof_spans())
    exporter.shutdown()
    assert DROPS.total() == 0


def _forked_prover(telemetry: Any, results: Any) -> None:
    """A multiprocessing worker forked after configure(): proves, reports its own
    Rerun losses and warnings, then stays alive while the parent shuts down."""
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("otel_proofscope.rerun").addHandler(handler)
    with telemetry.tracer.proof(system="gkr", layers=2):
        for i in range(2):
            with telemetry.tracer.layer(index=i, kind="MatMul", rounds=1):
                telemetry.tracer.sumcheck_round(0, [1, 2], 3)
    for p in telemetry.span_processors:
        p.force_flush(5000)
    results.put((DROPS.total(signal="spans", sink="rerun"),
                 DROPS.total(signal="span_events", sink="rerun"),
                 sum("was forked from the one that owns" in m for m in said)))
    time.sleep(6)


def test_forked_worker_counts_its_rerun_spans_and_does_not_hold_up_the_parent(
        tmp_path: Path) -> None:
    import multiprocessing

    from otel_proofscope.setup import configure

    rrd = tmp_path / "fork.rrd"
    # configure()'s one Rerun route: the export process (issue 29).
    telemetry = configure(out_dir=tmp_path, rerun=f"file:{rrd}", set_global=False)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    worker = ctx.Process(target=_forked_prover, args=(telemetry, results), daemon=True)
    worker.start()
    try:
        # The fork's own 3 spans and 2 round events: not drawn, counted, said once.
        assert results.get(timeout=20) == (3, 2, 1)
        with telemetry.tracer.proof(system="gkr", layers=3):
            for i in range(3):
                with telemetry.tracer.layer(index=i, kind="MatMul", rounds=1):
                    telemetry.tracer.sumcheck_round(0, [1, 2], 3)
        start = time.monotonic()
        report = telemetry.shutdown(timeout_s=3)
        took = time.monotonic() - start
        assert worker.is_alive()  # still holding whatever it inherited
    finally:
        worker.kill()
        worker.join(5)
    # The worker's inherited pipe did not keep the parent's Rerun child waiting for EOF.
    assert took < 2.0
    assert report.spans_exported["rerun"] == 4
    assert DROPS.total(sink="rerun") == 0
    proofs = {p for p in readback.read(rrd).paths() if p.startswith("/proof/progress/")}
    assert len(proofs) == 1, proofs  # the parent's proof only
