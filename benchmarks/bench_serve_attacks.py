"""`proofscope serve` under issue 28's attacks, as figures: median (range) of N runs.

Each run starts the real CLI in a child process (``--rerun file:`` in a temporary
folder, no token) and measures it from /proc:

* ``dos``: 4 staggered clients declare ``Content-Encoding: gzip`` and
  ``Content-Length: 4194304``, drip one byte a second and reconnect when cut off; while
  they do, the official OTLP exporters (HTTP and gRPC, 10 s timeout) export 3 spans
  each, one a second. Reported: exports that succeeded (of 6), the slowest one.
* ``tiny``: 4 concurrent 4 MB gRPC requests of 80,000 minimal spans (the OTLP
  exporters' 10 s timeout; ``--tiny-spans 320000``: 16 MB requests, serve's cap).
  Reported: peak RSS over idle, spans accepted, spans the senders were told were not
  taken, spans dropped after an OK (``rerun (queue_full)``).
* ``session``: single-span traces from 2,000 services over OTLP/HTTP, 200 a request.
  Reported: RSS at a third, two thirds and the end of the session.
* ``session-footer``: the same with ``serve --rrd-footer`` (the Rerun SDK then holds the
  file's chunk index in memory until serve exits).

    python benchmarks/bench_serve_attacks.py dos tiny session session-footer --runs 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
MB = 1 << 20


def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class Serve:
    def __init__(self, *extra: str) -> None:
        self.dir = tempfile.TemporaryDirectory()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
        env["XDG_RUNTIME_DIR"] = self.dir.name
        # BENCH_RERUN=off: the receiver alone, to tell its memory from the drawing's.
        rerun = os.environ.get("BENCH_RERUN") or f"file:{self.dir.name}/b.rrd"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
             "--http-port", "0", "--rerun", rerun, *extra],
            # cwd: ``-m`` puts the working directory ahead of PYTHONPATH.
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            cwd=self.dir.name)
        assert self.proc.stdout is not None
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("OTLP/gRPC"):
                self.grpc = line.split()[-1]
            if line.startswith("OTLP/HTTP"):
                self.http = line.split()[-1]
            if line.startswith("Rerun:"):
                break
        time.sleep(0.5)
        self.idle = _status(self.proc.pid, "VmRSS")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        self.proc.wait(120)
        self.dir.cleanup()
        return "".join(self.lines) + out


# ── dos ──────────────────────────────────────────────────────────────────────────────

def _dripper(port: int, stop: threading.Event, delay: float) -> None:
    if stop.wait(delay):
        return
    while not stop.is_set():
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: "
                      b"application/x-protobuf\r\nContent-Encoding: gzip\r\n"
                      b"Content-Length: 4194304\r\n\r\n\x1f")
            s.settimeout(1.0)
            while not stop.is_set():
                try:
                    if s.recv(4096) == b"":
                        break
                except TimeoutError:
                    s.sendall(b"\x8b")
                except OSError:
                    break


def _finished_span(name: str) -> object:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(memory))
    with tp.get_tracer("legit").start_as_current_span(name):
        pass
    return memory.get_finished_spans()[0]


def dos() -> dict[str, float]:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as G
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as H
    from opentelemetry.sdk.trace.export import SpanExportResult

    serve = Serve()
    port = int(serve.http.rsplit(":", 1)[1])
    stop = threading.Event()
    threads = [threading.Thread(target=_dripper, args=(port, stop, i * 2.5), daemon=True)
               for i in range(4)]
    for t in threads:
        t.start()
    time.sleep(11)  # every attacker in, the first ones already cut off and back
    ok = 0
    slowest = 0.0
    for i in range(3):
        for exporter in (G(endpoint=serve.grpc, insecure=True, timeout=10),
                         H(endpoint=f"{serve.http}/v1/traces", timeout=10)):
            span = _finished_span(f"legit{i}")
            start = time.monotonic()
            ok += exporter.export([span]) is SpanExportResult.SUCCESS  # type: ignore[list-item]
            slowest = max(slowest, time.monotonic() - start)
            exporter.shutdown()
        time.sleep(1)
    stop.set()
    serve.stop()
    return {"exports ok (of 6)": ok, "slowest export s": slowest}


# ── tiny ─────────────────────────────────────────────────────────────────────────────

def _tiny_request(seed: int, spans: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(1, spans + 1):
        s = ss.spans.add()
        s.trace_id = (seed << 64 | (i // 100 + 1)).to_bytes(16, "big")
        s.span_id = i.to_bytes(8, "big")
        s.name = "s"
        s.start_time_unix_nano = 1_700_000_000_000_000_000 + i
        s.end_time_unix_nano = s.start_time_unix_nano + 1000
    return bytes(req.SerializeToString())


def tiny(spans: int = 80_000) -> dict[str, float]:
    bodies = [_tiny_request(k + 1, spans) for k in range(4)]
    serve = Serve()
    channel = grpc.insecure_channel(serve.grpc)
    export = channel.unary_unary(EXPORT)
    told = [0]
    codes: list[str] = []
    lock = threading.Lock()

    def send(body: bytes) -> None:
        try:
            raw = export(body, timeout=10)
            n = ExportTraceServiceResponse.FromString(raw).partial_success.rejected_spans
            code = "OK"
        except grpc.RpcError as exc:
            n = 0  # refused whole: nothing accepted, nothing to tell
            code = exc.code().name
        with lock:
            told[0] += n
            codes.append(code)

    threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    channel.close()
    peak = _status(serve.proc.pid, "VmHWM")
    idle = serve.idle
    summary = serve.stop()
    accepted = re.search(r"spans_accepted=(\d+)", summary)
    dropped = re.search(r"(\d+) spans → rerun \(queue_full\)", summary)
    return {"peak RSS over idle MB": (peak - idle) / MB,
            "spans accepted": int(accepted.group(1)) if accepted else 0,
            "told not taken": told[0],
            "answered OK": codes.count("OK"),
            "refused whole (UNAVAILABLE)": codes.count("UNAVAILABLE"),
            "refused over budget (RESOURCE_EXHAUSTED)": codes.count("RESOURCE_EXHAUSTED"),
            "answered late (DEADLINE_EXCEEDED)": codes.count("DEADLINE_EXCEEDED"),
            "dropped after OK": int(dropped.group(1)) if dropped else 0}


# ── session ──────────────────────────────────────────────────────────────────────────

def _session_body(k: int, per: int) -> bytes:
    req = ExportTraceServiceRequest()
    for j in range(per):
        n = k * per + j
        rs = req.resource_spans.add()
        a = rs.resource.attributes.add()
        a.key = "service.name"
        a.value.string_value = f"svc-{n % 2000}"
        s = rs.scope_spans.add().spans.add()
        s.trace_id = (n + 1 << 64 | 0xABCDEF).to_bytes(16, "big")
        s.span_id = (n + 1).to_bytes(8, "big")
        s.name = "work"
        s.start_time_unix_nano = 1_700_000_000_000_000_000 + n * 1000
        s.end_time_unix_nano = s.start_time_unix_nano + 500
    return bytes(req.SerializeToString())


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _settle(pid: int, limit_s: float = 60.0) -> None:
    """Wait until serve has drawn what it queued: under 5 % of a CPU for 1 s."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        before = _cpu_s(pid)
        time.sleep(1.0)
        if _cpu_s(pid) - before < 0.05:
            return


