"""The export process's Rerun backlog: a burst the view lags behind waits packed, in
order, and reaches the .rrd late instead of being dropped; past its bound, or at the
deadline, what is left is counted."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.pipeline.multi_sink import MultiSinkBatchSpanProcessor
from otel_proofscope.rerun import readback, span_wire
from otel_proofscope.rerun.backlog import PackedBacklog
from otel_proofscope.rerun.export_process import ExportConfig, ExportProcessSpanExporter
from tests.test_fast_otlp import _GrpcReceiver, grpc_receiver
from tests.test_rerun_sink import spans

__all__ = ["grpc_receiver"]  # a fixture, used by name


def _proof(layers: int) -> list[ReadableSpan]:
    return spans(layers)


def _frames(spans: list[ReadableSpan], per: int) -> list[tuple[list[ReadableSpan], bytes]]:
    out = []
    for i in range(0, len(spans), per):
        payload, _ = span_wire.pack_spans_full(spans[i:i + per])
        out.append((span_wire.unpack_spans(payload).spans, payload))
    return out


class _Gate:
    """A sink that takes spans only while open (as a Rerun sink whose queue is full)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.names: list[str] = []
        self.witness: list[bool] = []

    def fits(self, spans: Sequence[ReadableSpan]) -> int:
        return len(spans) if self.open.is_set() else 0

    def submit_spans(self, spans: Sequence[ReadableSpan], *, witness: bool = False,
                     first: bool = False) -> int:
        names = [s.name + str(s.attributes.get("proof.layer.index", "")) for s in spans]
        self.names = names + self.names if first else self.names + names
        self.witness.append(witness)
        return len(spans)


def _names(spans: list[ReadableSpan]) -> list[str]:
    return [s.name + str((s.attributes or {}).get("proof.layer.index", "")) for s in spans]


def test_straight_through_while_the_sink_has_room() -> None:
    gate, ledger = _Gate(), DropLedger()
    gate.open.set()
    backlog = PackedBacklog(gate, ledger)
    spans = _proof(5)
    for batch, payload in _frames(spans, 2):
        backlog.submit(batch, payload)
    assert gate.names == _names(spans)
    assert backlog.peak_bytes == 0  # nothing was held
    backlog.close(1.0)
    assert ledger.total() == 0


def test_a_full_sink_holds_frames_packed_then_hands_them_over_in_order() -> None:
    gate, ledger = _Gate(), DropLedger()
    backlog = PackedBacklog(gate, ledger, poll_s=0.001)
    spans = _proof(9)
    frames = _frames(spans, 3)
    for batch, payload in frames:
        backlog.submit(batch, payload, witness=True)
    assert gate.names == []
    # All held at once (the one the feeder took to wait with still counts).
    assert backlog.peak_bytes == sum(len(p) for _, p in frames)
    assert not backlog.drain(0.05)  # the sink is still full
    gate.open.set()
    assert backlog.drain(5.0)
    # Every span, in the order it came, but the proof's root (which ends last) ahead.
    assert gate.names == _names(spans[-1:] + spans[:-1])
    assert set(gate.witness) == {True}
    # Once it has drained, new frames go straight in again, after the held ones.
    late = _proof(1)
    backlog.submit(*_frames(late, 2)[0])
    assert gate.names[-2:] == _names(late)
    backlog.close(1.0)
    assert ledger.total() == 0


def test_a_root_goes_ahead_of_what_waits_and_its_frame_keeps_the_rest() -> None:
    """The root is in the last frame; while earlier frames wait for the sink, it goes
    to the sink first (to the front of its queue), and its own frame is handed over
    later without it: every span once."""
    gate, ledger = _Gate(), DropLedger()
    backlog = PackedBacklog(gate, ledger, poll_s=0.001)
    spans = _proof(8)
    assert spans[-1].parent is None and all(s.parent is not None for s in spans[:-1])
    for batch, payload in _frames(spans, 3):
        backlog.submit(batch, payload)
    gate.open.set()
    assert backlog.drain(5.0)
    assert gate.names == _names(spans[-1:] + spans[:-1])
    backlog.close(1.0)
    assert ledger.total() == 0


