"""Issue 28 item 12: `proofscope diff` never passes a run without proofs, and never reads
without bound.

Before: a candidate whose only span was named ``other`` against a 6-proof base exited 0
("nothing slower", ``(1 proofs)``), so a CI gate passed a prover that proved nothing;
``diff base /dev/zero`` grew from 634 MB to 4 GB RSS in 8 s looking for a newline."""

from __future__ import annotations

import io
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_diff import _env

from otel_proofscope.diff import files
from otel_proofscope.semconv import SpanName

pytestmark = pytest.mark.chaos


def _write(path: Path, proofs: int, *, only: str | None = None) -> Path:
    """``proofs`` contract proofs (a proof span over three layers), or, with ``only``,
    a single span of that name."""
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter

    provider = TracerProvider(resource=Resource.create({"service.name": "prover"}))
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesSpanExporter(path)))
    tracer = provider.get_tracer("t")
    t = 1_700_000_000_000_000_000
    if only is not None:
        tracer.start_span(only, start_time=t).end(end_time=t + 10**6)
    for _ in range(proofs):
        root = tracer.start_span(SpanName.PROOF, start_time=t)
        ctx = otel_trace.set_span_in_context(root)
        for _layer in range(3):
            span = tracer.start_span(SpanName.LAYER, context=ctx, start_time=t)
            t += 2_000_000
            span.end(end_time=t)
        root.end(end_time=t)
        t += 1_000_000
    provider.shutdown()
    return path


def _diff(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_proofscope", "diff", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.mark.parametrize("empty_side", ["candidate", "base"])
def test_a_run_without_proofs_exits_2(tmp_path: Path, empty_side: str) -> None:
    proofs = _write(tmp_path / "proofs.jsonl", 6)
    other = _write(tmp_path / "other.jsonl", 0, only="other")
    args = (str(proofs), str(other)) if empty_side == "candidate" else (str(other), str(proofs))
    proc = _diff(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{empty_side} {other} holds no proofs" in proc.stderr
    assert "'other'" in proc.stderr and "holds 6" in proc.stderr


def test_runs_with_nothing_in_common_exit_2(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", 0, only="alpha")
    b = _write(tmp_path / "b.jsonl", 0, only="beta")
    proc = _diff(str(a), str(b))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no group in common" in proc.stderr


def test_two_proof_runs_still_compare(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", 6)
    b = _write(tmp_path / "b.jsonl", 6)
    proc = _diff(str(a), str(b), "--min-samples", "5")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dev_zero_is_refused_within_a_bounded_read(tmp_path: Path) -> None:
    base = _write(tmp_path / "a.jsonl", 6)
    start = time.monotonic()
    proc = _diff(str(base), "/dev/zero", timeout=120)
    elapsed = time.monotonic() - start
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "/dev/zero:1: a line longer than 64 MiB" in proc.stderr
    # The cap is one 64 MiB line (the read buffer and its bytes object) over the
    # interpreter with numpy and the OTLP codec loaded: 185 MB measured (the peak of
    # every child this process waited for); before the fix: 4 GB in 8 s, no bound.
    assert peak_mb < 600, peak_mb
    assert elapsed < 60


def test_line_and_input_caps_name_the_file_and_line() -> None:
    data = io.BytesIO(b"short\n" + b"x" * 100 + b"\nmore\n")
    lines = files.bounded_lines(data, "f.jsonl", max_line=50)
    assert next(lines) == b"short\n"
    with pytest.raises(files.InputError, match=r"f\.jsonl:2: a line longer than 50 bytes"):
        next(lines)
    data = io.BytesIO(b"line\n" * 100)
    with pytest.raises(files.InputError, match=r"f\.jsonl: longer than 200 bytes.*line 41"):
        list(files.bounded_lines(data, "f.jsonl", max_total=200))
