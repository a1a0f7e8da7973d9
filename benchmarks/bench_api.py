"""Instrumentation-API cost: telemetry off, and a round with telemetry on vs raw OTel.

Run: python benchmarks/bench_api.py   (prints a markdown table; figures go in
benchmarks/README.md). Everything is measured side by side in one process.

``--cpu-time`` times with this thread's CPU time instead of the wall clock (on a shared,
loaded machine the wall clock mostly measures the other processes); ``--repeats N``
sets the number of interleaved runs with telemetry on (9). To compare two trees, run
this file with ``PYTHONPATH`` set to each in turn.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider

from otel_proofscope import instrumentation
from otel_proofscope.fields import canonical
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import Attr, EventName

CALLS_OFF = 1_000_000
ROUNDS_ON = 20_000
POLY = ((1, 2, 3, 4), (5, 6, 7, 8), (9, 10, 11, 12))
CLAIM = (13, 14, 15, 16)


class Discard(SpanExporter):
    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def runs_of(fn: Callable[[], float], repeats: int = 5) -> list[float]:
    """Every run's time: the table quotes the median and the range, never the best run."""
    return [fn() for _ in range(repeats)]


def med_range(xs: list[float], scale: float, fmt: str = ".0f") -> str:
    return (f"{statistics.median(xs) * scale:{fmt}} "
            f"({min(xs) * scale:{fmt}}–{max(xs) * scale:{fmt}})")


def off_cost() -> list[float]:
    """1M sumcheck_round calls with nothing recording (no layer open, no SDK)."""
    tracer = ProofTracer(NoOpTracerProvider())
    rnd = tracer.sumcheck_round

    def run() -> float:
        start = time.perf_counter()
        for i in range(CALLS_OFF):
            rnd(i, POLY, CLAIM)
        return time.perf_counter() - start

    return runs_of(run)


def off_cost_in_noop_layer() -> list[float]:
    """Same, inside a layer() of a no-op tracer, payload passed as lambdas (the caller's
    lambda allocation dominates: pass prebuilt tuples where you have them)."""
    tracer = ProofTracer(NoOpTracerProvider())
    rnd = tracer.sumcheck_round

    def run() -> float:
        with tracer.layer(index=0, kind="MatMul", rounds=CALLS_OFF):
            start = time.perf_counter()
            for i in range(CALLS_OFF):
                rnd(i, lambda: POLY, lambda: CLAIM)
            return time.perf_counter() - start

    return runs_of(run)


def provider() -> TracerProvider:
    tp = TracerProvider(span_limits=SpanLimits(max_events=ROUNDS_ON + 10))
    tp.add_span_processor(SimpleSpanProcessor(Discard()))
    return tp


def on_cost_api() -> Callable[[], float]:
    tracer = ProofTracer(provider())
    rnd = tracer.sumcheck_round

    def run() -> float:
        with tracer.layer(index=0, kind="MatMul", rounds=ROUNDS_ON):
            start = time.perf_counter()
            for i in range(ROUNDS_ON):
                rnd(i, POLY, CLAIM)
            return (time.perf_counter() - start) / ROUNDS_ON

    return run


def on_cost_api_exported() -> Callable[[], float]:
    """A round's whole CPU cost: the API call on the prover thread plus what an OTLP
    export thread does with it (configure()'s witness filter, which reads every event,
    and the fast OTLP encoder), both timed here on one thread."""
    from otel_proofscope.otlp.encode import encode_export_request
    from otel_proofscope.pipeline.privacy import strip_witness

    spans: list[ReadableSpan] = []

    class Keep(SpanExporter):
        def export(self, batch: Sequence[ReadableSpan]) -> SpanExportResult:
            spans.extend(batch)
            return SpanExportResult.SUCCESS

    tp = TracerProvider(span_limits=SpanLimits(max_events=ROUNDS_ON + 10))
    tp.add_span_processor(SimpleSpanProcessor(Keep()))
    tracer = ProofTracer(tp)
    rnd = tracer.sumcheck_round

    def run() -> float:
        spans.clear()
        start = time.perf_counter()
        with tracer.layer(index=0, kind="MatMul", rounds=ROUNDS_ON):
            for i in range(ROUNDS_ON):
                rnd(i, POLY, CLAIM)
        encode_export_request([strip_witness(s) for s in spans])
        return (time.perf_counter() - start) / ROUNDS_ON

    return run


