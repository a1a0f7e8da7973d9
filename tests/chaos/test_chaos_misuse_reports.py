"""Issue 28 item 10: each pipeline's report counts its own losses, after misuse too.

Before: a proof made after its pipeline's shutdown() was dropped, yet a second
shutdown() said ``dropped: nothing``; a second configure()'s report then claimed that
loss as its own (``1 spans → file (shutdown)``) though its own span was in its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_proofscope.ledger import DROPS, DropKey, DropLedger
from otel_proofscope.setup import Telemetry, configure

pytestmark = pytest.mark.chaos


def _pipeline(out: Path) -> Telemetry:
    return configure(out_dir=out, set_global=False, handle_sigterm=False,
                     rerun="off")


def _proof(telemetry: Telemetry, name: str = "proof") -> None:
    with telemetry.tracer_provider.get_tracer("t").start_as_current_span(name):
        pass


def _names(path: Path) -> list[str]:
    return [s["name"] for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]]


def test_a_proof_after_shutdown_is_in_the_second_report(tmp_path: Path) -> None:
    a = _pipeline(tmp_path / "a")
    _proof(a)
    first = a.shutdown()
    assert first.dropped == 0 and first.spans_exported["file"] == 1
    _proof(a, "late")
    second = a.shutdown()
    assert second.dropped == 1
    assert "  1 spans → file (shutdown)" in second.lines()
    assert second.spans_exported["file"] == 1


def test_the_next_pipeline_does_not_claim_it(tmp_path: Path) -> None:
    a = _pipeline(tmp_path / "a")
    _proof(a)
    a.shutdown()
    _proof(a, "late-before")  # A's loss before B exists
    b = _pipeline(tmp_path / "b")
    _proof(a, "late-after")  # A's loss while B runs
    _proof(b, "b-proof")
    report_b = b.shutdown()
    assert report_b.dropped == 0, report_b.lines()
    assert report_b.spans_exported["file"] == 1
    assert "dropped: nothing" in report_b.lines()
    assert _names(tmp_path / "b" / "traces.jsonl") == ["b-proof"]
    report_a = a.shutdown()
    assert report_a.dropped == 2
    assert "  2 spans → file (shutdown)" in report_a.lines()
    # The process-wide ledger (the proofscope.dropped counter) still holds all of it.
    assert DROPS.total(signal="spans", sink="file", reason="shutdown") == 2


def test_a_pipeline_after_a_lossy_one_starts_clean(tmp_path: Path) -> None:
    DROPS.record("spans", "file", "export_failed", 7)  # an earlier pipeline's loss
    b = _pipeline(tmp_path / "b")
    _proof(b)
    report = b.shutdown()
    assert report.dropped == 0 and report.spans_exported["file"] == 1


def test_ledger_share_since_a_mark() -> None:
    ledger = DropLedger()
    ledger.record("spans", "otlp", "queue_full", 3)
    mark = ledger.mark()
    ledger.record("spans", "otlp", "queue_full", 2)
    ledger.record("spans", "file", "shutdown", 4)
    ledger.record("spans", "rerun", "display_cap", 5)
    share = ledger.since(mark, {DropKey("spans", "file", "shutdown"): 1})
    assert share.snapshot() == {DropKey("spans", "otlp", "queue_full"): 2,
                                DropKey("spans", "file", "shutdown"): 3}
    assert share.not_drawn() == {DropKey("spans", "rerun", "display_cap"): 5}
    assert ledger.total() == 9  # the ledger itself is untouched
