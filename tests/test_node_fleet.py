"""A fleet of real non-Python provers against ``proofscope serve`` (issue 29, decision 5):
the official OpenTelemetry JS SDK and OTLP exporters (``benchmarks/node_fleet``, pinned;
``scripts/test`` installs them), default batch processor and retries.

Why with these senders: the JS gRPC exporter never retries (its transport reports every
gRPC error as final), so serve must hold a gRPC request for room within the sender's
deadline rather than refuse it; and a batch of 200 layer spans of 128 round events is
~4.9 MB, over gRPC's own 4 MiB default cap. The in-flight budget is set to four such
requests here (the fleet sends eight at once), so requests of the fleet wait for room
(gRPC) or are told to retry (HTTP 503): every export must still succeed and every span
be drawn.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks" / "bench_node_fleet.py"
FLEET = ROOT / "benchmarks" / "node_fleet" / "node_modules" / "@opentelemetry" / "sdk-trace"


def test_every_export_of_a_node_fleet_succeeds_and_is_drawn() -> None:
    if not FLEET.is_dir():
        pytest.fail("the OpenTelemetry JS packages are missing: "
                    "npm ci --prefix benchmarks/node_fleet (scripts/test runs it)")
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--grpc", "4", "--http", "4", "--layers", "200",
         "--rounds", "128", "--serve-arg=--max-inflight-bytes=20000000"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "PASS: every export succeeded" in out, out
    assert "grpc: handed 808, exported 808, failed 0" in out, out
    assert "http: handed 808, exported 808, failed 0" in out, out
    assert "rerun: drawn 1616 spans; not drawn 0" in out, out
