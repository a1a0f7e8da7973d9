"""Process-level faults: SIGTERM mid-proof, memory bound against a dead collector."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent("""
    import sys, time
    import otel_proofscope as ps
    t = ps.configure(out_dir=sys.argv[1], rerun="off")
    with t.tracer.proof(system="gkr"):
        with t.tracer.layer(index=0, kind="MatMul", rounds=2):
            t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
            print("ready", flush=True)
            time.sleep(60)
""")


def test_sigterm_mid_proof_flushes_within_the_bound(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(10)
    assert time.monotonic() - start < 4.0
    assert rc == 128 + signal.SIGTERM
    spans = [s for line in (tmp_path / "traces.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert sorted(s["name"] for s in spans) == ["proof", "proof.layer"]
    assert all(s["status"].get("code") == 2 for s in spans), spans  # 2 = STATUS_CODE_ERROR


MEMORY_CHILD = textwrap.dedent("""
    import os, sys, psutil
    import otel_proofscope as ps
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sys.argv[1]
    t = ps.configure(rerun="off", shutdown_timeout_s=1.0)
    tracer = t.tracer
    proc = psutil.Process()
    n = int(sys.argv[2])
    with tracer.proof(system="gkr"):
        with tracer.layer(index=0, kind="MatMul"):
            pass
        base = proc.memory_info().rss
        for i in range(n):
            with tracer.layer(index=i % 100, kind="MatMul", rounds=1):
                pass
        peak = proc.memory_info().rss
    report = t.shutdown()
    from otel_proofscope.pipeline.drops import DROPS
    print(peak - base, DROPS.total(signal="spans", sink="otlp"), flush=True)
""")


@pytest.mark.slow
def test_memory_stays_bounded_against_a_dead_collector() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    n = int(os.environ.get("PROOFSCOPE_MEMORY_TEST_SPANS", "200000"))
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, f"http://127.0.0.1:{port}",
                          str(n)], capture_output=True, text=True, timeout=600, check=True)
    growth, dropped = (int(x) for x in out.stdout.split())
    assert growth <= 64 * 2**20, f"RSS grew {growth / 2**20:.1f} MiB"
    assert dropped == n + 2  # every span of the run, nothing delivered, nothing unaccounted
