"""Scale-out of ``proofscope serve``: 1 process vs 2 behind the real Collector.

Run: python benchmarks/bench_serve_scale.py [--spans N --rounds R --repeats K]

A burst of contract traces (``proof`` root, ``proof.layer`` spans with R sumcheck
round events each, ``proof.verify``; 64 spans per proof, made by ``ProofTracer`` as a
prover makes them) is sent by the official ``OTLPSpanExporter`` (OTLP/gRPC, requests of
512 spans, one after the other) to the real OpenTelemetry Collector (built by
``scripts/peers``) running ``collector-config/loadbalancing.yaml`` as shipped: batches
of at most 1,024 spans routed by trace ID (``load_balancing`` exporter, static
resolver) to real ``proofscope serve`` processes, each on its own gRPC port writing its
own ``.rrd``. With 1 serve both backends of the config name the same serve (the static
resolver keeps the duplicate in its ring and builds one exporter for it), so the only
difference between the variants is the number of serve processes.

Per run, measured rather than estimated:

* spans/s accepted: spans sent ÷ (first request → last request answered by the
  Collector, which answers once its queue holds the batch);
* spans/s drawn: spans drawn (serve's own exit report, ``rerun: drawn N spans``) ÷
  (first request → every serve process and the Collector idle: their CPU time stops
  moving, sampled every 0.1 s; the time is the last sample at which one still moved);
* serve CPU seconds per process, from "listening" to idle (start-up and shutdown not
  counted), read from /proc; the Collector's the same way; peak RSS of each (``VmHWM``
  at idle, start-up included; an idle serve's is printed for reference);
* losses: spans sent − spans drawn, with serve's reasons; spans in export calls that
  failed; spans the Collector gave up on (its "Dropping data." log lines: its own
  ``otelcol_exporter_*`` metrics do not see the per-backend exporters);
* trace integrity: every ``.rrd`` is read back (``rerun.chunk.RrdReader``) and each
  trace's flame rows (one per span) are counted: no trace may appear in two files (the
  run fails if one does); a trace with fewer rows than spans lost some to a counted
  drop. serve's orphan count (spans whose parent it never received) is reported too.

Variants are interleaved (1, 2, 1, 2, …); tables give median (min–max) of the runs.
On a 2-CPU machine the serve processes, the Collector and this feeder (whose official
encoder costs about as much per span as serve does) compete for the 2 cores: the
speed-up measured there is a floor, not what 2 processes on their own cores reach.
``--pre-encoded`` takes the feeder off the clock. ``--unkeyed`` also feeds 2 serves
directly, batches alternating between them as an L4 balancer would, to show what the
integrity check catches.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_trace import contract_spans  # a sibling script, not a package
from peers import Collector, peer  # the tests' Collector on free ports

ROOT = Path(__file__).resolve().parent.parent
EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
REQUEST_SPANS = 512
POLL_S = 0.1
#: A process is busy while it gains at least this much CPU per poll (10 % of a core);
#: idle serve wakes every 0.5 s and an idle Collector every second, far below it.
BUSY_CPU_S = 0.01
QUIET_S = 1.0
#: Batch size of the --unkeyed check; not a multiple of 64, so batches cut traces.
UNKEYED_SPANS = 100
_FLAME = re.compile(r"^/trace/flame/[^/]+/([0-9a-f]{8,32})$")
_DRAWN = re.compile(r"rerun: drawn (\d+) spans?(?: \((\d+) as orphans[^)]*\))?; "
                    r"not drawn (\d+)(?: \((.*)\))?")
_ACCEPTED = re.compile(r"\bspans_accepted=(\d+)")


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss(pid: int) -> int:
    """VmHWM: the peak RSS of the process's own address space. ``wait4``'s
    ``ru_maxrss`` would also count the parent's pages a child shared before its exec."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/PID/status")


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

    def ready(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("OTLP/gRPC listening on"):
                self.endpoint = line.split()[-1]
                break
        else:
            raise RuntimeError(f"serve exited before listening (rc {self.proc.wait()})")
        self.cpu_ready = _cpu(self.proc.pid)

    def stop(self) -> tuple[int, str]:
        """SIGTERM, then (peak RSS in bytes up to now, serve's stdout after "listening")."""
        peak = _peak_rss(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        _, status, _ = os.wait4(self.proc.pid, 0)
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.stdout.close()
        return peak, out


def start_serves(rrds: Sequence[Path], env: dict[str, str]) -> list[Serve]:
    """Started together: their imports overlap instead of adding up."""
    serves = [Serve(p) for p in rrds]
    for s in serves:
        s.start(env)
    for s in serves:
        s.ready()
    return serves


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

    with warnings.catch_warnings():  # serve writes no footer by default; stream() reads it
        warnings.simplefilter("ignore")
        reader = RrdReader(rrd)
    counts: dict[str, int] = {}
    for entry in reader.recordings():
        for chunk in reader.stream(store=entry).collect().stream().to_chunks():
            m = _FLAME.match(chunk.entity_path)
            if m and not chunk.is_static:
                counts[m.group(1)] = counts.get(m.group(1), 0) + chunk.to_record_batch().num_rows
    return counts


def feed(batches: Sequence[Sequence[Sequence[ReadableSpan]]], endpoints: Sequence[str],
         encoded: Sequence[Sequence[tuple[bytes, int]]] | None = None,
         ) -> tuple[float, float, float, int]:
    """Send endpoint i its batches, one sending thread per endpoint; (start, end, feeder
    CPU s, spans in failed exports)."""
    failed = [0] * len(endpoints)
    go = threading.Barrier(len(endpoints) + 1)

    def send(i: int) -> None:
        exporter = OTLPSpanExporter(endpoint=endpoints[i], insecure=True, timeout=120)
        go.wait()
        for batch in batches[i]:
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


def wait_idle(pids: Sequence[int]) -> tuple[float, list[float]]:
    """(time the last process stopped working, each process's CPU at that moment)."""
    last = [_cpu(p) for p in pids]
    at_busy = list(last)
    busy_until = time.perf_counter()
    while time.perf_counter() - busy_until < QUIET_S:
        time.sleep(POLL_S)
        now = [_cpu(p) for p in pids]
        if any(n - p >= BUSY_CPU_S for n, p in zip(now, last, strict=True)):
            busy_until = time.perf_counter()
            at_busy = now
        last = now
    return busy_until, at_busy


def collector_dropped(collector: Collector) -> int:
    """Spans the Collector's per-backend exporters gave up on (their log lines)."""
    total = 0
    for line in collector.output().splitlines():
        if "Dropping data" in line and "{" in line:
            total += int(json.loads(line[line.index("{"):]).get("dropped_items", 0))
    return total


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
    collector_cpu: float = 0.0
    collector_rss: int = 0
    collector_dropped: int = 0

    @property
    def orphans(self) -> int:
        return sum(x.orphans for x in self.reports)


def _batches(spans: Sequence[ReadableSpan], size: int) -> list[Sequence[ReadableSpan]]:
    return [spans[k:k + size] for k in range(0, len(spans), size)]


def _encode(batches: Sequence[Sequence[ReadableSpan]]) -> list[tuple[bytes, int]]:
    return [(bytes(encode_spans(b).SerializeToString()), len(b)) for b in batches]


def _reports(serves: Sequence[Serve], stopped: Sequence[tuple[int, str]],
             cpu_idle: Sequence[float]) -> list[Report]:
    reports = []
    for s, (rss, out), cpu in zip(serves, stopped, cpu_idle, strict=True):
        accepted, drawn, orphans, not_drawn, reasons = _parse(out)
        reports.append(Report(accepted, drawn, orphans, not_drawn, reasons,
                              cpu - s.cpu_ready, rss, flame_rows(s.rrd)))
    return reports


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    return {**env, "XDG_RUNTIME_DIR": str(tmp), "PYTHONPATH": str(ROOT)}


def run_once(n: int, spans: Sequence[ReadableSpan], tmp: Path,
             encoded: Sequence[tuple[bytes, int]] | None = None) -> Run:
    """``n`` serve processes behind the Collector (loadbalancing.yaml), fed the burst
    through the official exporter, or as the requests ``encoded`` beforehand."""
    batches = _batches(spans, REQUEST_SPANS)
    serves = start_serves([tmp / f"serve-{i}.rrd" for i in range(n)], _env(tmp))
    collector: Collector | None = None
    try:
        backends = [s.endpoint for s in serves] * (2 // n)
        collector = Collector(["loadbalancing.yaml"], tmp, {
            "SERVE_BACKEND_0": backends[0], "SERVE_BACKEND_1": backends[1]})
        pid = collector.proc.pid
        cpu_ready = _cpu(pid)
        start, answered, feeder_cpu, failed = feed(
            [batches], [collector.grpc_endpoint.removeprefix("http://")],
            None if encoded is None else [encoded])
        idle_at, cpu_idle = wait_idle([s.proc.pid for s in serves] + [pid])
        collector_rss = _peak_rss(pid)
    finally:
        if collector is not None:
            collector.stop()  # first: it hands over what it still holds
        stopped = [s.stop() if s.proc.returncode is None else (0, "") for s in serves]
    dropped = collector_dropped(collector)
    reports = _reports(serves, stopped, cpu_idle[:n])
    drawn_total = sum(r.drawn for r in reports)
    return Run(n, len(spans), len(spans) / (answered - start), drawn_total / (idle_at - start),
               feeder_cpu, failed, reports, *split_count(spans, reports),
               len(spans) - drawn_total, cpu_idle[n] - cpu_ready, collector_rss, dropped)


def run_unkeyed(spans: Sequence[ReadableSpan], tmp: Path) -> Run:
    """2 serves fed directly, batches of UNKEYED_SPANS alternating between them, as an L4
    balancer spreads a collector's batches (cut without regard to traces) over
    connections."""
    routed: list[list[Sequence[ReadableSpan]]] = [[], []]
    for k, batch in enumerate(_batches(spans, UNKEYED_SPANS)):
        routed[k % 2].append(batch)
    serves = start_serves([tmp / f"serve-{i}.rrd" for i in range(2)], _env(tmp))
    try:
        start, answered, feeder_cpu, failed = feed(routed, [s.endpoint for s in serves])
        idle_at, cpu_idle = wait_idle([s.proc.pid for s in serves])
    finally:
        stopped = [s.stop() if s.proc.returncode is None else (0, "") for s in serves]
    reports = _reports(serves, stopped, cpu_idle)
    drawn_total = sum(r.drawn for r in reports)
    return Run(2, len(spans), len(spans) / (answered - start), drawn_total / (idle_at - start),
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
                        help="also feed 2 processes directly, batches round-robin rather "
                             "than by trace id, to show what the integrity check catches")
    parser.add_argument("--pre-encoded", action="store_true",
                        help="encode the requests (official encoder) before the clock starts "
                             "and send the bytes over gRPC, so the feeder does not compete "
                             "with the Collector and serve for the CPUs")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    try:
        peer("otelcol")
    except pytest.fail.Exception as exc:  # not built: the tests' helper says why
        print(f"bench_serve_scale: {exc}", file=sys.stderr)
        return 2
    spans = contract_spans(args.spans, args.rounds)
    traces = len({s.context.trace_id for s in spans if s.context is not None})
    with tempfile.TemporaryDirectory() as d:
        (idle,) = start_serves([Path(d) / "idle.rrd"], _env(Path(d)))
        time.sleep(1.0)
        idle_rss, _ = idle.stop()
    # Pre-encoded: the official encoder runs once, before any clock starts, so the
    # feeder's CPU (more per span than serve's) leaves the 2 cores to the Collector and
    # serve.
    encoded = _encode(_batches(spans, REQUEST_SPANS)) if args.pre_encoded else None
    runs: dict[int, list[Run]] = {1: [], 2: []}
    for r in range(args.repeats):
        for n in (1, 2):
            with tempfile.TemporaryDirectory() as d:
                run = run_once(n, spans, Path(d), encoded)
            runs[n].append(run)
            print(f"run {r} with {n} serve: accepted {run.accepted_rate:,.0f} spans/s, drawn "
                  f"{run.drawn_rate:,.0f} spans/s, per process "
                  + ", ".join(f"{x.drawn} drawn / {x.cpu_s:.2f} CPU s" for x in run.reports)
                  + f", Collector {run.collector_cpu:.2f} CPU s, lost {run.lost}, split "
                    f"traces {run.split_traces}, orphans {run.orphans}, incomplete traces "
                    f"{run.incomplete_traces}",
                  file=sys.stderr, flush=True)
    cpus = len(os.sched_getaffinity(0))
    print(f"\n{len(spans):,} spans ({traces} traces of 64: proof + layers with "
          f"{args.rounds} round events + verify) per burst, {args.repeats} interleaved runs "
          f"per variant, {cpus} CPU(s) shared by the serve processes, the Collector and "
          "this feeder.")
    how = ("requests encoded beforehand by the official encoder, sent as bytes over gRPC"
           if args.pre_encoded else "one official OTLPSpanExporter (gRPC)")
    print(f"Feeder: {how} → the Collector (collector-config/loadbalancing.yaml, "
          "load_balancing routing_key: traceID) → 1 or 2 serve processes.\n")
    print("| serve processes | spans/s accepted | spans/s drawn | serve CPU s per process "
          "(listening → idle) | serve CPU µs per drawn span | peak RSS per process | "
          "Collector CPU s | Collector peak RSS | feeder CPU s | lost (serve's reasons) | "
          "traces split / orphan spans | traces incomplete (losses) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, rs in runs.items():
        per_cpu = [x.cpu_s for r in rs for x in r.reports]
        per_span = [x.cpu_s / x.drawn * 1e6 for r in rs for x in r.reports if x.drawn]
        rss = [x.peak_rss / 2**20 for r in rs for x in r.reports]
        lost = [r.lost + r.failed_exports for r in rs]
        reasons = sorted({x.reasons for r in rs for x in r.reports if x.reasons})
        print(f"| {n} | {_mmr([r.accepted_rate for r in rs])} | "
              f"{_mmr([r.drawn_rate for r in rs])} | {_mmr(per_cpu, '{:.2f}')} | "
              f"{_mmr(per_span)} | {_mmr(rss)} MB | "
              f"{_mmr([r.collector_cpu for r in rs], '{:.2f}')} | "
              f"{_mmr([r.collector_rss / 2**20 for r in rs])} MB | "
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
    dropped = sum(r.collector_dropped for rs in runs.values() for r in rs)
    print(f"Spans the Collector gave up on (its log): {dropped}.")
    split = sum(r.split_traces for rs in runs.values() for r in rs)
    print("Trace integrity (.rrd files read back): " + (
        "no trace drawn in more than one process." if not split else
        f"{split} traces SPLIT across processes."))
    if args.unkeyed:
        with tempfile.TemporaryDirectory() as d:
            bad = run_unkeyed(spans, Path(d))
        print(f"Without trace-id keying (no Collector; batches of {UNKEYED_SPANS} spans "
              f"round-robin over 2 processes): {bad.split_traces} of {traces} traces split "
              f"across the .rrd files, {bad.orphans} spans drawn as orphans, {bad.lost} lost.")
    return 1 if split else 0


if __name__ == "__main__":
    sys.exit(main())
