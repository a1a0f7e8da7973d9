"""The EZKL instrumentor against the real prover: a tiny ONNX MLP proved fully offline."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ezkl = pytest.importorskip("ezkl")
onnx = pytest.importorskip("onnx")
pytest.importorskip("opentelemetry.instrumentation")

import numpy as np  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from opentelemetry import trace  # noqa: E402
from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import StatusCode  # noqa: E402

from otel_proofscope.instrumentation import ProofTracer  # noqa: E402
from otel_proofscope.integrations.ezkl import (  # noqa: E402
    SPAN_NAMES,
    EzklAttr,
    EzklInstrumentor,
    EzklSpanName,
)
from otel_proofscope.integrations.ezkl.logs import LogAttr  # noqa: E402
from otel_proofscope.semconv import Attr, EventName, SpanName  # noqa: E402

MAX_LOGROWS = 12


def build_model(directory: Path) -> tuple[Path, Path]:
    """A 4 → 8 → 2 MLP (MatMul, Add, Relu, MatMul) and one input, made here, no downloads."""
    rng = np.random.default_rng(7)
    w1 = rng.normal(size=(4, 8)).astype(np.float32)
    b1 = rng.normal(size=8).astype(np.float32) * 0.1
    w2 = rng.normal(size=(8, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("Add", ["h", "b1"], ["h1"]),
         helper.make_node("Relu", ["h1"], ["h2"]),
         helper.make_node("MatMul", ["h2", "w2"], ["y"])],
        "tiny_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
         numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    model_path, input_path = directory / "tiny_mlp.onnx", directory / "input.json"
    onnx.save(model, model_path)
    input_path.write_text(json.dumps({"input_data": [rng.normal(size=4).tolist()]}))
    return model_path, input_path


@dataclass
class Run:
    dir: Path
    spans: InMemorySpanExporter
    metrics: InMemoryMetricReader
    sampler_calls: list[tuple[str, str]]
    settings: dict[str, Any]
    paths: dict[str, str]
    #: wall-clock window around the ezkl.prove call, measured by the test itself
    prove_window_ns: tuple[int, int] = (0, 0)


class _RecordingSampler:
    """Stands in for a GPU sampler on this GPU-less machine: records when it runs."""

    def __init__(self, calls: list[tuple[str, str]]) -> None:
        self.calls = calls
        calls.append(("start", getattr(trace.get_current_span(), "name", "")))

    def stop(self) -> None:
        self.calls.append(("stop", getattr(trace.get_current_span(), "name", "")))


@pytest.fixture(scope="module")
def ezkl_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("ezkl")
    old = os.environ.get("EZKL_REPO_PATH")
    os.environ["EZKL_REPO_PATH"] = str(directory / "ezkl-repo")
    yield directory
    if old is None:
        os.environ.pop("EZKL_REPO_PATH", None)
    else:
        os.environ["EZKL_REPO_PATH"] = old


def test_uninstrument_restores_every_original_function(ezkl_dir: Path) -> None:
    originals = {name: getattr(ezkl, name) for name in SPAN_NAMES}
    inner = {name: getattr(ezkl.ezkl, name) for name in SPAN_NAMES}
    level, propagate = logging.getLogger("ezkl").level, logging.getLogger("ezkl").propagate
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = EzklInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        for name in SPAN_NAMES:
            assert getattr(ezkl, name) is not originals[name]
            assert getattr(ezkl.ezkl, name) is not inner[name]
            assert getattr(ezkl, name).__name__ == name  # functools.wraps kept the identity
        with pytest.raises(Exception):  # noqa: B017 (EZKL raises its own error type)
            ezkl.gen_settings(str(ezkl_dir / "missing.onnx"), str(ezkl_dir / "s.json"))
        assert [s.name for s in exporter.get_finished_spans()] == [EzklSpanName.GEN_SETTINGS]
        assert exporter.get_finished_spans()[0].status.status_code is StatusCode.ERROR
    finally:
        instrumentor.uninstrument()
    for name in SPAN_NAMES:
        assert getattr(ezkl, name) is originals[name]
        assert getattr(ezkl.ezkl, name) is inner[name]
    assert (logging.getLogger("ezkl").level, logging.getLogger("ezkl").propagate) == (
        level, propagate)
    exporter.clear()
    with pytest.raises(Exception):  # noqa: B017
        ezkl.gen_settings(str(ezkl_dir / "missing.onnx"), str(ezkl_dir / "s.json"))
    assert exporter.get_finished_spans() == ()


@pytest.fixture(scope="module")
def run(ezkl_dir: Path) -> Iterator[Run]:
    import otel_proofscope.gpu as gpu_module

    model, data = build_model(ezkl_dir)
    p = {k: str(ezkl_dir / v) for k, v in {
        "settings": "settings.json", "compiled": "tiny_mlp.compiled", "srs": "kzg.srs",
        "witness": "witness.json", "vk": "vk.key", "pk": "pk.key", "proof": "proof.json"
    }.items()}
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    calls: list[tuple[str, str]] = []
    real_start = gpu_module.start_sampler
    gpu_module.start_sampler = lambda **kw: _RecordingSampler(calls)  # type: ignore[assignment]
    EzklInstrumentor().instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        assert ezkl.gen_settings(str(model), p["settings"])
        assert ezkl.calibrate_settings(str(data), str(model), p["settings"], "resources",
                                       max_logrows=MAX_LOGROWS)
        assert ezkl.compile_circuit(str(model), p["compiled"], p["settings"])
        settings = json.loads(Path(p["settings"]).read_text())
        ezkl.gen_srs(p["srs"], settings["run_args"]["logrows"])
        ezkl.gen_witness(str(data), p["compiled"], p["witness"])
        assert ezkl.mock(p["witness"], p["compiled"])
        assert ezkl.setup(p["compiled"], p["vk"], p["pk"], p["srs"])
        before = time.time_ns()
        ezkl.prove(p["witness"], p["compiled"], p["pk"], p["proof"], p["srs"])
        window = (before, time.time_ns())
        assert ezkl.verify(p["proof"], p["settings"], p["vk"], p["srs"]) is True
    finally:
        EzklInstrumentor().uninstrument()
        gpu_module.start_sampler = real_start
    yield Run(ezkl_dir, spans, reader, calls, settings, p, window)


def _by_name(spans: tuple[ReadableSpan, ...], name: str) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == name]
    return span


def test_phase_spans_form_one_proof(run: Run) -> None:
    spans = run.spans.get_finished_spans()
    assert sorted(s.name for s in spans) == sorted([SpanName.PROOF, *SPAN_NAMES.values()])
    root = _by_name(spans, SpanName.PROOF)
    assert root.parent is None
    in_proof = {EzklSpanName.GEN_WITNESS, EzklSpanName.MOCK, EzklSpanName.SETUP,
                EzklSpanName.PROVE, SpanName.VERIFY}
    for s in spans:
        if s.name in in_proof:
            assert s.parent is not None and s.parent.span_id == root.context.span_id, s.name
            assert s.context.trace_id == root.context.trace_id
            assert root.start_time <= s.start_time and s.end_time <= root.end_time
        elif s is not root:
            assert s.parent is None, s.name  # set-up phases happen before the proof
        assert s.end_time > s.start_time
        assert s.status.status_code is not StatusCode.ERROR
    assert _by_name(spans, EzklSpanName.GEN_WITNESS).start_time == min(
        s.start_time for s in spans if s.name in in_proof)


def test_prove_span_is_the_measured_wall_time_and_carries_ezkls_log(run: Run) -> None:
    prove = _by_name(run.spans.get_finished_spans(), EzklSpanName.PROVE)
    messages = [e.attributes[LogAttr.MESSAGE] for e in prove.events
                if e.name == EventName.LOG]
    reported = [float(m) for msg in messages
                for m in re.findall(r"^proof took ([0-9.]+)$", str(msg))]
    assert len(reported) == 1, messages
    # EZKL's own "proof took" figure is not wall time (it can exceed the call's wall
    # time when proving runs on several threads), so the span is checked against the
    # test's own clock around the call instead.
    start, end = run.prove_window_ns
    assert start <= prove.start_time < prove.end_time <= end


def test_attributes_come_from_the_settings_and_proof_files(run: Run) -> None:
    spans = run.spans.get_finished_spans()
    root = _by_name(spans, SpanName.PROOF)
    s, ra = run.settings, run.settings["run_args"]
    assert root.attributes[Attr.PROOF_SYSTEM] == "ezkl"
    assert root.attributes[Attr.PROOF_BACKEND] == "cpu"
    assert root.attributes[Attr.PROOF_MODEL_NAME] == "tiny_mlp"
    assert root.attributes[EzklAttr.LOGROWS] == ra["logrows"] <= MAX_LOGROWS
    assert root.attributes[EzklAttr.INPUT_SCALE] == ra["input_scale"]
    assert root.attributes[EzklAttr.PARAM_SCALE] == ra["param_scale"]
    assert root.attributes[EzklAttr.INPUT_VISIBILITY] == ra["input_visibility"]
    assert root.attributes[EzklAttr.PARAM_VISIBILITY] == ra["param_visibility"]
    assert root.attributes[EzklAttr.NUM_ROWS] == s["num_rows"]
    assert root.attributes[EzklAttr.NUM_INNER_COLS] == ra["num_inner_cols"]
    assert root.attributes[EzklAttr.TOTAL_ASSIGNMENTS] == s["total_assignments"]
    assert list(root.attributes[Attr.PROOF_INPUT_SHAPE]) == [1, 4]
    assert list(root.attributes[Attr.PROOF_OUTPUT_SHAPE]) == [1, 2]
    proof_file = json.loads(Path(run.paths["proof"]).read_text())
    assert root.attributes[Attr.PROOF_SIZE] == len(proof_file["proof"]) > 0
    assert root.attributes[Attr.PROOF_VERIFIED] is True
    prove = _by_name(spans, EzklSpanName.PROVE)
    assert prove.attributes[EzklAttr.PROOF_FILE_SIZE] == os.path.getsize(run.paths["proof"])
    verify = _by_name(spans, SpanName.VERIFY)
    assert verify.attributes[Attr.PROOF_VERIFIED] is True
    compile_span = _by_name(spans, SpanName.CIRCUIT_COMPILE)
    assert compile_span.attributes[EzklAttr.LOGROWS] == ra["logrows"]
    assert _by_name(spans, EzklSpanName.GEN_SRS).attributes[EzklAttr.LOGROWS] == ra["logrows"]
    assert _by_name(spans, EzklSpanName.CALIBRATE_SETTINGS).attributes[
        EzklAttr.CALIBRATION_TARGET] == "resources"
    assert _by_name(spans, EzklSpanName.MOCK).attributes[EzklAttr.RESULT] is True


def test_ezkl_log_lines_become_events_on_the_running_phase(run: Run) -> None:
    spans = run.spans.get_finished_spans()
    prove = _by_name(spans, EzklSpanName.PROVE)
    events = [e for e in prove.events if e.name == EventName.LOG]
    assert any(e.attributes[LogAttr.MESSAGE] == "proof started..." and
               e.attributes[LogAttr.LOGGER].startswith("ezkl.") and
               e.attributes[LogAttr.LEVEL] == "Info" for e in events)
    assert all(prove.start_time <= e.timestamp <= prove.end_time for e in events)
    verify = _by_name(spans, SpanName.VERIFY)
    assert any("verified" in str(e.attributes[LogAttr.MESSAGE]) or
               "verify" in str(e.attributes[LogAttr.MESSAGE]) for e in verify.events)


def test_gpu_sampler_runs_exactly_during_prove(run: Run) -> None:
    assert run.sampler_calls == [("start", EzklSpanName.PROVE), ("stop", EzklSpanName.PROVE)]


def test_proof_metrics(run: Run) -> None:
    data = run.metrics.get_metrics_data()
    assert data is not None
    points = {m.name: list(m.data.data_points) for rm in data.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics}
    (duration,) = points["proof.duration"]
    assert duration.count == 1  # type: ignore[union-attr]
    assert dict(duration.attributes or {})[Attr.PROOF_VERIFIED] is True
    (verified,) = points["proof.verify.count"]
    assert verified.value == 1  # type: ignore[union-attr]


def test_a_tampered_proof_is_not_verified(run: Run, tmp_path: Path) -> None:
    doc = json.loads(Path(run.paths["proof"]).read_text())
    doc["proof"][40] = (doc["proof"][40] + 1) % 256
    doc.pop("hex_proof", None)
    bad = tmp_path / "bad_proof.json"
    bad.write_text(json.dumps(doc))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    EzklInstrumentor().instrument(tracer_provider=provider)
    try:
        with pytest.raises(RuntimeError):
            ezkl.verify(str(bad), run.paths["settings"], run.paths["vk"], run.paths["srs"])
    finally:
        EzklInstrumentor().uninstrument()
    (verify,) = exporter.get_finished_spans()  # standalone verify: no proof root
    assert verify.name == SpanName.VERIFY and verify.parent is None
    assert verify.attributes[Attr.PROOF_VERIFIED] is False
    assert verify.status.status_code is StatusCode.ERROR
    assert [e.name for e in verify.events if e.name == "exception"] == ["exception"]


def test_a_proof_span_of_the_caller_is_used_as_the_root(run: Run) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = ProofTracer(tracer_provider=provider)
    p = run.paths
    EzklInstrumentor().instrument(tracer_provider=provider)
    try:
        with tracer.proof(system="ezkl", model_name="mine"):
            ezkl.gen_witness(str(run.dir / "input.json"), p["compiled"], p["witness"])
            ezkl.prove(p["witness"], p["compiled"], p["pk"], str(run.dir / "p2.json"),
                       p["srs"])
            ezkl.verify(str(run.dir / "p2.json"), p["settings"], p["vk"], p["srs"])
    finally:
        EzklInstrumentor().uninstrument()
    spans = exporter.get_finished_spans()
    (root,) = [s for s in spans if s.name == SpanName.PROOF]
    assert root.attributes[Attr.PROOF_MODEL_NAME] == "mine"
    assert root.attributes[Attr.PROOF_VERIFIED] is True
    assert root.attributes[Attr.PROOF_SIZE] > 0
    assert {s.name for s in spans if s is not root} == {
        EzklSpanName.GEN_WITNESS, EzklSpanName.PROVE, SpanName.VERIFY}
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id
               for s in spans if s is not root)


def test_a_new_witness_closes_an_unfinished_proof_at_its_last_phase(run: Run) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = EzklInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        for _ in range(2):
            ezkl.gen_witness(str(run.dir / "input.json"), run.paths["compiled"],
                             run.paths["witness"])
        first_closed = [s for s in exporter.get_finished_spans() if s.name == SpanName.PROOF]
        instrumentor.end_proof()
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    assert len(first_closed) == 1
    roots = [s for s in spans if s.name == SpanName.PROOF]
    witnesses = [s for s in spans if s.name == EzklSpanName.GEN_WITNESS]
    assert len(roots) == len(witnesses) == 2
    for root, witness in zip(roots, witnesses, strict=True):
        assert witness.parent is not None and witness.parent.span_id == root.context.span_id
        assert root.end_time == witness.end_time
        assert Attr.PROOF_VERIFIED not in (root.attributes or {})
    assert roots[0].end_time <= witnesses[1].start_time  # idle time is not the proof's


def test_proof_duration_metric_is_the_span_not_the_idle_time_after_it(run: Run) -> None:
    """A proof closed later (here: at uninstrument, 1 s after its last phase) records
    the span's duration, not the time until it was closed."""
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    EzklInstrumentor().instrument(tracer_provider=tracer_provider,
                                  meter_provider=MeterProvider(metric_readers=[reader]))
    try:
        before = time.time_ns()
        ezkl.gen_witness(str(run.dir / "input.json"), run.paths["compiled"],
                         str(run.dir / "witness-idle.json"))
        phases_s = (time.time_ns() - before) / 1e9
        time.sleep(1.0)
    finally:
        EzklInstrumentor().uninstrument()  # closes the open proof root
    root = _by_name(spans.get_finished_spans(), SpanName.PROOF)
    assert root.end_time is not None and root.start_time is not None
    span_s = (root.end_time - root.start_time) / 1e9
    data = reader.get_metrics_data()
    assert data is not None
    (point,) = [p for rm in data.resource_metrics for sm in rm.scope_metrics
                for m in sm.metrics if m.name == "proof.duration" for p in m.data.data_points]
    assert point.count == 1  # type: ignore[union-attr]
    assert point.sum == pytest.approx(span_s, abs=1e-9)  # type: ignore[union-attr]
    # The 1 s idle after the last phase is not in it (the span lies within the call).
    assert point.sum <= phases_s  # type: ignore[union-attr]
