"""A metric sink that hangs through the shutdown must not leave the Rerun sink open
past the report: what Rerun still holds is counted, not reported as exported."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chaos.faults import silent_listener
from otel_proofscope.ledger import DROPS
from otel_proofscope.setup import Telemetry, configure

pytestmark = pytest.mark.chaos


def _behind_a_hung_metric_sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, port: int, *,
                               traces: str, shutdown_timeout_s: float,
                               metric_interval_s: float, rerun: str | None = None
                               ) -> Telemetry:
    """configure() with OTLP metrics to a collector that never answers, shut down before
    the Rerun metric sink, and Rerun (drawn by the export process) to a file."""
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", traces)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp,rerun")  # OTLP shuts down first
    return configure(out_dir=tmp_path, set_global=False,
                     rerun=rerun or f"file:{tmp_path / 'r.rrd'}",
                     shutdown_timeout_s=shutdown_timeout_s,
                     metric_interval_s=metric_interval_s)



def test_rerun_queue_is_counted_when_a_metric_sink_hangs(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # The Rerun view is drawn by the export process (configure()'s one Rerun route,
    # issue 29), to a viewer that accepts and never answers: Rerun is stuck there, not
    # in a patched thread of this process.
    with silent_listener() as collector, silent_listener() as viewer:
        t = _behind_a_hung_metric_sink(
            tmp_path, monkeypatch, collector.port, traces="rerun", shutdown_timeout_s=2.0,
            metric_interval_s=60, rerun=f"rerun+http://127.0.0.1:{viewer.port}/proxy")
        made = 0
        for _ in range(3):
            with t.tracer.proof(system="gkr"), t.tracer.layer(index=0, kind="MatMul"):
                pass
            made += 2
            t.force_flush(1)
        report = t.shutdown()
    lost = DROPS.total(signal="spans", sink="rerun")
    assert report.spans_exported["rerun"] + lost == made, (report.lines(), DROPS.snapshot())
    assert lost > 0


def test_a_hung_metric_sink_leaves_no_reader_ticking_after_the_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The meter provider shuts its readers down one after another: behind an OTLP
    metric sink that hangs, the Rerun reader was never shut down and went on ticking
    after the report, counting its points lost again at every tick (this leaked into
    later tests' ledgers)."""
    with silent_listener() as collector:
        t = _behind_a_hung_metric_sink(tmp_path, monkeypatch, collector.port, traces="none",
                                       shutdown_timeout_s=1.0, metric_interval_s=0.2)
        with t.tracer.proof(system="gkr"), t.tracer.layer(index=0, kind="MatMul"):
            pass
        report = t.shutdown()
        after_report = DROPS.snapshot()
        time.sleep(1.0)  # five of the reader's intervals
        assert DROPS.snapshot() == after_report, report.lines()
