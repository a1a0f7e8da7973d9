"""A full disk under the .rrd: the failed write is detected and everything from the
failure onwards is counted lost with the reason, on both routes; what was confirmed
written before it is reported as exported, and the two add up to what was made."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from chaos.faults import child_env, drop_count

pytestmark = pytest.mark.chaos

SIZE = 256 * 1024
PROOFS = 1500

PROVER = textwrap.dedent("""
    import sys, time
    import otel_proofscope as ps
    t = ps.configure(out_dir=sys.argv[1], rerun=sys.argv[2],
                     shutdown_timeout_s=3, metric_interval_s=60)
    for p in range(int(sys.argv[3])):
        with t.tracer.proof(system="gkr"):
            with t.tracer.layer(index=0, kind="MatMul", rounds=2):
                t.tracer.sumcheck_round(0, poly=[1, 2], claim=3)
        if p % 10 == 9:
            t.force_flush(5)
    for line in t.shutdown().lines():
        print("R", line, flush=True)
""")


@contextlib.contextmanager
def small_disk() -> Iterator[tuple[Path, Callable[[], None] | None]]:
    """A 256 KiB tmpfs where we may mount one (root), else a file-size limit."""
    with tempfile.TemporaryDirectory() as d:
        mnt = Path(d)
        mounted = os.geteuid() == 0 and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mnt)],
            capture_output=True).returncode == 0
        try:
            if mounted:
                yield mnt, None
            else:
                def limit() -> None:
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
                    resource.setrlimit(resource.RLIMIT_FSIZE, (SIZE, SIZE))
                yield mnt, limit
        finally:
            if mounted:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_is_detected_and_counted(tmp_path: Path) -> None:
    # Drawn by the export process: configure()'s one Rerun route (issue 29).
    with small_disk() as (mnt, limit):
        rrd = mnt / "x.rrd"
        env = child_env(OTEL_TRACES_EXPORTER="rerun", OTEL_METRICS_EXPORTER="rerun")
        res = subprocess.run([sys.executable, "-c", PROVER, str(tmp_path), f"file:{rrd}",
                              str(PROOFS)], env=env, text=True, capture_output=True,
                             timeout=280, preexec_fn=limit)  # ~30 s at rest, ~4x under two CPU hogs
        size = rrd.stat().st_size
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert size <= SIZE
    assert "dropped: nothing" not in out
    exported = [line for line in res.stdout.splitlines() if line.startswith("R exported to rerun")]
    assert exported, out
    spans_ok = int(exported[0].split(": ")[1].split()[0])
    lost = drop_count(out, "spans", "rerun", "sink_unavailable")
    # the report agrees with ground truth: every span is either confirmed written or lost
    assert spans_ok + lost == 2 * PROOFS, out
    assert lost > 0
    assert "failed" in out and ("no space left on device" in out or "file writer" in out), out
