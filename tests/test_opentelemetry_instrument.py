"""`opentelemetry-instrument` with this package installed: the `rerun` exporter and the
`ezkl` instrumentor load through their entry points, next to standard OTLP export."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.semconv import Attr, SpanName

pytest.importorskip("opentelemetry.instrumentation")
pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")

RUN_TIMEOUT_S = 120

PROVER = textwrap.dedent('''
    import json, sys
    from opentelemetry import trace
    from otel_proofscope.instrumentation import get_tracer

    print("provider", type(trace.get_tracer_provider()).__name__, flush=True)
    pt = get_tracer()
    with pt.proof(system="gkr", layers=1) as proof:
        with pt.layer(index=0, kind="MatMul", rounds=2, claim_initial=3):
            pt.sumcheck_round(0, [1, 2, 3], 5)
            pt.sumcheck_round(1, [4, 5, 6], 6)
        print("trace_id", format(proof.span.get_span_context().trace_id, "032x"), flush=True)

    try:
        import ezkl, onnx
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        sys.exit(0)
    import numpy as np
    w = numpy_helper.from_array(np.eye(2, dtype=np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, "tiny.onnx")
    json.dump({"input_data": [[0.5, -0.25]]}, open("input.json", "w"))
    print("ezkl instrumented", type(ezkl.gen_witness).__name__ == "function", flush=True)
    ezkl.gen_settings("tiny.onnx", "settings.json")
    ezkl.compile_circuit("tiny.onnx", "tiny.compiled", "settings.json")
    ezkl.gen_witness("input.json", "tiny.compiled", "witness.json")
    # no prove/verify: the open proof root is closed at interpreter exit
''')


def _instrument_command() -> str:
    local = Path(sys.executable).parent / "opentelemetry-instrument"
    found = str(local) if local.exists() else shutil.which("opentelemetry-instrument")
    if not found:
        pytest.skip("opentelemetry-instrument is not installed")
    return found


@pytest.fixture()
def receiver() -> Iterator[tuple[OtlpReceiver, InMemorySpanExporter]]:
    spans = InMemorySpanExporter()
    with OtlpReceiver([spans], grpc_port=0, http_port=None) as rx:
        yield rx, spans


def _run(tmp_path: Path, rx: OtlpReceiver, **extra_env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "prover.py").write_text(PROVER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_", "TRACEPARENT"))}
    env.update({
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{rx.grpc_endpoint}",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "instrumented-prover",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PROOFSCOPE_RERUN": f"file:{tmp_path / 'auto.rrd'}",
        "EZKL_REPO_PATH": str(tmp_path / "ezkl-repo"),
        "XDG_RUNTIME_DIR": str(tmp_path),
        **extra_env,
    })
    return subprocess.run(
        [_instrument_command(), "--traces_exporter", "rerun,otlp", "--metrics_exporter",
         "none", sys.executable, "prover.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def test_traces_reach_otlp_and_rerun_and_ezkl_is_auto_instrumented(
        tmp_path: Path, receiver: tuple[OtlpReceiver, InMemorySpanExporter]) -> None:
    if not list(entry_points(group="opentelemetry_configurator")):
        pytest.skip("opentelemetry-distro (the SDK configurator) is not installed")
    rx, collected = receiver
    proc = _run(tmp_path, rx)
    assert proc.returncode == 0, proc.stderr
    assert "provider TracerProvider" in proc.stdout
    trace_id = int(proc.stdout.split("trace_id ", 1)[1].split()[0], 16)

    spans = collected.get_finished_spans()
    gkr = [s for s in spans if s.context.trace_id == trace_id]
    assert sorted(s.name for s in gkr) == [SpanName.PROOF, SpanName.LAYER]
    assert all(s.resource.attributes["service.name"] == "instrumented-prover" for s in gkr)

    from rerun.chunk import RrdReader

    entities = {str(p) for p in
                RrdReader(str(tmp_path / "auto.rrd")).stream().collect().schema().entity_paths()}
    p = f"{trace_id:032x}"[:8]
    assert {f"/gkr/claim/{p}", f"/proof/progress/{p}", f"/proof/layer_seconds/{p}/MatMul"} \
        <= entities

    if "ezkl instrumented" not in proc.stdout:
        return  # ezkl not installed here: the rest needs it
    assert "ezkl instrumented True" in proc.stdout
    ezkl_roots = [s for s in spans if s.name == SpanName.PROOF
                  and s.attributes.get(Attr.PROOF_SYSTEM) == "ezkl"]
    assert len(ezkl_roots) == 1  # closed at exit, exported before the provider shut down
    witness = [s for s in spans if s.name == "ezkl.gen_witness"]
    assert len(witness) == 1 and witness[0].parent is not None
    assert witness[0].parent.span_id == ezkl_roots[0].context.span_id
    assert ezkl_roots[0].end_time == witness[0].end_time
    assert {"ezkl.gen_settings", SpanName.CIRCUIT_COMPILE} <= {s.name for s in spans}


def test_without_a_configurator_nothing_is_exported(
        tmp_path: Path, receiver: tuple[OtlpReceiver, InMemorySpanExporter]) -> None:
    """Why opentelemetry-distro is a dependency: opentelemetry-instrument only sets up the
    SDK through an ``opentelemetry_configurator`` entry point, which the distro provides."""
    rx, collected = receiver
    proc = _run(tmp_path, rx, OTEL_PYTHON_CONFIGURATOR="no-such-configurator")
    assert proc.returncode == 0, proc.stderr
    assert "provider ProxyTracerProvider" in proc.stdout
    assert collected.get_finished_spans() == ()
    assert not (tmp_path / "auto.rrd").exists()