def raw_round(span: Any, i: int) -> None:
    """A round as bare OTel records it: the attributes built inline from the same data."""
    span.add_event(EventName.SUMCHECK_ROUND, {
        Attr.SUMCHECK_ROUND: i,
        Attr.SUMCHECK_DEGREE: len(POLY) - 1,
        Attr.SUMCHECK_POLY: [canonical(c) for c in POLY],
        Attr.CLAIM: canonical(CLAIM),
    })


def on_cost_raw() -> Callable[[], float]:
    """Bare OTel: span.add_event with the same attributes, built inline from the same data."""
    tracer = provider().get_tracer("bench")

    def run() -> float:
        with tracer.start_as_current_span("proof.layer") as span:
            start = time.perf_counter()
            for i in range(ROUNDS_ON):
                raw_round(span, i)
            return (time.perf_counter() - start) / ROUNDS_ON

    return run


def on_cost_raw_prebuilt() -> Callable[[], float]:
    """Bare OTel with the attribute strings already built (a lower bound)."""
    tracer = provider().get_tracer("bench")
    attrs = {Attr.SUMCHECK_ROUND: 0, Attr.SUMCHECK_DEGREE: 2,
             Attr.SUMCHECK_POLY: [canonical(c) for c in POLY], Attr.CLAIM: canonical(CLAIM)}

    def run() -> float:
        with tracer.start_as_current_span("proof.layer") as span:
            start = time.perf_counter()
            for _ in range(ROUNDS_ON):
                span.add_event(EventName.SUMCHECK_ROUND, attrs)
            return (time.perf_counter() - start) / ROUNDS_ON

    return run


LAYER_ROUNDS = 16
LAYERS = 500


def on_cost_configured(export_process: bool = False
                       ) -> tuple[Callable[[], float], Callable[[], None]]:
    """A round as a prover pays it under ``configure()``: its bounded processors (OTLP
    JSON-lines files, no Rerun), layers of 16 rounds with each layer's start and end
    (the processors' hand-off) included, per round, on the prover thread. With
    ``export_process``: a Rerun ``.rrd`` too, drawn by the export process (the prover's
    process packs each span for it on an export thread, which the wall clock sees)."""
    import tempfile

    import otel_proofscope as ps

    out = tempfile.mkdtemp(prefix="bench-api-")
    telemetry = ps.configure(out_dir=out, set_global=False, export_process=export_process,
                             rerun=f"file:{out}/bench.rrd" if export_process else "off")
    tracer = telemetry.tracer
    rnd = tracer.sumcheck_round

    def run() -> float:
        start = time.perf_counter()
        for i in range(LAYERS):
            with tracer.layer(index=i, kind="MatMul", rounds=LAYER_ROUNDS):
                for r in range(LAYER_ROUNDS):
                    rnd(r, POLY, CLAIM)
        elapsed = time.perf_counter() - start
        telemetry.force_flush(30)  # each run starts with empty queues
        return elapsed / (LAYERS * LAYER_ROUNDS)

    return run, lambda: (telemetry.shutdown(), None)[1]


