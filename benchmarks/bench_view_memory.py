"""RSS the Rerun view grows by while it draws one large trace (issue 29, decision 6).

Run: python benchmarks/bench_view_memory.py [--spans 60000] [--repeat 3]
       [--modes all,nothing-sent] [--old CHECKOUT]
     python benchmarks/bench_view_memory.py --session 24000 [--repeat 3]

Each run is a fresh process: N ``proof.layer`` spans of one proof (as
``bench_memory.py`` makes them) are fed to a :class:`~otel_proofscope.rerun.sink.RerunSink`
writing a ``.rrd`` file, 512 at a time, and flushed; the RSS growth is read from after a
2,000-span warm-up (the recording opened, the blueprint sent) to after the flush, and
again after the close. Modes, interleaved:

* ``all``: the sink as configure() runs it;
* ``nothing-sent``: the same translation, with the sends to Rerun left out: what our
  own state (and Python's allocator) holds, apart from the Rerun SDK's.

With ``--session N``, the shape of issue 28 item 11 instead: N single-span traces from
2,000 services, 200 a batch, into serve's span exporter (its trace view bounded to 4,000
span positions, so past 4,000 traces the oldest are forgotten); RSS (after
``malloc_trim``) at six points. ``nothing-sent`` tells our state from the Rerun SDK's.

With ``--old CHECKOUT`` every mode also runs with ``PYTHONPATH=CHECKOUT`` (another
tree of this package, e.g. main), interleaved with this tree's runs.

Why: against a dead collector the export process grows with what it draws, not with
what it queues (benchmarks/README.md, decision 6). This splits that growth.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import gc, sys
    import psutil
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from otel_proofscope.instrumentation import ProofTracer
    from otel_proofscope.ledger import DropLedger
    from otel_proofscope.rerun.sink import RerunSink
    from otel_proofscope.rerun.target import parse_target

    n, mode, rrd = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    with tracer.proof(system="gkr"):
        for i in range(n):
            with tracer.layer(index=i % 100, kind="MatMul", rounds=1):
                pass
    spans = list(memory.get_finished_spans())
    memory.clear()
    sink = RerunSink(parse_target("file:" + rrd), queue_size=len(spans) + 1,
                     queue_bytes=2**40, ledger=DropLedger())
    if mode == "nothing-sent":
        sink._send = lambda sends: None
    proc = psutil.Process()
    sink.submit_spans(spans[:2000])
    sink.flush(600)
    gc.collect()
    base = proc.memory_info().rss
    for i in range(2000, len(spans), 512):
        sink.submit_spans(spans[i:i + 512])
    sink.flush(600)
    gc.collect()
    drawn = proc.memory_info().rss
    sink.close(60)
    gc.collect()
    print(drawn - base, proc.memory_info().rss - base)
""")


SESSION = textwrap.dedent("""
    import ctypes, gc, sys
    from pathlib import Path
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, TraceFlags
    from otel_proofscope.cli.serve_cmd import _exporters

    n, mode, rrd = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    [exporter], _ = _exporters("file:" + rrd, 4000)
    if mode == "nothing-sent":
        exporter.sink._send = lambda sends: None

    def rss():
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

    t0, marks = 1_700_000_000_000_000_000, []
    for k in range(n // 200):
        batch = []
        for i in range(k * 200, k * 200 + 200):
            ctx = SpanContext((i + 1) << 64 | 0xABCDEF, i + 1, False, TraceFlags(1))
            batch.append(ReadableSpan(
                name="work", context=ctx, parent=None, start_time=t0 + i * 1000,
                end_time=t0 + i * 1000 + 500,
                resource=Resource({"service.name": f"svc-{i % 2000}"})))
        exporter.export(batch)
        if (k + 1) % max(1, n // 1200) == 0:
            exporter.force_flush(60_000)
            gc.collect()
            marks.append(rss())
    print(*marks)
    exporter.shutdown()
""")

HERE = str(Path(__file__).resolve().parent.parent)


