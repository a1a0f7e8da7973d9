"""A display cap is not a loss: round bars beyond the per-layer cap are "not drawn",
never "dropped", and every round is still in the recording's claim and timing series."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("rerun")

from otel_proofscope import configure
from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import layout, readback
from otel_proofscope.semconv import DropReason

ROUNDS = layout.MAX_BARS + 36


def test_round_bars_beyond_the_cap_are_not_drawn_not_dropped(tmp_path: Path) -> None:
    rrd = tmp_path / "caps.rrd"
    dropped_before = DROPS.total()
    bars_before = sum(n for k, n in DROPS.not_drawn().items() if k.signal == "round_bars")
    telemetry = configure(out_dir=tmp_path, rerun=f"file:{rrd}",
                          set_global=False)
    with telemetry.tracer.proof(system="gkr", layers=1), \
            telemetry.tracer.layer(index=0, kind="MatMul", rounds=ROUNDS,
                                   claim_initial=(3, 0, 0, 0)):
        for r in range(ROUNDS):
            telemetry.tracer.sumcheck_round(r, [1, 2], (3, 0, 0, 0))
    report = telemetry.shutdown()
    lines = report.lines()
    assert DROPS.total() == dropped_before
    assert DROPS.total(reason=DropReason.DISPLAY_CAP) == 0
    bars = sum(n for k, n in DROPS.not_drawn().items() if k.signal == "round_bars")
    assert bars - bars_before == ROUNDS - layout.MAX_BARS
    assert "dropped: nothing" in lines
    assert (f"not drawn in rerun (display cap; every round is in the claim and timing "
            f"series): {bars} round_bars") in lines
    assert not any("round_bars → rerun" in line for line in lines)
    # Every round is in the recording's claim series, one row per round.
    rec = readback.read(rrd)
    claim = [p for p in rec.paths() if p.lstrip("/").startswith("gkr/claim/")]
    assert claim
    assert sum(len(rec.rows(p)) for p in claim) >= ROUNDS


def test_display_cap_is_documented() -> None:
    raw = (Path(__file__).resolve().parent.parent / "docs" / "rerun-view.md").read_text()
    doc = " ".join(raw.replace("**", "").replace("`", "").split())
    assert f"{layout.MAX_BARS} round bars per layer" in doc
    assert "not drawn in rerun (display cap; every round is in the claim and timing" in doc
