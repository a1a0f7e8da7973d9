"""examples/toy_prover.py: its verifier really verifies, its size is its proof's length,
and it says where it wrote its files."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from opentelemetry import metrics, trace

from otel_proofscope import ProofTracer
from otel_proofscope.semconv import Attr

ROOT = Path(__file__).resolve().parent.parent
TOY = ROOT / "examples" / "toy_prover.py"
OFF = ProofTracer(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())


def toy() -> ModuleType:
    spec = importlib.util.spec_from_file_location("toy_prover", TOY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_toy_verifier_accepts_honest_and_rejects_forged_proofs() -> None:
    m = toy()
    table = [3, 1, 4, 1, 5, 9, 2, 6]
    proof, _ = m.prove_sum(table, OFF, b"t")
    assert m.verify_sum(table, proof, b"t") is None
    # A wrong sum with a first round that still adds up is caught later.
    g0, g1 = proof.rounds[0]
    forged = m.LayerProof((proof.claim + 1) % m.P, [((g0 + 1) % m.P, g1), *proof.rounds[1:]])
    assert m.verify_sum(table, forged, b"t") is not None
    # A tampered round fails its own check.
    bad = m.LayerProof(proof.claim, [(g0, (g1 + 1) % m.P), *proof.rounds[1:]])
    assert m.verify_sum(table, bad, b"t") == "round 0: g(0) + g(1) != claim"
    # Another table, same proof: the final evaluation differs.
    assert m.verify_sum([3, 1, 4, 1, 5, 9, 6, 2], proof, b"t") is not None
    # A proof bound to another transcript label draws other challenges.
    assert m.verify_sum(table, proof, b"other") is not None


def test_toy_reports_measured_verdict_and_size_and_its_output_path(tmp_path: Path) -> None:
    out = tmp_path / "toy"
    proc = subprocess.run([sys.executable, str(TOY), str(out)], capture_output=True,
                          text=True, timeout=120, check=True, cwd=tmp_path)
    assert f"wrote {out.resolve()}/traces.jsonl" in proc.stdout
    spans = [s for line in (out / "traces.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    root = next(s for s in spans if s["name"] == "proof")
    attrs = {a["key"]: a["value"] for a in root["attributes"]}
    assert attrs[Attr.PROOF_VERIFIED] == {"boolValue": True}
    # One u32 for each layer's claimed sum and for each evaluation of each round.
    layers = [s for s in spans if s["name"] == "proof.layer"]
    values = len(layers) + sum(2 for s in layers for _ in s["events"])
    assert int(attrs[Attr.PROOF_SIZE]["intValue"]) == 4 * values


def test_toy_output_is_ignored_by_git() -> None:
    assert "toy-out/" in (ROOT / ".gitignore").read_text().split()