def session(mode: str, traces: int, tmp: Path, root: str = HERE) -> list[float]:
    env = dict(os.environ, PYTHONPATH=root)
    out = subprocess.run([sys.executable, "-c", SESSION, str(traces), mode,
                          str(tmp / f"{mode}.rrd")], capture_output=True, text=True,
                         timeout=1800, check=True, env=env, cwd=tmp)  # see one()
    return [int(x) / 2**20 for x in out.stdout.split()]


def one(mode: str, spans: int, tmp: Path, root: str = HERE) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=root)
    # cwd: ``-c`` puts the working directory ahead of PYTHONPATH; run from a checkout,
    # every side would import that checkout's code.
    out = subprocess.run([sys.executable, "-c", CHILD, str(spans), mode,
                          str(tmp / f"{mode}.rrd")], capture_output=True, text=True,
                         timeout=1800, check=True, env=env, cwd=tmp)
    drawn, closed = (int(x) for x in out.stdout.split())
    return drawn / 2**20, closed / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=60_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--modes", default="all,nothing-sent")
    parser.add_argument("--old", help="another checkout, run interleaved ('old:' rows)")
    parser.add_argument("--session", type=int, default=0,
                        help="N single-span traces instead of one large trace")
    args = parser.parse_args(argv)
    roots = {"": HERE} | ({"old:": args.old} if args.old else {})
    modes = [f"{tag}{m}" for m in args.modes.split(",") for tag in roots]
    drawn: dict[str, list[float]] = {m: [] for m in modes}
    closed: dict[str, list[float]] = {m: [] for m in modes}
    if args.session:
        return main_session(args.session, modes, roots, args.repeat)
    with tempfile.TemporaryDirectory(prefix="bench-view-memory-") as d:
        for i in range(args.repeat):
            for mode in modes if i % 2 == 0 else modes[::-1]:  # interleaved
                tag = "old:" if mode.startswith("old:") else ""
                a, b = one(mode.removeprefix(tag), args.spans, Path(d), roots[tag])
                drawn[mode].append(a)
                closed[mode].append(b)
                print(f"run {i + 1} {mode}: +{a:.1f} MiB drawn, +{b:.1f} MiB closed",
                      file=sys.stderr, flush=True)
    n = args.spans - 2000
    print(f"{n:,} layer spans of one trace after a 2,000-span warm-up; median (range) of "
          f"{args.repeat} runs\n")
    print("| mode | RSS growth once drawn, MiB | per span, bytes | after the close, MiB |")
    print("|---|---|---|---|")
    for mode in modes:
        a, b = drawn[mode], closed[mode]
        print(f"| {mode} | {statistics.median(a):.1f} ({min(a):.1f}–{max(a):.1f}) | "
              f"{statistics.median(a) * 2**20 / n:,.0f} | "
              f"{statistics.median(b):.1f} ({min(b):.1f}–{max(b):.1f}) |")
    return 0


def main_session(traces: int, modes: list[str], roots: dict[str, str], repeat: int) -> int:
    got: dict[str, list[list[float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-view-memory-") as d:
        for i in range(repeat):
            for mode in modes if i % 2 == 0 else modes[::-1]:  # interleaved
                tag = "old:" if mode.startswith("old:") else ""
                got[mode].append(session(mode.removeprefix(tag), traces, Path(d), roots[tag]))
                print(f"run {i + 1} {mode}: " + ", ".join(f"{m:.0f}" for m in got[mode][-1]),
                      file=sys.stderr, flush=True)
    points = len(next(iter(got.values()))[0])
    step = traces // points
    print(f"{traces:,} single-span traces from 2,000 services, the view bounded to 4,000 "
          f"span positions; RSS MiB, median (range) of {repeat} runs\n")
    print("| mode | " + " | ".join(f"{(k + 1) * step:,} traces" for k in range(points)) + " |")
    print("|---|" + "---|" * points)
    for mode, runs in got.items():
        cells = []
        for k in range(points):
            v = [r[k] for r in runs]
            cells.append(f"{statistics.median(v):.0f} ({min(v):.0f}–{max(v):.0f})")
        print(f"| {mode} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
