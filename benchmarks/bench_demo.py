"""`proofscope demo` with telemetry off vs full telemetry, side by side.

Run: python benchmarks/bench_demo.py [--repeat N] [--sizes 8x32,8x256,16x512] [--process]
                                     [--where]

"full" is what the demo does by default: OTLP/JSON-lines traces and metrics files plus
the Rerun .rrd file (when the Rerun exporter is available), with witness capture on.
"off" is the same prover on no-op providers. Runs alternate off/full and report medians:

* prove    — prover wall time (proof span: compile, witness, GKR walk, encoding);
* run      — run_demo() end to end in one process: configure(), prove, verify,
             bounded shutdown (every file flushed and closed);
* --process adds a row per size for the whole `proofscope demo` process (imports included).
* --where adds, per size, where the full run's CPU time goes (``time.thread_time`` of
  each thread's work: configure(), prove + verify, the span export threads, the Rerun
  sink thread, the metric readers, the shutdown), against the off run's.

Columns: medians (off, full, their difference and ratio) and the ratio of the fastest
runs (less sensitive to other load on a shared machine). The target is <= 5 % overhead
on `prove`.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from otel_proofscope.demo_runner import DemoOptions, rerun_available, run_demo


def _size(text: str) -> tuple[int, int]:
    layers, width = text.lower().split("x")
    return int(layers), int(width)


def in_process(layers: int, width: int, repeat: int, tmp: Path,
               rerun_ok: bool) -> dict[str, list[float]]:
    samples: dict[str, list[float]] = {"off_prove": [], "full_prove": [], "off_run": [],
                                       "full_run": []}
    # One warm-up of each, so imports and first-touch allocations are not measured.
    for i in range(repeat + 1):
        off = run_demo(DemoOptions(out_dir=tmp / f"off{i}", layers=layers, width=width,
                                   telemetry=False))
        out = tmp / f"full{i}"
        full = run_demo(DemoOptions(out_dir=out, layers=layers, width=width,
                                    rerun=f"file:{out / 'proofscope.rrd'}" if rerun_ok
                                    else "off", set_global=False))
        assert off.verified and full.verified
        if i == 0:
            continue
        samples["off_prove"].append(off.prove.prove_s + off.prove.verify_s)
        samples["full_prove"].append(full.prove.prove_s + full.prove.verify_s)
        samples["off_run"].append(off.wall_s)
        samples["full_run"].append(full.wall_s)
    return samples


def process(layers: int, width: int, repeat: int, tmp: Path) -> dict[str, list[float]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    samples: dict[str, list[float]] = {"off": [], "full": []}
    for i in range(repeat):
        for mode in ("off", "full"):
            args = [sys.executable, "-m", "otel_proofscope", "demo", "--out",
                    str(tmp / f"p{mode}{i}"), "--layers", str(layers), "--width", str(width)]
            if mode == "off":
                args.append("--no-telemetry")
            t0 = time.perf_counter()
            subprocess.run(args, check=True, capture_output=True, timeout=600, env=env)
            samples[mode].append(time.perf_counter() - t0)
    return samples


def where(layers: int, width: int, repeat: int, tmp: Path, rerun_ok: bool
          ) -> dict[str, list[float]]:
    """CPU seconds per part of a full run (and the whole process CPU of both runs)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    import otel_proofscope.demo_runner as runner
    from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
    from otel_proofscope.setup.telemetry import Telemetry

    cpu: dict[str, float] = collections.defaultdict(float)

    def timed(owner: Any, name: str, label: Callable[[Any], str]) -> Callable[[], None]:
        original = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                cpu[label(args[0] if args else None)] += time.thread_time() - t0

        setattr(owner, name, wrapper)
        return lambda: setattr(owner, name, original)

    undo = [timed(BoundedBatchSpanProcessor, "_run", lambda p: f"span export thread: {p.sink}"),
            timed(PeriodicExportingMetricReader, "_ticker", lambda _: "metric reader threads"),
            timed(Telemetry, "_close_all", lambda _: "shutdown() on the main thread"),
            timed(MeterProvider, "shutdown", lambda _: "final metric collection and "
                  "export (shutdown thread)"),
            timed(runner, "prove", lambda _: "prove + verify (prover thread)")]
    try:
        from otel_proofscope.rerun.sink import RerunSink

        undo.append(timed(RerunSink, "_run", lambda _: "Rerun sink thread: open .rrd, "
                          "translate, send, close"))
    except ImportError:
        pass
    import otel_proofscope.setup as setup

    undo.append(timed(setup, "configure", lambda _: "configure()"))
    samples: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for i in range(repeat + 1):
            c0 = time.process_time()
            run_demo(DemoOptions(out_dir=tmp / f"woff{i}", layers=layers, width=width,
                                 telemetry=False))
            off_cpu = time.process_time() - c0
            cpu.clear()
            out = tmp / f"w{i}"
            c0 = time.process_time()
            run_demo(DemoOptions(out_dir=out, layers=layers, width=width,
                                 rerun=f"file:{out / 'proofscope.rrd'}" if rerun_ok else "off",
                                 set_global=False))
            full_cpu = time.process_time() - c0
            if i == 0:
                continue
            samples["whole process, off run"].append(off_cpu)
            samples["whole process, full run"].append(full_cpu)
            for k, v in cpu.items():
                samples[k].append(v)
            samples["rest (GC, thread starts, other threads)"].append(
                full_cpu - sum(cpu.values()))
    finally:
        for u in reversed(undo):
            u()
    return samples


