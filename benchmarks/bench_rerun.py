"""Rerun exporter throughput vs the seed's one-``rr.log``-per-entity approach.

Run: python benchmarks/bench_rerun.py [--proofs N --layers L --rounds R]

Both translations draw the same span set (made by ProofTracer on an SDK
TracerProvider) into a .rrd file in the same process, side by side:

* **columnar** — this package's RerunSink (translation + one ``send_columns`` per
  entity per batch), timed from submit to flushed;
* **naive** — a port of the seed's ``dispatch_event``: one ``rr.log`` per entity
  update (``set_time`` before each event so rows still carry ``proof_time``), plus the
  same trace view the sink draws (flame box, span and event log rows, duration point
  per span), also one ``rr.log`` each, so both sides produce the same view. The
  walk-only naive side (the seed's output alone, less work than the sink does) is
  reported too, for comparison with earlier figures.

Then the prover-thread cost per span with the exporter installed (SDK
``SimpleSpanProcessor``, i.e. export runs on the prover thread, and the package's
``BoundedBatchSpanProcessor``) against the same TracerProvider without it.
Prints a markdown table; figures go in benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import rerun as rr
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import CircuitNode, ProofTracer
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.rerun import layout
from otel_proofscope.rerun.exporter import RerunSpanExporter
from otel_proofscope.rerun.sink import RerunSink
from otel_proofscope.rerun.target import parse_target
from otel_proofscope.rerun.translate import claim_fingerprint
from otel_proofscope.semconv import Attr, EventName, SpanName

KINDS = ("MatMul", "Add", "Activation", "Mul", "Attention")


def make_spans(proofs: int, layers: int, rounds: int) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    run_proofs(ProofTracer(provider), proofs, layers, rounds)
    return list(memory.get_finished_spans())


def run_proofs(tracer: ProofTracer, proofs: int, layers: int, rounds: int) -> int:
    """Prove-shaped telemetry; returns the number of spans made."""
    nodes = [CircuitNode(i, KINDS[i % 5], 1000 * (i + 1), [i - 1] if i else [])
             for i in range(layers)]
    poly = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))
    for _ in range(proofs):
        with tracer.proof(system="gkr", backend="cpu", layers=layers) as proof:
            with tracer.circuit_compile(nodes=nodes):
                pass
            for i in reversed(range(layers)):
                with tracer.layer(index=i, kind=KINDS[i % 5], rounds=rounds,
                                  claim_initial=(i, 2, 3, 4), trace_cost=1000) as layer:
                    for r in range(rounds):
                        tracer.sumcheck_round(r, poly, (r * 7919 + i, 1, 2, 3))
                    layer.set_final_claim((5, 6, 7, 8))
            with tracer.verify() as verify:
                verify.set_verified(True)
            proof.set_result(layer_proofs=layers, verified=True)
    return proofs * (layers + 3)


# ── the seed's approach: one rr.log per entity update ────────────────────────────────


def naive(spans: Sequence[ReadableSpan], rec: rr.RecordingStream) -> None:
    def at(t: int) -> None:
        rec.set_time("proof_time", timestamp=t / 1e9)

    for span in sorted(spans, key=lambda s: s.start_time or 0):
        a = span.attributes or {}
        p = f"{span.context.trace_id:032x}"[:8] if span.context else "0"
        start, end = span.start_time or 0, span.end_time or 0
        if span.name == SpanName.PROOF:
            n = int(a.get(Attr.PROOF_LAYERS, 0))  # type: ignore[arg-type]
            pos = [layout.helix(i) for i in range(n)]
            at(start)
            rec.log(f"circuit/{p}/backbone", rr.LineStrips3D([pos]), static=True)
            rec.log(f"proof/progress/{p}", rr.Scalars(0.0))
            rec.log(f"logs/proof/{p}", rr.TextLog(f"ProofStart {n} layers"))
            at(end)
            rec.log(f"proof/progress/{p}", rr.Scalars(1.0))
            rec.log(f"gkr/walk/{p}/cursor", rr.Points3D([[0.0, -30.0, -30.0]]))
            rec.log(f"logs/proof/{p}", rr.TextLog("PROOF COMPLETE"))
        elif span.name == SpanName.CIRCUIT_COMPILE:
            idx = [int(i) for i in a.get(Attr.CIRCUIT_NODE_INDEX, ())]  # type: ignore[union-attr,arg-type]
            kinds = [str(k) for k in a.get(Attr.CIRCUIT_NODE_KIND, ())]  # type: ignore[union-attr]
            at(end)
            rec.log(f"circuit/{p}/nodes", rr.Points3D(
                [layout.node_position(i, k) for i, k in zip(idx, kinds, strict=False)],
                colors=[layout.kind_rgba(k) for k in kinds]))
            src = a.get(Attr.CIRCUIT_EDGE_FROM, ())
            dst = a.get(Attr.CIRCUIT_EDGE_TO, ())
            rec.log(f"circuit/{p}/edges", rr.LineStrips3D(
                [[layout.helix(f), layout.helix(t)] for f, t in zip(src, dst, strict=False)]))  # type: ignore[arg-type]
        elif span.name == SpanName.LAYER:
            i = int(a[Attr.LAYER_INDEX])  # type: ignore[arg-type]
            kind = str(a[Attr.LAYER_KIND])
            total = int(a.get(Attr.SUMCHECK_ROUNDS, 0))  # type: ignore[arg-type]
            x, y, z = layout.node_position(i, kind)
            at(start)
            rec.log(f"gkr/walk/{p}/layer_{i}/node", rr.Points3D(
                [[x, y, z]], colors=[layout.kind_rgba(kind)], radii=[0.3], labels=[kind]))
            rec.log(f"gkr/walk/{p}/cursor", rr.Points3D([[x, y + 0.7, z]], colors=[0x00E5FFFF]))
            rec.log(f"gkr/claim/{p}", rr.Scalars(0.0))
            rec.log(f"logs/gkr/{p}", rr.TextLog(f"-> [{i}] {kind}"))
            for ev in span.events:
                if ev.name != EventName.SUMCHECK_ROUND:
                    continue
                ea = ev.attributes or {}
                r = int(ea[Attr.SUMCHECK_ROUND])  # type: ignore[arg-type]
                at(ev.timestamp)
                rec.log(f"gkr/walk/{p}/layer_{i}/claim",
                        rr.Scalars(claim_fingerprint(str(ea[Attr.CLAIM])) or 0.0))
                bar = layout.round_bar(i, kind, r, total, 1.0)
                rec.log(f"gkr/walk/{p}/layer_{i}/bar_{r}", rr.LineStrips3D([bar]))
                if r == 0 or r + 1 == total:
                    rec.log(f"logs/gkr/{p}", rr.TextLog(f"  [{i}] round {r + 1}/{total}"))
            at(end)
            rec.log(f"gkr/walk/{p}/layer_{i}/node", rr.Points3D(
                [[x, y, z]], colors=[layout.PROVED], radii=[0.3], labels=[kind]))
            rec.log(f"gkr/walk/{p}/progress_trail",
                    rr.LineStrips3D([[layout.helix(j) for j in range(i + 1)]]))
            rec.log(f"logs/gkr/{p}", rr.TextLog(f"[{i}] proved {kind}"))
        else:
            at(end)
            rec.log(f"logs/proof/{p}", rr.TextLog(span.name))


def naive_trace(spans: Sequence[ReadableSpan], rec: rr.RecordingStream) -> None:
    """The trace view the columnar sink also draws, the seed's way: one ``rr.log`` per
    flame box, per span log row (one per span, its events summarized, a log line or an
    exception a row of its own), and per duration point."""
    depth: dict[int, int] = {}
    origin: dict[int, tuple[int, float]] = {}
    by_id = {s.context.span_id: s for s in spans if s.context}

    def level_of(span: ReadableSpan) -> int:
        parent = span.parent.span_id if span.parent else 0
        if span.context.span_id in depth:  # type: ignore[union-attr]
            return depth[span.context.span_id]  # type: ignore[union-attr]
        d = 0 if not parent or parent not in by_id else level_of(by_id[parent]) + 1
        depth[span.context.span_id] = d  # type: ignore[union-attr]
        return d

    def kv(attrs: object) -> str:
        a = dict(attrs or {})  # type: ignore[call-overload]
        return " ".join(f"{k}={a[k]}" for k in sorted(a))

    for span in sorted(spans, key=lambda s: s.start_time or 0):
        tid = span.context.trace_id if span.context else 0
        key = f"{tid:032x}"[:8]
        start, end = span.start_time or 0, span.end_time or 0
        t0, scale = origin.setdefault(tid, (start, 24.0 / max(end - start, 1000)))
        half = (end - start) * scale / 2
        ms = (end - start) / 1e6
        at = rec.set_time
        at("proof_time", timestamp=start / 1e9)
        rec.log(f"trace/flame/svc/{key}", rr.Boxes2D(
            centers=[[(start - t0) * scale + half, float(level_of(span))]],
            half_sizes=[[half, 0.25]], colors=[0x429BF5FF],
            labels=[f"{span.name} {ms:.2f} ms"]))
        # The span log as the sink writes it: one row per span, its events summarized
        # (count, first, last); a log line or an exception is a row of its own.
        summary = ""
        rounds = [ev for ev in span.events if ev.name not in (EventName.LOG, "exception")]
        for ev in span.events:
            if ev.name in (EventName.LOG, "exception"):
                at("proof_time", timestamp=ev.timestamp / 1e9)
                rec.log(f"trace/logs/svc/{key}", rr.TextLog(
                    f"{span.name} › {ev.name} · {kv(ev.attributes)}"))
        if rounds:
            first, last = rounds[0], rounds[-1]
            summary = (f" · {len(rounds)} events, first: {first.name} "
                       f"({kv(first.attributes)}); last: {last.name} ({kv(last.attributes)})")
        at("proof_time", timestamp=end / 1e9)
        rec.log(f"trace/logs/svc/{key}", rr.TextLog(
            f"{span.name} {ms:.2f} ms · {kv(span.attributes)}{summary}"))
        rec.log(f"trace/durations/svc/{span.name}", rr.Scalars(ms))


def naive_full(spans: Sequence[ReadableSpan], rec: rr.RecordingStream) -> None:
    """The same output as the columnar sink: the walk and the trace view."""
    naive(spans, rec)
    naive_trace(spans, rec)


# ── measurements ─────────────────────────────────────────────────────────────────────


def columnar_s(spans: Sequence[ReadableSpan], out: Path) -> tuple[float, int]:
    sink = RerunSink(parse_target(f"file:{out}"))
    # Open the recording (file, blueprint, sender thread) before timing, as the naive
    # side does: a span of no proof is translated to nothing but opens the sink.
    sink.submit_spans([ReadableSpan("warm-up")])
    sink.flush(30)
    calls0 = sink.stats.rerun_calls
    start = time.perf_counter()
    for i in range(0, len(spans), 512):  # the processors' batch size
        sink.submit_spans(spans[i:i + 512])
    ok = sink.flush(120)
    elapsed = time.perf_counter() - start
    assert ok, "columnar sink did not flush"
    calls = sink.stats.rerun_calls - calls0
    sink.close(10)
    return elapsed, calls


def naive_s(spans: Sequence[ReadableSpan], out: Path,
            draw: Callable[[Sequence[ReadableSpan], rr.RecordingStream], None] = naive
            ) -> float:
    rec = rr.RecordingStream("bench-naive")
    rec.save(out)
    start = time.perf_counter()
    draw(spans, rec)
    rec.flush()
    elapsed = time.perf_counter() - start
    rec.disconnect()
    return elapsed


def prover_cost_us(install: Callable[[TracerProvider], object] | None, proofs: int,
                   layers: int, rounds: int) -> float:
    provider = TracerProvider()
    if install is not None:
        install(provider)
    tracer = ProofTracer(provider)
    run_proofs(tracer, 1, 4, rounds)  # warm up
    start = time.perf_counter()
    n = run_proofs(tracer, proofs, layers, rounds)
    elapsed = time.perf_counter() - start
    provider.shutdown()
    return elapsed / n * 1e6


def export_call_us(spans: Sequence[ReadableSpan], out: Path) -> float:
    """What ``export()`` itself costs its caller, per span (one span per call)."""
    exporter = RerunSpanExporter(f"file:{out}", queue_size=1 << 20)
    start = time.perf_counter()
    for span in spans:
        exporter.export((span,))
    elapsed = time.perf_counter() - start
    exporter.shutdown()
    return elapsed / len(spans) * 1e6


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proofs", type=int, default=2)
    ap.add_argument("--layers", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    spans = make_spans(args.proofs, args.layers, args.rounds)
    naive_t: list[float] = []  # the walk alone (the seed's output)
    full_t: list[float] = []  # the walk and the trace view (the columnar sink's output)
    col_t: list[float] = []
    calls = 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        # One untimed run of each side first: the first translation in a process pays
        # one-off costs (module caches, first calls into pyarrow and numpy; measured
        # ~2x a later run), which a prover pays once, not per batch.
        naive_s(spans, d / "warm-naive.rrd", naive_full)
        columnar_s(spans, d / "warm-columnar.rrd")
        # Interleaved (rotating which goes first), each after a full collection, so
        # machine load and the other sides' garbage hit all alike.
        for r in range(args.repeats):
            for side in (0, 1, 2)[r % 3:] + (0, 1, 2)[:r % 3]:
                gc.collect()
                if side == 0:
                    naive_t.append(naive_s(spans, d / "naive.rrd"))
                elif side == 1:
                    full_t.append(naive_s(spans, d / "naive_full.rrd", naive_full))
                else:
                    t, calls = columnar_s(spans, d / "columnar.rrd")
                    col_t.append(t)

        def with_simple(p: TracerProvider) -> None:
            p.add_span_processor(SimpleSpanProcessor(
                RerunSpanExporter(f"file:{d / 'simple.rrd'}", queue_size=1 << 20)))

        def with_bounded(p: TracerProvider) -> None:
            p.add_span_processor(BoundedBatchSpanProcessor(
                RerunSpanExporter(f"file:{d / 'bounded.rrd'}", queue_size=1 << 20),
                sink="rerun"))

        costs = {name: statistics.median(
            prover_cost_us(fn, args.proofs, args.layers, args.rounds) for _ in range(3))
            for name, fn in (("none", None), ("simple", with_simple),
                             ("bounded", with_bounded))}
        call_us = statistics.median(export_call_us(spans, d / f"call{i}.rrd") for i in range(3))

    n = len(spans)
    naive_med, full_med, col_med = (statistics.median(x) for x in (naive_t, full_t, col_t))
    print(f"span set: {args.proofs} proofs × {args.layers} layers × {args.rounds} rounds = "
          f"{n} spans ({sum(len(s.events) for s in spans)} events); medians of "
          f"{args.repeats} interleaved runs after one untimed run of each side\n")
    print("Same output on both sides (the walk and the trace view; the columnar sink "
          "draws both):\n")
    print("| naive rr.log spans/s | columnar spans/s | speed-up: ratio of the medians "
          "(min–max of paired runs) | Rerun calls: naive / columnar | export() µs/span "
          "| prover µs/span: no exporter / + Simple / + Bounded |")
    print("|---|---|---|---|---|---|")
    fair = sorted(a / b for a, b in zip(full_t, col_t, strict=True))
    print(f"| {n / full_med:,.0f} | {n / col_med:,.0f} | {full_med / col_med:.1f}× "
          f"({fair[0]:.1f}–{fair[-1]:.1f}) "
          f"| {len(naive_calls_of(spans, naive_full)):,} / {calls} | {call_us:.1f} "
          f"| {costs['none']:.0f} / {costs['simple']:.0f} / {costs['bounded']:.0f} |")
    ratios = sorted(a / b for a, b in zip(naive_t, col_t, strict=True))
    print(f"\nUnequal work, as measured before (the naive side draws the walk only, "
          f"{len(naive_calls_of(spans)):,} calls): {n / naive_med:,.0f} spans/s, "
          f"{naive_med / col_med:.1f}× ({ratios[0]:.1f}–{ratios[-1]:.1f})")


def naive_calls_of(spans: Sequence[ReadableSpan],
                   draw: Callable[[Sequence[ReadableSpan], rr.RecordingStream], None] = naive
                   ) -> list[None]:
    """Count the naive translation's ``rr.log`` calls (by running it on a counter)."""
    counted: list[None] = []

    class Counter:
        def log(self, *args: object, **kwargs: object) -> None:
            counted.append(None)

        def set_time(self, *args: object, **kwargs: object) -> None:
            return None

    draw(spans, Counter())  # type: ignore[arg-type]
    return counted


if __name__ == "__main__":
    main()
