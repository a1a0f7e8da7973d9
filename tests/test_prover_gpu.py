"""The wgpu path of the reference prover agrees with the CPU path, bit for bit.

Runs on Mesa lavapipe here (Vulkan on the CPU). The GPU kernel module is part of the
package: if it is missing, that is a packaging regression and these tests fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.demo.circuit import build_network
from otel_proofscope.demo.field import P, m31_matmul
from otel_proofscope.demo.mle import eq_table
from otel_proofscope.demo.prover import prove
from otel_proofscope.demo.transcript import Transcript
from otel_proofscope.demo_runner import DemoOptions, run_demo
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import Attr, EventName, LayerKind, SpanName

OFF = ProofTracer(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    runtime = tmp_path_factory.mktemp("xdg")
    runtime.chmod(0o700)
    os.environ.setdefault("XDG_RUNTIME_DIR", str(runtime))
    from otel_proofscope.demo.gpu_kernels import WgpuMatmul

    yield WgpuMatmul(meter_provider=metrics.NoOpMeterProvider(), fallback_to_cpu=False)


@pytest.mark.parametrize("shape", [(4, 16, 16), (16, 64, 32), (4, 8, 64), (3, 5, 7)])
def test_gpu_matmul_matches_cpu(gpu: Any, shape: tuple[int, int, int]) -> None:
    n, k, m = shape
    rng = np.random.default_rng(n * k * m)
    a = rng.integers(0, P, size=(n, k)).astype(np.uint64)
    b = rng.integers(0, P, size=(k, m)).astype(np.uint64)
    a[0, :] = P - 1  # largest residues: the limb arithmetic's worst case
    np.testing.assert_array_equal(gpu.matmul_m31(a, b), m31_matmul(a, b))


def test_gpu_folds_qm31_rows_like_cpu(gpu: Any) -> None:
    """The prover's MatMul fold eq(r_row)ᵀ·X: a (4, n) limb matrix times M31 X."""
    point = Transcript().challenges(5)
    x = np.random.default_rng(3).integers(0, P, size=(32, 16)).astype(np.uint64)
    eq = eq_table(point)
    np.testing.assert_array_equal(gpu.matmul_m31(eq, x), m31_matmul(eq, x))


def test_gpu_proof_is_byte_identical_to_cpu_proof(gpu: Any) -> None:
    net = build_network(layers=6, width=16, seed=5)
    cpu = prove(net, tracer=OFF)
    wgpu = prove(net, tracer=OFF, backend="wgpu", matmul=gpu.matmul_m31)
    assert cpu.verified and wgpu.verified
    assert wgpu.proof.to_bytes() == cpu.proof.to_bytes()


def test_wgpu_demo_records_its_device(gpu: Any, tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    result = run_demo(DemoOptions(out_dir=tmp_path, layers=5, width=8, backend="wgpu",
                                  rerun="off", set_global=False,
                                  span_exporters=[("memory", memory)]))
    assert result.verified and result.hw_id and result.hw_id.startswith("wgpu:")
    spans = memory.get_finished_spans()
    matmul_layers = [s for s in spans if s.name == SpanName.LAYER
                     and s.attributes[Attr.LAYER_KIND] in (LayerKind.MATMUL.value,
                                                           LayerKind.ATTENTION.value)]
    assert matmul_layers and all(s.attributes.get(Attr.HW_ID) == result.hw_id
                                 for s in matmul_layers)
    events = {e.name for s in spans for e in s.events}
    assert EventName.GPU_ADAPTER_ACQUIRED in events


def test_wgpu_demo_shows_gpu_cost_per_phase(gpu: Any, tmp_path: Path) -> None:
    """`proofscope demo --backend wgpu` end to end: span figures, the summary line, and
    the Rerun recording (read back from the real .rrd) all carry the same kernel time."""
    from otel_proofscope.rerun import readback

    memory = InMemorySpanExporter()
    rrd = tmp_path / "demo.rrd"
    result = run_demo(DemoOptions(out_dir=tmp_path, layers=5, width=16, backend="wgpu",
                                  rerun=f"file:{rrd}", set_global=False,
                                  span_exporters=[("memory", memory)]))
    assert result.verified
    spans = memory.get_finished_spans()
    (proof,) = [s for s in spans if s.name == SpanName.PROOF]
    cost = result.prove.gpu_cost
    assert cost is not None and cost.dispatches == proof.attributes[Attr.GPU_DISPATCH_COUNT]
    line = next(x for x in result.summary_lines() if x.startswith("GPU: "))
    assert f"kernel {cost.kernel_s * 1e3:.2f} ms" in line
    assert "energy unavailable: unsupported" in line
    gpu_layers = sorted((s for s in spans if s.name == SpanName.LAYER
                         and Attr.GPU_KERNEL_TIME in s.attributes),
                        key=lambda s: s.end_time or 0)
    assert gpu_layers
    rec = readback.read(rrd)
    bars = rec.rows("gkr/walk/gpu_time")
    assert len(bars) == len(gpu_layers)
    p = format(proof.context.trace_id, "032x")[:8]
    phases = [s for s in spans if Attr.GPU_KERNEL_TIME in s.attributes
              and s.name != SpanName.PROOF]
    kernel_ms = [v[0] for v in rec.values(f"gpu/phase/kernel_ms/{p}", "Scalars:scalars")]
    assert sorted(kernel_ms) == pytest.approx(
        sorted(s.attributes[Attr.GPU_KERNEL_TIME] * 1e3 for s in phases))
    assert rec.static(f"gpu/phase/kernel_ms/{p}"), "the series is named and drawn as points"
    up = [v[0] for v in rec.values(f"gpu/phase/bytes/{p}/upload", "Scalars:scalars")]
    assert sum(up) == proof.attributes[Attr.GPU_UPLOAD_SIZE]
