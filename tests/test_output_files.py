"""Output files of a CLI run: replaced per run (JSON lines and recording alike)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _trace_ids(path: Path) -> set[str]:
    return {s["traceId"] for line in path.read_text().splitlines()
            for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
            for s in ss["spans"]}


def test_second_demo_run_replaces_the_first_runs_files(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    seen = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", "--out",
                               str(tmp_path), "--layers", "2", "--width", "8", "--rerun",
                               "off"], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        ids = _trace_ids(tmp_path / "traces.jsonl")
        assert len(ids) == 1, ids  # one proof: this run's, not the last run's too
        seen.append(ids)
        metrics = (tmp_path / "metrics.jsonl").read_text()
        assert metrics
    assert seen[0] != seen[1]


def test_output_behaviour_is_documented() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "writes its files afresh in `--out`" in readme
