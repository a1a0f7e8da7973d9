"""The demo network is really quantized: no activation wraps mod p, and the statistics
and heatmaps in its telemetry are the values the circuit computes.

The reference here is the network run in exact integer arithmetic (Python ints, no
modulus), written in this test from the public weights; the circuit's field values must
be exactly those integers, for every layer of the default demo (8×32) and of a 16×512
demo. The interval proof of :mod:`otel_proofscope.demo.ranges` must bound them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from otel_proofscope.demo import ranges
from otel_proofscope.demo.circuit import Network, build_network
from otel_proofscope.demo.field import P
from otel_proofscope.semconv import LayerKind

SHAPES = [(8, 32), (16, 512)]


def centered(values: np.ndarray) -> np.ndarray:  # type: ignore[type-arg]
    v = values.astype(np.int64)
    return np.where(v > P // 2, v - P, v).astype(object)


def integer_forward(net: Network) -> list[np.ndarray]:  # type: ignore[type-arg]
    """The network over the integers: what a quantized network computes, no wrapping."""
    acts = [centered(net.input)]
    for layer in net.layers:
        x = acts[-1]
        w = None if layer.weight is None else centered(layer.weight)
        if layer.kind is LayerKind.MATMUL:
            y = x.dot(w)
        elif layer.kind is LayerKind.ATTENTION:
            y = w.dot(x)  # type: ignore[union-attr]
        elif layer.kind is LayerKind.ADD:
            y = x + w[np.newaxis, :]  # type: ignore[index]
        elif layer.kind is LayerKind.MUL:
            y = x * w[np.newaxis, :]  # type: ignore[index]
        else:
            y = x * x
        acts.append(y)
    return acts


@pytest.mark.parametrize(("layers", "width"), SHAPES, ids=["8x32", "16x512"])
def test_no_activation_wraps(layers: int, width: int) -> None:
    net = build_network(layers, width)
    exact = integer_forward(net)
    field = net.forward()
    bounds = ranges.network_bounds(net)
    assert ranges.first_wrap(net) is None
    assert len(bounds) == layers
    for i, (ints, elems, (lo, hi)) in enumerate(zip(exact[1:], field[1:], bounds,
                                                    strict=True)):
        assert (centered(elems) == ints).all(), f"layer {i} wraps mod p"
        assert (ints >= lo).all() and (ints <= hi).all(), f"layer {i} outside its proof"
        assert max(abs(int(v)) for v in ints.reshape(-1)) <= ranges.LIMIT
    # Not a constant network: every layer has non-zero values, and both signs occur.
    for i, ints in enumerate(exact[1:]):
        assert any(v != 0 for v in ints.reshape(-1)), f"layer {i} is all zero"
    every = {int(v) for ints in exact[1:] for v in ints.reshape(-1)}
    assert min(every) < 0 < max(every)


def test_interval_proof_catches_a_wrapping_network() -> None:
    """The range proof is not vacuous: weights that grow values make it fail."""
    net = build_network(8, 32)
    for mm in (layer for layer in net.layers if layer.kind is LayerKind.MATMUL):
        mm.weight = np.full_like(mm.weight, 3)  # type: ignore[arg-type]
    # 32·3 → 97 after the bias → 9409 squared → 32·3·9409 → … → ≈ 8·10^11 at layer 7
    problem = ranges.first_wrap(net)
    assert problem is not None and problem.startswith("layer 7 (Activation)"), problem


def _values(items: list[dict[str, Any]]) -> dict[str, Any]:
    def val(v: dict[str, Any]) -> Any:
        if "arrayValue" in v:
            return [val(x) for x in v["arrayValue"].get("values", [])]
        if "intValue" in v:
            return int(v["intValue"])
        return next(v[k] for k in ("stringValue", "boolValue", "doubleValue") if k in v)
    return {a["key"]: val(a["value"]) for a in items}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    runtime = Path(env.get("TMPDIR", "/tmp")) / f"proofscope-xdg-{os.getuid()}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env["PROOFSCOPE_EXPORT_WITNESS"] = "1"
    return env


@pytest.mark.parametrize(("layers", "width"), SHAPES, ids=["8x32", "16x512"])
def test_statistics_and_heatmaps_are_the_circuit_values(tmp_path: Path, layers: int,
                                                        width: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", "--out",
                           str(tmp_path), "--layers", str(layers), "--width", str(width),
                           "--rerun", "off"], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    net = build_network(layers, width)
    exact = integer_forward(net)
    stats: dict[int, dict[str, Any]] = {}
    heatmaps: dict[int, dict[str, Any]] = {}
    for line in (tmp_path / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    for e in s.get("events", []):
                        attrs = _values(e.get("attributes", []))
                        if e["name"] == "proof.layer.activation":
                            stats[attrs["proof.layer.index"]] = attrs
                        elif e["name"] == "proof.attention.heatmap":
                            heatmaps[attrs["proof.layer.index"]] = attrs
    assert sorted(stats) == list(range(layers))
    for i, attrs in stats.items():
        out = np.array(exact[i + 1].reshape(-1).tolist(), dtype=np.float64)
        assert attrs["proof.activation.min"] == out.min()
        assert attrs["proof.activation.max"] == out.max()
        assert attrs["proof.activation.mean"] == pytest.approx(out.mean(), rel=1e-12, abs=0)
        assert attrs["proof.activation.std_dev"] == pytest.approx(out.std(), rel=1e-12,
                                                                  abs=1e-15)
        assert attrs["proof.activation.sparsity"] == np.mean(out == 0)
        assert attrs["proof.activation.sample"] == out[:16].tolist()
    attention = [layer for layer in net.layers if layer.kind is LayerKind.ATTENTION]
    assert sorted(heatmaps) == [layer.index for layer in attention]
    for layer in attention:
        scores = np.array(heatmaps[layer.index]["proof.attention.scores"])
        side = heatmaps[layer.index]["proof.attention.seq_len"]
        matrix = scores.reshape(side, side)
        # The drawn matrix is the one the circuit multiplies by: A·X is the layer output.
        x, y = exact[layer.index], exact[layer.index + 1]
        assert (np.array(matrix.astype(np.int64).tolist(), dtype=object).dot(x) == y).all()
        assert (matrix == np.array(centered(layer.weight).tolist(),  # type: ignore[arg-type]
                                   dtype=np.float64)).all()
