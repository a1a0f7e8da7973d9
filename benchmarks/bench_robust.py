"""Issue 28 (items 4 and 12): what the new checks cost and bound.

1. The time check the span frames now run (``span_wire._times_fit``) against packing
   the same spans (``pack_spans``): CPU µs per span of 8 SDK events, the best of 40
   calls over 512 spans, per run.
2. ``proofscope diff BASE /dev/zero``: wall time and the child's peak RSS (it used to
   grow without bound: 634 MB → 4 GB in 8 s).

    python benchmarks/bench_robust.py            # 5 runs each, median (range)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _spans() -> list[Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("bench")
    for _ in range(512):
        with tracer.start_as_current_span("proof.layer") as span:
            for r in range(8):
                span.add_event("proof.sumcheck.round", {"round": r})
    return list(memory.get_finished_spans())


def _best_us(fn: Callable[[], object], n: int) -> float:
    best = float("inf")
    for _ in range(40):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def times_check(runs: int = 5) -> tuple[list[float], list[float]]:
    from otel_proofscope.rerun import span_wire

    spans = _spans()
    records = [span_wire._record_fast(s) for s in spans]
    check, pack = [], []
    for _ in range(runs):  # interleaved
        check.append(_best_us(lambda: all(map(span_wire._times_fit, records)), len(spans)))
        pack.append(_best_us(lambda: span_wire.pack_spans(spans), len(spans)))
    return check, pack


def dev_zero(runs: int = 5) -> tuple[list[float], list[float]]:
    from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.jsonl"
        exporter = JsonLinesSpanExporter(base)
        exporter.export(_spans()[:16])
        exporter.shutdown()
        walls, peaks = [], []
        for _ in range(runs):
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "otel_proofscope", "diff",
                                     str(base), "/dev/zero"], stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = status
            walls.append(time.monotonic() - t0)
            peaks.append(usage.ru_maxrss / 1024)
        return walls, peaks


def _fmt(values: list[float], unit: str, digits: int = 2) -> str:
    return (f"{statistics.median(values):.{digits}f} {unit} "
            f"({min(values):.{digits}f}–{max(values):.{digits}f})")


def main() -> None:
    check, pack = times_check()
    print(f"time check: {_fmt(check, 'µs/span')}; pack_spans: {_fmt(pack, 'µs/span')}")
    walls, peaks = dev_zero()
    print(f"diff BASE /dev/zero: {_fmt(walls, 's')}, peak RSS {_fmt(peaks, 'MB', 0)}")


if __name__ == "__main__":
    main()
