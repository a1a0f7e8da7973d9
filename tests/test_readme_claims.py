"""The commands the README presents, run as a user runs them, and the lines it quotes
checked against what they print (issue 30: docs that stay true)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

from otel_proofscope.instrumentation import ProofTracer

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
GPU_DOC = (ROOT / "docs" / "gpu.md").read_text()
TIMEOUT_S = 240


def proofscope(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    clean["PYTHONPATH"] = os.pathsep.join([str(ROOT), clean.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "otel_proofscope", *args], cwd=cwd,
                          env={**clean, **env}, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)


def test_version() -> None:
    from otel_proofscope.version import __version__

    done = proofscope("--version", cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip() == f"proofscope {__version__}"


def test_gpu_prints_the_table_row_the_docs_quote(tmp_path: Path) -> None:
    done = proofscope("gpu", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "backend  status       detail" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith("nvml "))
    assert row.split()[0] == "nvml" and row.split()[1] in ("available", "unavailable")
    if row.split()[1] == "unavailable":  # no NVIDIA driver here, as on CI
        # What the docs quote must be what a driver-less machine prints: the row.
        assert "NVML unavailable: LibraryNotFound" not in done.stdout
        assert re.sub(r"\s+", " ", row) in re.sub(r"\s+", " ", GPU_DOC)


def test_demo_summary_lines(tmp_path: Path) -> None:
    """``proofscope demo`` with small settings: every line the docs lean on is there,
    the wall time is explained, the witness events are explained on their sink's line."""
    done = proofscope("demo", "--layers", "3", "--width", "8", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "proofscope demo: verified: yes" in out
    wall = re.search(r"wall ([\d.]+) s = set-up ([\d.]+) s \(network ([\d.]+) s, telemetry "
                     r"pipeline ([\d.]+) s\) \+ proving ([\d.]+) s \+ shutdown ([\d.]+) s",
                     out)
    assert wall, out
    total, setup, _, _, proving, shutdown = (float(x) for x in wall.groups())
    assert math.isclose(total, setup + proving + shutdown, abs_tol=0.05)
    file_line = next(ln for ln in out.splitlines() if "exported to file:" in ln)
    rerun_line = next(ln for ln in out.splitlines() if "exported to rerun:" in ln)
    withheld = int(re.search(r"\+(\d+) witness events kept out of OTLP", file_line).group(1))  # type: ignore[union-attr]
    events = {name: int(re.search(r"(\d+) span events", line).group(1))  # type: ignore[union-attr]
              for name, line in (("file", file_line), ("rerun", rerun_line))}
    assert events["rerun"] == events["file"] + withheld
    # said on the sink lines, not on a line of its own
    assert not any(ln.startswith("proofscope demo: telemetry: witness") for ln in
                   out.splitlines())
    for name in ("traces.jsonl", "metrics.jsonl", "proofscope.rrd"):
        assert (tmp_path / "out" / name).exists()
    assert "open the recording: rerun out/proofscope.rrd" in out


def test_demo_without_rerun_captures_no_witness(tmp_path: Path) -> None:
    done = proofscope("demo", "--layers", "3", "--width", "8", "--out", "out", "--rerun",
                      "off", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "witness" not in done.stdout  # nothing captured: nothing withheld


def test_demo_repeat_is_one_progress_line_per_proof(tmp_path: Path) -> None:
    done = proofscope("demo", "--layers", "3", "--width", "8", "--out", "out", "--repeat",
                      "4", "--rerun", "off", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    progress = [ln for ln in done.stderr.splitlines() if ln.startswith("proofscope demo: [")]
    assert progress == [f"proofscope demo: [{3 * k}/12] proof {k}/4: verified"
                        for k in range(1, 5)]


def test_demo_against_a_dead_collector_says_it_once(tmp_path: Path, black_hole: int) -> None:
    """The summary counts what the collector never got; the OTLP exporter's own
    ``ERROR … Channel closed!`` for the export abandoned at the bound no longer follows."""
    done = proofscope("demo", "--layers", "3", "--width", "8", "--out", "out", "--rerun",
                      "off", cwd=tmp_path,
                      OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{black_hole}")
    assert done.returncode == 0, done.stderr
    assert "→ otlp" in done.stdout  # counted in the summary
    assert "ERROR opentelemetry.exporter" not in done.stderr


def test_a_nan_claim_names_the_field() -> None:
    tracer = ProofTracer(TracerProvider())
    with tracer.proof(system="gkr", layers=1), \
            pytest.raises(ValueError, match=r"^claim_initial: "), \
            tracer.layer(index=0, kind="MatMul", rounds=1, claim_initial=float("nan")):
        pass
    assert "naming the field" in README and "NaN claim" in README


def test_readme_images_come_from_the_gallery() -> None:
    gallery = (ROOT / "scripts" / "gallery").read_text()
    for image in re.findall(r"docs/images/([\w-]+)\.png", README):
        if image == "snarkjs-groth16":
            continue  # made by tests/test_snarkjs.py's prover run, not the gallery
        assert f'"{image}"' in gallery, image