def on_cost_configured_raw() -> Callable[[], float]:
    """The same layers with the stock SDK: ``BatchSpanProcessor``, 16 ``add_event``
    calls per span with the attributes built inline, a discarding exporter."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tp = TracerProvider()
    tp.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = tp.get_tracer("bench")

    def run() -> float:
        start = time.perf_counter()
        for i in range(LAYERS):
            with tracer.start_as_current_span("proof.layer", attributes={
                    Attr.LAYER_INDEX: i, Attr.LAYER_KIND: "MatMul",
                    Attr.SUMCHECK_ROUNDS: LAYER_ROUNDS}) as span:
                for r in range(LAYER_ROUNDS):
                    raw_round(span, r)
        elapsed = time.perf_counter() - start
        tp.force_flush()
        return elapsed / (LAYERS * LAYER_ROUNDS)

    return run


def interleaved(runs: list[Callable[[], float]], repeats: int = 9) -> list[list[float]]:
    """Alternate the variants so machine noise hits them alike."""
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for i, run in enumerate(runs):
            samples[i].append(run())
    return samples


def main() -> int:
    assert instrumentation._active_layers == 0
    if "--cpu-time" in sys.argv:
        time.perf_counter = time.thread_time  # every timer below reads time.perf_counter
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 9
    off = off_cost()
    off_layer = off_cost_in_noop_layer()
    configured, close = on_cost_configured()
    exported, close_exported = on_cost_configured(export_process=True)
    api_s, raw_s, pre_s, total_s, conf_s, conf_raw_s, exp_s = interleaved(
        [on_cost_api(), on_cost_raw(), on_cost_raw_prebuilt(), on_cost_api_exported(),
         configured, on_cost_configured_raw(), exported], repeats)
    close()
    close_exported()
    conf_ratios = [a / r for a, r in zip(conf_s, conf_raw_s, strict=True)]
    ratios = [a / r for a, r in zip(api_s, raw_s, strict=True)]
    ratio = statistics.median(ratios)
    print(f"medians (min–max) of {len(off)} runs (telemetry off) and of {len(api_s)} "
          f"interleaved runs (telemetry on); "
          f"{'thread CPU time' if '--cpu-time' in sys.argv else 'wall clock'}\n")
    print("| measurement | value | target |")
    print("|---|---|---|")
    print(f"| 1M `sumcheck_round`, telemetry off | {med_range(off, 1e3)} ms | < 150 ms |")
    print(f"| 1M `sumcheck_round` in a no-op layer, payload as lambdas | "
          f"{med_range(off_layer, 1e3)} ms | — (the caller's lambda allocation) |")
    print(f"| round, telemetry on (API) | {med_range(api_s, 1e6, '.1f')} µs | <= 3 µs |")
    print(f"| round, API call plus its OTLP export (witness filter, fast encoder) | "
          f"{med_range(total_s, 1e6, '.1f')} µs | — |")
    print(f"| round, raw `span.add_event` (same attributes, built inline) | "
          f"{med_range(raw_s, 1e6, '.1f')} µs | |")
    print(f"| round, raw `span.add_event` (attributes prebuilt) | "
          f"{med_range(pre_s, 1e6, '.1f')} µs | |")
    print(f"| API / raw ratio (median of paired runs) | {med_range(ratios, 1, '.2f')}x "
          "| <= 1.3x |")
    print(f"| round under `configure()` (OTLP files, no Rerun), layers of {LAYER_ROUNDS} "
          f"rounds, layer start and end included | {med_range(conf_s, 1e6, '.1f')} µs | — |")
    print(f"| the same layers, stock SDK (`BatchSpanProcessor`, `add_event`) | "
          f"{med_range(conf_raw_s, 1e6, '.1f')} µs | |")
    print(f"| `configure()` / stock SDK (median of paired runs) | "
          f"{med_range(conf_ratios, 1, '.2f')}x | |")
    print(f"| the same under `configure(export_process=True)` with a Rerun `.rrd` | "
          f"{med_range(exp_s, 1e6, '.1f')} µs | — |")
    ok = statistics.median(off) < 0.150 and ratio <= 1.3
    return 0 if ok or "--no-check" in sys.argv else 1


if __name__ == "__main__":
    sys.exit(main())
