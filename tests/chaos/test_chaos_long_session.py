"""Issue 28 item 11: serve's memory over a long session. Many distinct single-span
traces from 2,000 services: the trace view's per-trace state is bounded (serve's
``--max-trace-spans``; the oldest traces are forgotten, and the exit summary says how
many), and serve's recording is written without Rerun's footer, whose index of every
chunk the SDK holds in memory until the file closes (~8 KB a trace here), so serve's
memory plateaus instead of growing with every trace (80,000 traces: RSS 117 -> 415 MB
before, no plateau)."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import itertools
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from serve_helpers import proc_status, read_until, settle

from otel_proofscope.cli.serve_cmd import _exporters, trace_view_line
from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.rerun import readback
from otel_proofscope.rerun.translate_trace import LOGS, MAX_LOG_SERVICES

pytestmark = pytest.mark.chaos
pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

BOUND = 1_000
PER_REQUEST = 200
REQUESTS = 25  # 5,000 traces, 2,000 services
SERVICES = 2_000
SERVICE_PARTS = {f"svc-{n}" for n in range(SERVICES)} | {"_other"}


def _body(k: int) -> bytes:
    req = ExportTraceServiceRequest()
    for j in range(PER_REQUEST):
        n = k * PER_REQUEST + j
        rs = req.resource_spans.add()
        attr = rs.resource.attributes.add()
        attr.key = "service.name"
        attr.value.string_value = f"svc-{n % SERVICES}"
        s = rs.scope_spans.add().spans.add()
        s.trace_id = (n + 1 << 64 | 0xABCDEF).to_bytes(16, "big")
        s.span_id = (n + 1).to_bytes(8, "big")
        s.name = "work"
        s.start_time_unix_nano = 1_700_000_000_000_000_000 + n * 1000
        s.end_time_unix_nano = s.start_time_unix_nano + 500
    return bytes(req.SerializeToString())


def _rss() -> int:
    """Resident memory the process holds, after glibc has returned what it caches of
    freed memory (with two CPU hogs one run read 252 MB before the trim, 231 after; a
    failing run read 278 -> 350 MB untrimmed); the bound is on what is kept."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return proc_status(os.getpid(), "VmRSS")


def _post(url: str, body: bytes, tries: int) -> None:
    """POST one OTLP/HTTP request; a busy receiver answers 503: retry, bounded."""
    for _ in range(tries):
        try:
            request = urllib.request.Request(
                url, data=body, headers={"Content-Type": "application/x-protobuf"})
            urllib.request.urlopen(request, timeout=30).read()
            return
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
            time.sleep(0.1)
    raise AssertionError(f"{url}: still 503 after {tries} tries")


def test_a_long_session_of_distinct_traces_plateaus(tmp_path: Path) -> None:
    spans, metrics = _exporters(f"file:{tmp_path}/long.rrd", BOUND)
    translator = spans[0].sink.trace
    receiver = OtlpReceiver(spans, metrics, grpc_port=None, http_port=0).start()
    sizes: list[int] = []
    rss: list[int] = []
    try:
        url = f"{receiver.http_endpoint}/v1/traces"
        for k in range(REQUESTS):
            _post(url, _body(k), 200)
            if k in (REQUESTS // 2, REQUESTS - 1):
                assert spans[0].force_flush(60_000)
                gc.collect()
                sizes.append(len(translator._traces))
                rss.append(_rss())
        line = trace_view_line(spans)
    finally:
        receiver.stop()
    assert receiver.stats()["spans_accepted"] == REQUESTS * PER_REQUEST
    # the bounded structure: at most BOUND traces remembered, at both points
    assert all(n <= BOUND + 1 for n in sizes), sizes
    assert line is not None and f"{sizes[-1]} traces remembered" in line
    assert f"{REQUESTS * PER_REQUEST - sizes[-1]} older ones forgotten" in line, line
    # and the process's growth is bounded (a short session, in one process with the
    # rest of the suite: generous slack; the plateau is measured on the real CLI below)
    assert rss[-1] - rss[0] < 64 << 20, [r >> 20 for r in rss]
    # The Rerun SDK keeps native memory for every entity path it has seen (~2.4 KB
    # each): the span log's rows share one entity per service, never one per trace,
    # and every span still has its row (as the viewer reads the file).
    spans[0].shutdown()
    rec = readback.read(tmp_path / "long.rrd")
    logs = [p for p in rec.paths() if p.startswith(f"/{LOGS}/")]
    assert len(logs) <= MAX_LOG_SERVICES + 1, len(logs)
    assert all(p.removeprefix(f"/{LOGS}/") in SERVICE_PARTS for p in logs), logs[:3]
    assert sum(len(rec.rows(p)) for p in logs) == REQUESTS * PER_REQUEST


#: Requests of the real CLI's session: 40,000 traces; RSS read at 16,000 (past the
#: early growth of the heap and of the bounded maps) and every 8,000 after.
CLI_REQUESTS = 200
CLI_MEASURED_AT = (79, 119, 159, 199)


@pytest.mark.parametrize("footer", [False, pytest.param(True, marks=pytest.mark.xfail(
    strict=True, reason="with --rrd-footer the SDK keeps a chunk index that grows with "
                        "every trace until serve exits"))])
def test_serve_memory_plateaus_over_a_long_session(tmp_path: Path, footer: bool) -> None:
    """The real ``proofscope serve``, its RSS from /proc: past 16,000 single-span
    traces, a stretch of 8,000 costs under 2 KB a trace (the median of three stretches:
    one can hold a one-off jump of the allocator's, +50 MiB once in six quiet runs,
    which a slope is not). Measured here, 16,000 -> 40,000 traces: +14 MiB in all
    without a footer (0.6 KB a trace), +148 MiB with one (6 KB a trace, stretches of
    33-76 MiB); benchmarks/bench_serve_attacks.py session session-footer gives the
    longer picture."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "off",
         "--http-port", "0", "--rerun", f"file:{tmp_path}/long.rrd",
         "--max-trace-spans", str(BOUND),  # full after 1,000 traces: then the plateau
         *(["--rrd-footer"] if footer else [])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        cwd=tmp_path)
    lines: list[str] = []
    rss: list[int] = []
    try:
        url = read_until(proc, "OTLP/HTTP listening on", lines).split()[-1]
        read_until(proc, "Rerun:", lines)
        banner = lines[-1]
        assert ("with a footer" in banner) == footer, banner
        for k in range(CLI_REQUESTS):
            _post(f"{url}/v1/traces", _body(k), 600)
            if k in CLI_MEASURED_AT:
                settle(proc.pid)  # drawn: the queue's backlog is not the plateau
                rss.append(proc_status(proc.pid, "VmRSS"))
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    summary = "".join(lines) + out
    assert proc.returncode == 0, summary
    assert f"spans_accepted={CLI_REQUESTS * PER_REQUEST}" in summary, summary
    stretches = sorted(b - a for a, b in itertools.pairwise(rss))
    assert len(stretches) == 3
    assert stretches[1] < 16 << 20, [r >> 20 for r in rss]
