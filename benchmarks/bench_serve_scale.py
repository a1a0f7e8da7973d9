"""Scale-out of ``proofscope serve``: 1 process vs 2, spans routed by trace id.

Run: python benchmarks/bench_serve_scale.py [--spans N --rounds R --repeats K]

A burst of contract traces (``proof`` root, ``proof.layer`` spans with R sumcheck
round events each, ``proof.verify``; 64 spans per proof, made by ``ProofTracer`` as a
prover makes them) is sent to 1 and then to 2 real ``proofscope serve`` processes, each
on its own gRPC port and writing its own ``.rrd`` file.

The router stands in for the collector's ``loadbalancing`` exporter with
``routing_key: traceID`` (collector-config/loadbalancing.yaml): every span goes to
backend ``crc32(trace id) % N``, through one official ``OTLPSpanExporter`` per backend
(OTLP/gRPC, official encoder, batches of 512 spans, one sending thread per backend).
The collector hashes trace ids onto a ring instead of a modulo, which spreads them
differently but has the same property measured here: a trace's spans all reach one
backend. No collector binary runs here; the router is the stand-in.

Per run, measured rather than estimated:

* spans/s accepted: spans sent ÷ (first request → last request answered);
* spans/s drawn: spans drawn (serve's own exit report, ``rerun: drawn N spans``) ÷
  (first request → every serve process idle: its CPU time stops moving, sampled every
  0.1 s; the time is the last sample at which one still moved);
* serve CPU seconds per process, from "listening" to idle (start-up and shutdown not
  counted), read from /proc; peak RSS per process (``VmHWM`` at idle, start-up included;
  an idle serve's is printed for reference);
* losses: spans sent − spans drawn, with serve's reasons; export calls that failed;
* trace integrity: every ``.rrd`` is read back (``rerun.chunk.RrdReader``) and each
  trace's flame rows (one per span) are counted: no trace may appear in two files (the
  run fails if one does); a trace with fewer rows than spans lost some to a counted
  drop. serve's orphan count (spans whose parent it never received) is reported too.

Variants are interleaved (1, 2, 1, 2, …); tables give median (min–max) of the runs.
On a 2-CPU machine the 2 serve processes and this feeder (whose official encoder costs
about as much per span as serve does) compete for the 2 cores: the speed-up measured
there is a floor, not what 2 processes on their own cores reach.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_trace import contract_spans  # a sibling script, not a package

ROOT = Path(__file__).resolve().parent.parent
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
REQUEST_SPANS = 512
POLL_S = 0.1
#: A serve process is busy while it gains at least this much CPU per poll (10 % of a
#: core); idle serve wakes every 0.5 s and stays far below it.
BUSY_CPU_S = 0.01
QUIET_S = 1.0
#: Batch size of the --unkeyed check; not a multiple of 64, so batches cut traces.
UNKEYED_SPANS = 100
_FLAME = re.compile(r"^/trace/flame/[^/]+/([0-9a-f]{8,32})$")
_DRAWN = re.compile(r"rerun: drawn (\d+) spans?(?: \((\d+) as orphans[^)]*\))?; "
                    r"not drawn (\d+)(?: \((.*)\))?")
_ACCEPTED = re.compile(r"\bspans_accepted=(\d+)")


def backend_of(trace_id: int, n: int) -> int:
    """The stand-in for ``routing_key: traceID``: a function of the trace id alone."""
    return zlib.crc32(trace_id.to_bytes(16, "big")) % n


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Serve:
    """One ``proofscope serve`` child: gRPC only, its own port and ``.rrd``."""

    rrd: Path
    proc: subprocess.Popen[str] = field(init=False)
    endpoint: str = field(init=False)
    cpu_ready: float = field(init=False)

    def start(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
             "--http-port", "off", "--rerun", f"file:{self.rrd}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("OTLP/gRPC listening on"):
                self.endpoint = line.split()[-1]
                break
        else:
            raise RuntimeError(f"serve exited before listening (rc {self.proc.wait()})")
        self.cpu_ready = _cpu(self.proc.pid)

    def peak_rss(self) -> int:
        """VmHWM: the peak RSS of serve's own address space. ``wait4``'s ``ru_maxrss``
        would also count the parent's pages the child shared before its exec."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmHWM in /proc/PID/status")

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then (peak RSS in bytes up to now, serve's stdout after "listening")."""
        peak = self.peak_rss()
        self.proc.send_signal(signal.SIGTERM)
        _, status, _ = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        return peak, out


@dataclass
class Report:
    """What one serve process said at exit, and what its .rrd holds."""

    accepted: int
    drawn: int
    orphans: int
    not_drawn: int
    reasons: str
    cpu_s: float
    peak_rss: int
    rows_by_key: dict[str, int]


def _parse(out: str) -> tuple[int, int, int, int, str]:
    acc = _ACCEPTED.search(out)
    drawn = _DRAWN.search(out)
    if acc is None or drawn is None:
        raise RuntimeError(f"serve's exit report is missing a line:\n{out}")
    return (int(acc.group(1)), int(drawn.group(1)), int(drawn.group(2) or 0),
            int(drawn.group(3)), drawn.group(4) or "")


def flame_rows(rrd: Path) -> dict[str, int]:
    """Trace key (the first hex digits of the trace id) → flame rows, one per span."""
    from rerun.chunk import RrdReader

    reader = RrdReader(rrd)
    counts: dict[str, int] = {}
    for entry in reader.recordings():
        for chunk in reader.stream(store=entry).collect().stream().to_chunks():
            m = _FLAME.match(chunk.entity_path)
            if m and not chunk.is_static:
                counts[m.group(1)] = counts.get(m.group(1), 0) + chunk.to_record_batch().num_rows
    return counts


def feed(routed: Sequence[Sequence[ReadableSpan]], endpoints: Sequence[str],
         encoded: list[list[tuple[bytes, int]]] | None = None,
         ) -> tuple[float, float, float, int]:
    """Send each backend its spans; (start, end, feeder CPU s, spans in failed exports)."""
    failed = [0] * len(endpoints)
    go = threading.Barrier(len(endpoints) + 1)

    def send(i: int) -> None:
        exporter = OTLPSpanExporter(endpoint=endpoints[i], insecure=True, timeout=120)
        spans = routed[i]
        go.wait()
        for k in range(0, len(spans), REQUEST_SPANS):
            batch = spans[k:k + REQUEST_SPANS]
            if exporter.export(batch) is not SpanExportResult.SUCCESS:
                failed[i] += len(batch)
        exporter.shutdown()

    def send_encoded(i: int) -> None:
        assert encoded is not None
        with grpc.insecure_channel(endpoints[i]) as channel:
            export = channel.unary_unary(EXPORT, request_serializer=None,
                                         response_deserializer=None)
            go.wait()
            for body, count in encoded[i]:
                try:
                    export(body, timeout=120)
                except grpc.RpcError:
                    failed[i] += count

    target = send if encoded is None else send_encoded
    threads = [threading.Thread(target=target, args=(i,)) for i in range(len(endpoints))]
    for t in threads:
        t.start()
    cpu0 = time.process_time()
    go.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return start, time.perf_counter(), time.process_time() - cpu0, sum(failed)


def wait_idle(serves: Sequence[Serve]) -> tuple[float, list[float]]:
    """(time the last process stopped working, each process's CPU at that moment)."""
    last = [_cpu(s.proc.pid) for s in serves]
    at_busy = list(last)
    busy_until = time.perf_counter()
    while time.perf_counter() - busy_until < QUIET_S:
        time.sleep(POLL_S)
        now = [_cpu(s.proc.pid) for s in serves]
        if any(n - p >= BUSY_CPU_S for n, p in zip(now, last, strict=True)):
            busy_until = time.perf_counter()
            at_busy = now
        last = now
    return busy_until, at_busy


@dataclass
class Run:
    n: int
    spans: int
    accepted_rate: float
    drawn_rate: float
    feeder_cpu: float
    failed_exports: int
    reports: list[Report]
    split_traces: int
    incomplete_traces: int
    lost: int

    @property
    def orphans(self) -> int:
        return sum(x.orphans for x in self.reports)


def run_once(n: int, spans: Sequence[ReadableSpan], tmp: Path, keyed: bool = True,
             pre_encoded: bool = False) -> Run:
    routed: list[list[ReadableSpan]] = [[] for _ in range(n)]
    for i, span in enumerate(spans):
        assert span.context is not None
        # Unkeyed: batches of UNKEYED_SPANS alternate between backends, as an L4 balancer
        # spreads a collector's batches (cut without regard to traces) over connections.
        routed[backend_of(span.context.trace_id, n) if keyed
               else (i // UNKEYED_SPANS) % n].append(span)
    # Pre-encoded: the official encoder runs before the clock starts, so the feeder's
    # CPU (about 2/3 of serve's per span) leaves the 2 cores to the serve processes.
    encoded = [[(bytes(encode_spans(b[k:k + REQUEST_SPANS]).SerializeToString()),
                 len(b[k:k + REQUEST_SPANS])) for k in range(0, len(b), REQUEST_SPANS)]
               for b in routed] if pre_encoded else None
    env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp), "PYTHONPATH": str(ROOT)}
    serves = [Serve(tmp / f"serve-{i}.rrd") for i in range(n)]
    try:
        for s in serves:
            s.start(env)
        start, answered, feeder_cpu, failed = feed(routed, [s.endpoint for s in serves],
                                                   encoded)
        idle_at, cpu_idle = wait_idle(serves)
    finally:
        stopped = [s.stop() if s.proc.returncode is None else (0, "") for s in serves]
    reports = []
    for s, (rss, out), cpu in zip(serves, stopped, cpu_idle, strict=True):
        accepted, drawn, orphans, not_drawn, reasons = _parse(out)
        reports.append(Report(accepted, drawn, orphans, not_drawn, reasons,
                              cpu - s.cpu_ready, rss, flame_rows(s.rrd)))
    drawn_total = sum(r.drawn for r in reports)
    return Run(n, len(spans), len(spans) / (answered - start), drawn_total / (idle_at - start),
               feeder_cpu, failed, reports, *split_count(spans, reports),
               len(spans) - drawn_total)


def split_count(spans: Sequence[ReadableSpan], reports: Sequence[Report]) -> tuple[int, int]:
    """(traces drawn in more than one ``.rrd``, traces missing spans), each file read back.

    A trace missing spans but in one file lost them to a counted drop, not to routing."""
    per_trace: dict[str, int] = {}
    for s in spans:
        assert s.context is not None
        key = f"{s.context.trace_id:032x}"
        per_trace[key] = per_trace.get(key, 0) + 1
    split = incomplete = 0
    for key, count in per_trace.items():
        holders = [r.rows_by_key[k] for r in reports for k in r.rows_by_key
                   if key.startswith(k)]
        if len(holders) > 1:
            split += 1
        elif sum(holders) != count:
            incomplete += 1
    return split, incomplete


def _mmr(values: Sequence[float], fmt: str = "{:,.0f}") -> str:
    return (f"{fmt.format(statistics.median(values))} "
            f"({fmt.format(min(values))}–{fmt.format(max(values))})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=6_400,
                        help="spans per burst (64 per proof; default %(default)s)")
    parser.add_argument("--rounds", type=int, default=16,
                        help="sumcheck round events per layer span (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="interleaved runs of each variant (default %(default)s)")
    parser.add_argument("--unkeyed", action="store_true",
                        help="also run 2 processes fed batches round-robin, not by trace id, "
                             "to show what the integrity check catches")
    parser.add_argument("--pre-encoded", action="store_true",
                        help="encode the requests (official encoder) before the clock starts "
                             "and send the bytes over gRPC, so the feeder does not compete "
                             "with serve for the CPUs")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    spans = contract_spans(args.spans, args.rounds)
    traces = len({s.context.trace_id for s in spans if s.context is not None})
    with tempfile.TemporaryDirectory() as d:
        idle = Serve(Path(d) / "idle.rrd")
        idle.start({**os.environ, "XDG_RUNTIME_DIR": d, "PYTHONPATH": str(ROOT)})
        time.sleep(1.0)
        idle_rss, _ = idle.stop()
    runs: dict[int, list[Run]] = {1: [], 2: []}
    for r in range(args.repeats):
        for n in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                run = run_once(n, spans, Path(d), pre_encoded=args.pre_encoded)
            runs[n].append(run)
            print(f"run {r} with {n} serve: accepted {run.accepted_rate:,.0f} spans/s, drawn "
                  f"{run.drawn_rate:,.0f} spans/s, per process "
                  + ", ".join(f"{x.drawn} drawn / {x.cpu_s:.2f} CPU s" for x in run.reports)
                  + f", lost {run.lost}, split traces {run.split_traces}, orphans {run.orphans}, "
                    f"incomplete traces {run.incomplete_traces}",
                  file=sys.stderr, flush=True)
    cpus = len(os.sched_getaffinity(0))
    print(f"\n{len(spans):,} spans ({traces} traces of 64: proof + layers with "
          f"{args.rounds} round events + verify) per burst, {args.repeats} interleaved runs "
          f"per variant, {cpus} CPU(s) shared by the serve processes and this feeder.")
    how = ("requests encoded beforehand by the official encoder, sent as bytes over gRPC"
           if args.pre_encoded else "one official OTLPSpanExporter (gRPC) per backend")
    print(f"Routing: crc32(trace id) % N, {how}: a stand-in for the collector's "
          "loadbalancing exporter (routing_key: traceID); no collector runs here.\n")
    print("| serve processes | spans/s accepted | spans/s drawn | serve CPU s per process "
          "(listening → idle) | serve CPU µs per drawn span | peak RSS per process | "
          "feeder CPU s | lost (serve's reasons) | traces split / orphan spans | "
          "traces incomplete (losses) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for n, rs in runs.items():
        per_cpu = [x.cpu_s for r in rs for x in r.reports]
        per_span = [x.cpu_s / x.drawn * 1e6 for r in rs for x in r.reports if x.drawn]
        rss = [x.peak_rss / 2**20 for r in rs for x in r.reports]
        lost = [r.lost + r.failed_exports for r in rs]
        reasons = sorted({x.reasons for r in rs for x in r.reports if x.reasons})
        print(f"| {n} | {_mmr([r.accepted_rate for r in rs])} | "
              f"{_mmr([r.drawn_rate for r in rs])} | {_mmr(per_cpu, '{:.2f}')} | "
              f"{_mmr(per_span)} | {_mmr(rss)} MB | "
              f"{_mmr([r.feeder_cpu for r in rs], '{:.2f}')} | "
              f"{_mmr(lost)}{' (' + '; '.join(reasons) + ')' if reasons else ''} | "
              f"{sum(r.split_traces for r in rs)} / {sum(r.orphans for r in rs)} | "
              f"{sum(r.incomplete_traces for r in rs)} |")
    print(f"\nPeak RSS of a serve process that received nothing (start-up): "
          f"{idle_rss / 2**20:,.0f} MB.")
    ratio = [b.drawn_rate / a.drawn_rate for a, b in zip(runs[1], runs[2], strict=True)]
    ratio_acc = [b.accepted_rate / a.accepted_rate
                 for a, b in zip(runs[1], runs[2], strict=True)]
    share = [x.drawn / r.spans for r in runs[2] for x in r.reports]
    print(f"2 processes ÷ 1, paired runs: drawn spans/s {_mmr(ratio, '{:.2f}')}×, "
          f"accepted spans/s {_mmr(ratio_acc, '{:.2f}')}×; each process drew "
          f"{min(share):.0%}–{max(share):.0%} of the spans.")
    split = sum(r.split_traces for rs in runs.values() for r in rs)
    print("Trace integrity (.rrd files read back): " + (
        "no trace drawn in more than one process." if not split else
        f"{split} traces SPLIT across processes."))
    if args.unkeyed:
        with tempfile.TemporaryDirectory() as d:
            bad = run_once(2, spans, Path(d), keyed=False)
        print(f"Without trace-id keying (batches of {UNKEYED_SPANS} spans round-robin over 2 "
              f"processes): {bad.split_traces} of {traces} traces split across the .rrd files, "
              f"{bad.orphans} spans drawn as orphans, {bad.lost} lost.")
    return 1 if split else 0


if __name__ == "__main__":
    sys.exit(main())