def test_many_roots_in_a_frame_keep_their_order() -> None:
    """A frame of single-span traces (every span a root) is no reason to reorder."""
    gate, ledger = _Gate(), DropLedger()
    backlog = PackedBacklog(gate, ledger, poll_s=0.001)
    provider = TracerProvider()
    keep = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(keep))
    tracer = provider.get_tracer("t")
    for i in range(12):
        with tracer.start_as_current_span(f"single{i}"):
            pass
    spans = list(keep.get_finished_spans())
    for batch, payload in _frames(spans, 6):  # more roots a frame than go ahead
        backlog.submit(batch, payload)
    gate.open.set()
    assert backlog.drain(5.0)
    assert gate.names == [f"single{i}" for i in range(12)]
    backlog.close(1.0)


@pytest.mark.parametrize("per", [1, 2], ids=["root alone", "root with a layer"])
def test_past_its_bound_a_frame_is_counted_for_rerun_but_its_root(per: int) -> None:
    gate, ledger = _Gate(), DropLedger()
    spans = _proof(6)  # 6 layers, then the proof's root
    frames = _frames(spans, per)
    backlog = PackedBacklog(gate, ledger, poll_s=0.001,
                            max_bytes=len(frames[0][1]) + len(frames[1][1]))
    for batch, payload in frames:
        backlog.submit(batch, payload)
    kept = 2 * per
    lost = spans[kept:-1]  # the root is kept and goes first
    assert ledger.total(signal="spans", sink="rerun", reason="queue_full") == len(lost)
    assert ledger.total(signal="span_events", sink="rerun", reason="queue_full") == sum(
        len(s.events) for s in lost)
    gate.open.set()
    assert backlog.drain(5.0)
    assert gate.names == _names(spans[-1:] + spans[:kept])
    backlog.close(1.0)


def test_what_still_waits_at_the_deadline_is_counted_as_shutdown() -> None:
    """Held frames and the root gone ahead of them (its own frame), each counted once."""
    gate, ledger = _Gate(), DropLedger()
    backlog = PackedBacklog(gate, ledger, poll_s=0.001)
    spans = _proof(4)
    for batch, payload in _frames(spans, 1):
        backlog.submit(batch, payload)
    start = time.monotonic()
    backlog.close(0.2)
    assert time.monotonic() - start < 1.0
    time.sleep(0.05)  # the feeder gives up on the frame it holds
    assert ledger.total(signal="spans", sink="rerun", reason="shutdown") == len(spans)
    assert ledger.total(signal="span_events", sink="rerun", reason="shutdown") == sum(
        len(s.events) for s in spans)
    assert gate.names == []
    batch, payload = _frames(_proof(1), 2)[0]
    backlog.submit(batch, payload)  # after close: counted, not held
    assert ledger.total(signal="spans", reason="shutdown") == len(spans) + len(batch)


@pytest.mark.timeout(120)
def test_the_export_process_draws_a_burst_its_rerun_queue_cannot_hold(
        tmp_path: Path, grpc_receiver: tuple[_GrpcReceiver, int],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Rerun queue of 8 spans in the child and a burst of 400 layer spans: every span
    reaches the receiver and the .rrd, nothing is dropped (before the backlog, all but a
    few dozen were counted as queue_full)."""
    receiver, port = grpc_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    rrd = tmp_path / "burst.rrd"
    config = ExportConfig(rerun_target=f"file:{rrd}", otlp_protocol="grpc", rerun_queue=8)
    exporter = ExportProcessSpanExporter(config, shutdown_timeout_s=20.0)
    processor = MultiSinkBatchSpanProcessor(exporter, sinks=config.sinks)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = ProofTracer(provider)
    layers = 400
    with tracer.proof(system="burst", layers=layers):
        for i in range(layers):
            with tracer.layer(index=i, kind="MatMul", rounds=1):
                tracer.sumcheck_round(0, [1, 2], 3)
    assert processor.force_flush(60_000)
    provider.shutdown()
    assert DROPS.total() == 0, DROPS.snapshot()
    delivered = sum(len(ss.spans) for r in receiver.requests for rs in r.resource_spans
                    for ss in rs.scope_spans)
    assert delivered == layers + 1
    rec = readback.read(rrd)
    [flame] = [p for p in rec.paths() if p.startswith("/trace/flame/")]
    boxes = [label for row in rec.rows(flame) for label in row.values["Boxes2D:labels"]]
    assert len(boxes) == layers + 1  # every span drawn, none as an orphan
    assert not [b for b in boxes if "orphan" in b]