def session(traces: int, *extra: str) -> dict[str, float]:
    per = 200
    serve = Serve(*extra)
    out: dict[str, float] = {"idle RSS MB": serve.idle / MB}
    requests = traces // per
    for k in range(requests):
        body = _session_body(k, per)
        while True:
            try:
                req = urllib.request.Request(f"{serve.http}/v1/traces", data=body,
                                             headers={"Content-Type": "application/x-protobuf"})
                urllib.request.urlopen(req, timeout=30).read()
                break
            except urllib.error.HTTPError:
                time.sleep(0.1)
        for part in (1, 2, 3):
            if k + 1 == requests * part // 3:
                _settle(serve.proc.pid)  # drawn: the queue's backlog is not counted
                out[f"RSS MB at {(k + 1) * per} traces"] = _status(serve.proc.pid,
                                                                   "VmRSS") / MB
    serve.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", choices=("dos", "tiny", "session", "session-footer"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--traces", type=int, default=24_000, help="session length")
    ap.add_argument("--tiny-spans", type=int, default=80_000,
                    help="minimal spans per tiny request (80,000: ~4 MB; 320,000: ~16 MB, "
                         "serve's default cap)")
    args = ap.parse_args()
    cases: dict[str, Callable[[], dict[str, float]]] = {
        "dos": dos, "tiny": lambda: tiny(args.tiny_spans), "session": lambda: session(args.traces),
        "session-footer": lambda: session(args.traces, "--rrd-footer")}
    results: dict[str, list[dict[str, float]]] = {c: [] for c in args.cases}
    for run in range(args.runs):  # interleaved: load drifts hit every case alike
        for case in args.cases:
            got = cases[case]()
            results[case].append(got)
            print(f"run {run + 1} {case}: {got}", flush=True)
    for case, runs in results.items():
        print(f"\n{case} (median, range of {len(runs)} runs):")
        for key in runs[0]:
            values = [r[key] for r in runs]
            print(f"  {key}: {statistics.median(values):.4g} "
                  f"({min(values):.4g}–{max(values):.4g})")


if __name__ == "__main__":
    main()
