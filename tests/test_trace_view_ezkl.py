"""A real EZKL proof under ``opentelemetry-instrument`` with the Rerun exporter: the trace
view shows every phase, including those exported in batches before the ``proof`` root
(``ezkl.gen_witness``, ``ezkl.setup`` and its log lines), which the proof walk alone
never drew."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.instrumentation")
pytest.importorskip("rerun", reason="rerun-sdk (the [rerun] extra) is not installed")
pytest.importorskip("ezkl")
pytest.importorskip("onnx")

from flame_helpers import boxes, live_paths

from otel_proofscope.rerun import readback
from otel_proofscope.rerun.translate_trace import FLAME, LOGS
from otel_proofscope.semconv import EzklSpanName, SpanName

RUN_TIMEOUT_S = 240

PROVER = textwrap.dedent('''
    import json
    import ezkl, onnx
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Relu", ["h"], ["h2"]),
         helper.make_node("MatMul", ["h2", "w2"], ["y"])],
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(rng.normal(size=(4, 8)).astype(np.float32), "w1"),
         numpy_helper.from_array(rng.normal(size=(8, 2)).astype(np.float32), "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, "m.onnx")
    json.dump({"input_data": [rng.normal(size=4).tolist()]}, open("input.json", "w"))
    assert ezkl.gen_settings("m.onnx", "settings.json")
    assert ezkl.calibrate_settings("input.json", "m.onnx", "settings.json", "resources",
                                   max_logrows=12)
    assert ezkl.compile_circuit("m.onnx", "m.compiled", "settings.json")
    logrows = json.load(open("settings.json"))["run_args"]["logrows"]
    ezkl.gen_srs("kzg.srs", logrows)
    ezkl.gen_witness("input.json", "m.compiled", "witness.json")
    assert ezkl.setup("m.compiled", "vk.key", "pk.key", "kzg.srs")
    ezkl.prove("witness.json", "m.compiled", "pk.key", "proof.json", "kzg.srs")
    assert ezkl.verify("proof.json", "settings.json", "vk.key", "kzg.srs") is True
    print("proved", flush=True)
''')


def test_ezkl_proof_under_opentelemetry_instrument_shows_every_phase(tmp_path: Path) -> None:
    if not list(entry_points(group="opentelemetry_configurator")):
        pytest.skip("opentelemetry-distro (the SDK configurator) is not installed")
    local = Path(sys.executable).parent / "opentelemetry-instrument"
    command = str(local) if local.exists() else shutil.which("opentelemetry-instrument")
    if not command:
        pytest.skip("opentelemetry-instrument is not installed")
    (tmp_path / "prover.py").write_text(PROVER)
    rrd = tmp_path / "ezkl.rrd"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_", "TRACEPARENT"))}
    env.update({
        "OTEL_SERVICE_NAME": "ezkl-prover",
        "OTEL_LOGS_EXPORTER": "none",
        # short batches: gen_witness and setup leave before the proof root does
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "PROOFSCOPE_RERUN": f"file:{rrd}",
        "EZKL_REPO_PATH": str(tmp_path / "ezkl-repo"),
        "XDG_RUNTIME_DIR": str(tmp_path),
    })
    proc = subprocess.run(
        [command, "--traces_exporter", "rerun", "--metrics_exporter", "none",
         sys.executable, "prover.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert "proved" in proc.stdout

    rec = readback.read(rrd)
    flames = live_paths(rec, f"/{FLAME}/ezkl-prover/")
    assert flames
    drawn = [b for p in flames for b in boxes(rec, p)]
    by_name = {b.name: b for b in drawn}
    for name in (EzklSpanName.GEN_WITNESS, EzklSpanName.SETUP, EzklSpanName.PROVE,
                 SpanName.PROOF):
        assert name in by_name, sorted(by_name)
    # nested under the proof root, none drawn as an orphan
    root_y = by_name[SpanName.PROOF].y
    for name in (EzklSpanName.GEN_WITNESS, EzklSpanName.SETUP, EzklSpanName.PROVE):
        assert by_name[name].y > root_y
    assert not any("orphan" in b.label for b in drawn)
    # setup's Rust log lines, bridged as span events, are rows of the span log
    logs = [r.values["TextLog:text"][0] for p in rec.paths()
            if p == f"/{LOGS}/ezkl-prover" for r in rec.rows(p)]
    assert any(t.startswith(f"{EzklSpanName.SETUP} › ") for t in logs)
    assert any(t.startswith(f"{EzklSpanName.GEN_WITNESS} ") for t in logs)
