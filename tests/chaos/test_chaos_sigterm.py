"""A second SIGTERM during the bounded shutdown: the accounting completes and the
report is printed (it used to raise SystemExit inside the exit handler)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chaos.faults import child_env, drop_count, silent_listener

pytestmark = pytest.mark.chaos

PROVER = textwrap.dedent("""
    import sys, time
    import otel_proofscope as ps
    t = ps.configure(rerun="off", shutdown_timeout_s=2.0, metric_interval_s=60)
    with t.tracer.proof(system="gkr"):
        for i in range(3):
            with t.tracer.layer(index=i, kind="MatMul", rounds=1):
                t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
        print("ready", flush=True)
        time.sleep(60)
""")


def test_second_sigterm_during_shutdown_still_reports(tmp_path: Path) -> None:
    with silent_listener() as collector:  # exports hang: shutdown uses its whole bound
        env = child_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                        OTEL_EXPORTER_OTLP_PROTOCOL="grpc")
        proc = subprocess.Popen([sys.executable, "-c", PROVER], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.7)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - start
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 2.0 + 2.0, took
    assert "Traceback" not in err, err
    assert "SIGTERM during the bounded shutdown" in err
    # ground truth: 4 spans (proof + 3 layers) with 3 round events, none delivered
    lost = sum(drop_count(err, "spans", "otlp", r) for r in ("shutdown", "export_failed"))
    assert lost == 4, err