def _row(label: str, off: list[float], full: list[float]) -> str:
    a, b = statistics.median(off), statistics.median(full)
    lo_a, lo_b = min(off), min(full)  # the least-disturbed runs on a shared machine
    # Each full run against the off run of the same iteration (they ran back to back).
    paired = [100 * (f - o) / o for o, f in zip(off, full, strict=True)]
    return (f"| {label:<22} | {a * 1e3:7.1f} ({min(off) * 1e3:.0f}–{max(off) * 1e3:.0f}) | "
            f"{b * 1e3:7.1f} ({min(full) * 1e3:.0f}–{max(full) * 1e3:.0f}) | "
            f"{(b - a) * 1e3:+9.1f} | {100 * (b - a) / a:+7.1f} % | "
            f"{statistics.median(paired):+.1f} % ({min(paired):+.0f}–{max(paired):+.0f}) | "
            f"{100 * (lo_b - lo_a) / lo_a:+7.1f} % |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--sizes", default="8x32,8x256,16x512",
                        help="comma-separated LAYERSxWIDTH (default 8x32,8x256,16x512)")
    parser.add_argument("--process", action="store_true",
                        help="also time whole `proofscope demo` processes")
    parser.add_argument("--where", action="store_true",
                        help="also show where the full run's CPU time goes")
    args = parser.parse_args(argv)
    problem = rerun_available()
    full_desc = "OTLP JSON-lines files + " + (
        "Rerun .rrd file" if problem is None else f"NO Rerun ({problem})")
    print(f"full telemetry = {full_desc}; witness capture on; medians of {args.repeat}")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU(s)\n")
    print("| demo (layers×width)    | off ms, median (range) | full ms, median (range) "
          "|  Δ (ms)   | overhead  | paired overhead, median (range) | min/min   |")
    print("|------------------------|-----------:|-----------:|----------:|----------:"
          "|----------:|----------:|")
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as d:
        tmp = Path(d)
        for text in args.sizes.split(","):
            layers, width = _size(text)
            s = in_process(layers, width, args.repeat, tmp / text, problem is None)
            print(_row(f"{text} prove+verify", s["off_prove"], s["full_prove"]), flush=True)
            print(_row(f"{text} run_demo()", s["off_run"], s["full_run"]), flush=True)
            if args.process:
                p = process(layers, width, args.repeat, tmp / f"proc{text}")
                print(_row(f"{text} process", p["off"], p["full"]), flush=True)
        if args.where:
            for text in args.sizes.split(","):
                layers, width = _size(text)
                w = where(layers, width, args.repeat, tmp / f"where{text}", problem is None)
                print(f"\n{text}: CPU ms of a full run, median (range) of {args.repeat}\n")
                print("| part | CPU ms |\n|---|---|")
                for k, v in sorted(w.items(), key=lambda kv: -statistics.median(kv[1])):
                    print(f"| {k} | {statistics.median(v) * 1e3:.1f} "
                          f"({min(v) * 1e3:.1f}–{max(v) * 1e3:.1f}) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
