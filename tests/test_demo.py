"""`proofscope demo` end to end: the files it writes and what they prove."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from otel_proofscope.demo.circuit import build_network
from otel_proofscope.demo.field import QM31
from otel_proofscope.demo_runner import rerun_available
from otel_proofscope.fields import parse_canonical
from otel_proofscope.semconv import Attr, EventName, LayerKind, LayerProofKind, SpanName

LAYERS, WIDTH = 8, 16
CONTRACT_LAYER_ATTRS = (Attr.LAYER_INDEX, Attr.LAYER_KIND, Attr.LAYER_PROOF_KIND,
                        Attr.LAYER_TRACE_COST, Attr.LAYER_INPUT_SHAPE, Attr.LAYER_OUTPUT_SHAPE,
                        Attr.SUMCHECK_ROUNDS, Attr.CLAIM_INITIAL, Attr.CLAIM_FINAL)


# ── reading OTLP/JSON lines ──────────────────────────────────────────────────────────


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    if "intValue" in v:
        return int(v["intValue"])
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    raise AssertionError(f"unexpected OTLP value {v}")


def _attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in items}


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent: str
    attrs: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]


def read_spans(path: Path) -> list[Span]:
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    out.append(Span(s["name"], s["traceId"], s["spanId"],
                                    s.get("parentSpanId", ""), _attrs(s.get("attributes", [])),
                                    [(e["name"], _attrs(e.get("attributes", [])))
                                     for e in s.get("events", [])]))
    return out


def read_metric_points(path: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in path.read_text().splitlines():
        for rm in json.loads(line)["resourceMetrics"]:
            for sm in rm["scopeMetrics"]:
                for m in sm["metrics"]:
                    body = next(v for k, v in m.items() if k in ("histogram", "sum", "gauge"))
                    for dp in body["dataPoints"]:
                        out.setdefault(m["name"], []).append(
                            {**dp, "attributes": _attrs(dp.get("attributes", []))})
    return out


def q(text: str) -> QM31:
    value = parse_canonical(text)
    assert isinstance(value, tuple) and len(value) == 4, text
    return QM31(*value)


def round_check_failures(layer: Span) -> list[str]:
    """Redo g(0) + g(1) = claim for every round, from the exported attributes alone.

    Each round event's ``proof.sumcheck.poly`` is the round polynomial's evaluations at
    t = 0, 1, …, d (QM31 limb tuples); ``proof.claim`` is g(r) after the round, which is
    the claim the next round must sum to.
    """
    failures = []
    claim = q(layer.attrs[Attr.CLAIM_INITIAL])
    rounds = sorted((e for n, e in layer.events if n == EventName.SUMCHECK_ROUND),
                    key=lambda e: e[Attr.SUMCHECK_ROUND])
    for event in rounds:
        evals = [q(s) for s in event[Attr.SUMCHECK_POLY]]
        if len(evals) != event[Attr.SUMCHECK_DEGREE] + 1:
            failures.append(f"round {event[Attr.SUMCHECK_ROUND]}: degree/length mismatch")
        if evals[0] + evals[1] != claim:
            failures.append(f"round {event[Attr.SUMCHECK_ROUND]}: g(0) + g(1) != claim")
        claim = q(event[Attr.CLAIM])
    return failures


# ── one demo run shared by the checks ───────────────────────────────────────────────


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    runtime = Path(env.get("TMPDIR", "/tmp")) / f"proofscope-xdg-{os.getuid()}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    return env


def demo(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    out = tmp_path_factory.mktemp("demo")
    proc = demo("--out", str(out), "--layers", str(LAYERS), "--width", str(WIDTH))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield out, proc.stdout


def test_writes_the_three_files(run: tuple[Path, str]) -> None:
    out, stdout = run
    assert (out / "traces.jsonl").stat().st_size > 0
    assert (out / "metrics.jsonl").stat().st_size > 0
    assert "verified: yes" in stdout
    problem = rerun_available()
    if problem is not None:
        pytest.skip(f"no .rrd expected: {problem}")
    rrd = out / "proofscope.rrd"
    assert rrd.stat().st_size > 0
    assert f"rerun {rrd}" in stdout
    import rerun  # noqa: F401  (present when rerun_available() said so)
    from rerun.chunk import RrdReader

    assert RrdReader(str(rrd)).recordings()


def test_trace_shape_matches_the_contract(run: tuple[Path, str]) -> None:
    out, _ = run
    spans = read_spans(out / "traces.jsonl")
    roots = [s for s in spans if s.name == SpanName.PROOF]
    assert len(roots) == 1 and roots[0].parent == ""
    root = roots[0]
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert root.attrs[Attr.PROOF_SYSTEM] == "gkr"
    assert root.attrs[Attr.PROOF_LAYERS] == LAYERS
    assert root.attrs[Attr.PROOF_VERIFIED] is True
    assert root.attrs[Attr.PROOF_LAYER_PROOFS] == LAYERS
    assert root.attrs[Attr.PROOF_SIZE] > 0

    net = build_network(LAYERS, WIDTH)
    layers = sorted((s for s in spans if s.name == SpanName.LAYER),
                    key=lambda s: s.attrs[Attr.LAYER_INDEX])
    assert [s.attrs[Attr.LAYER_INDEX] for s in layers] == list(range(LAYERS))
    for span, spec in zip(layers, net.layers, strict=True):
        assert span.parent == root.span_id
        missing = [a for a in CONTRACT_LAYER_ATTRS if a not in span.attrs]
        assert not missing, (span.attrs[Attr.LAYER_INDEX], missing)
        assert span.attrs[Attr.LAYER_KIND] == spec.kind.value
        assert span.attrs[Attr.LAYER_TRACE_COST] == spec.trace_cost
        assert span.attrs[Attr.LAYER_INPUT_SHAPE] == list(spec.input_shape)
        rounds = [e for n, e in span.events if n == EventName.SUMCHECK_ROUND]
        if span.attrs[Attr.LAYER_PROOF_KIND] == LayerProofKind.SUMCHECK.value:
            assert len(rounds) == span.attrs[Attr.SUMCHECK_ROUNDS] == spec.rounds >= 1
        else:
            assert spec.kind is LayerKind.ADD and not rounds
    verify = [s for s in spans if s.name == SpanName.VERIFY]
    assert len(verify) == 1 and verify[0].attrs[Attr.PROOF_VERIFIED] is True
    openings = [s for s in spans if s.name == SpanName.WEIGHT_OPENING]
    assert len(openings) == root.attrs[Attr.PROOF_WEIGHT_OPENINGS] > 0
    assert all(len(s.attrs[Attr.WEIGHT_COMMITMENT]) == 64 for s in openings)
    compile_span = next(s for s in spans if s.name == SpanName.CIRCUIT_COMPILE)
    assert compile_span.attrs[Attr.CIRCUIT_NODE_TRACE_COST] == [x.trace_cost
                                                                for x in net.layers]


def test_round_checks_recomputed_from_exported_events(run: tuple[Path, str]) -> None:
    out, _ = run
    spans = read_spans(out / "traces.jsonl")
    layers = sorted((s for s in spans if s.name == SpanName.LAYER),
                    key=lambda s: s.attrs[Attr.LAYER_INDEX])
    checked = 0
    for layer in layers:
        assert round_check_failures(layer) == []
        checked += sum(1 for n, _ in layer.events if n == EventName.SUMCHECK_ROUND)
    assert checked == build_network(LAYERS, WIDTH).total_rounds()
    # The GKR chain: each layer's final claim is the claim the layer below starts from.
    for below, above in itertools.pairwise(layers):
        assert above.attrs[Attr.CLAIM_FINAL] == below.attrs[Attr.CLAIM_INITIAL]
    # The recomputation is not vacuous: one corrupted limb is caught.
    victim = next(s for s in layers if s.attrs[Attr.SUMCHECK_ROUNDS] > 1)
    event = next(e for n, e in victim.events if n == EventName.SUMCHECK_ROUND
                 and e[Attr.SUMCHECK_ROUND] == 1)
    a, b, c, d = parse_canonical(event[Attr.SUMCHECK_POLY][0])  # type: ignore[misc]
    event[Attr.SUMCHECK_POLY][0] = f"({(a + 1) % (2**31 - 1)},{b},{c},{d})"
    assert round_check_failures(victim) == ["round 1: g(0) + g(1) != claim"]


def test_layer_duration_metric_by_kind(run: tuple[Path, str]) -> None:
    out, _ = run
    points = read_metric_points(out / "metrics.jsonl")["proof.layer.duration"]
    counts: Counter[str] = Counter()
    for p in points:
        counts[p["attributes"][Attr.LAYER_KIND]] += int(p["count"])
    expected = Counter(layer.kind.value for layer in build_network(LAYERS, WIDTH).layers)
    assert counts == expected


def test_witness_stays_out_of_the_files(run: tuple[Path, str]) -> None:
    out, stdout = run
    text = (out / "traces.jsonl").read_text()
    assert EventName.LAYER_ACTIVATION not in text
    assert EventName.ATTENTION_HEATMAP not in text
    assert "witness events kept out of OTLP" in stdout  # they were captured, then withheld


def test_cpu_path_has_no_gpu_evidence(run: tuple[Path, str]) -> None:
    out, _ = run
    names = {n for s in read_spans(out / "traces.jsonl") for n, _ in s.events}
    assert not any(n.startswith("gpu.") for n in names)
    assert all(Attr.HW_ID not in s.attrs for s in read_spans(out / "traces.jsonl"))


def test_cpu_path_never_imports_wgpu(tmp_path: Path) -> None:
    code = ("import sys; from pathlib import Path; "
            "from otel_proofscope.demo_runner import DemoOptions, run_demo; "
            f"r = run_demo(DemoOptions(out_dir=Path({str(tmp_path)!r}), layers=3, width=4, "
            "rerun='off')); "
            "assert r.verified; assert 'wgpu' not in sys.modules, 'wgpu imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr


def test_no_telemetry_writes_nothing(tmp_path: Path) -> None:
    proc = demo("--out", str(tmp_path / "none"), "--layers", "3", "--width", "8",
                "--no-telemetry")
    assert proc.returncode == 0, proc.stderr
    assert "verified: yes" in proc.stdout and "telemetry: off" in proc.stdout
    assert not (tmp_path / "none").exists()


def test_bad_arguments_fail_cleanly(tmp_path: Path) -> None:
    proc = demo("--out", str(tmp_path), "--width", "12", "--no-telemetry")
    assert proc.returncode == 2 and "power of two" in proc.stderr
    proc = demo("--rerun", "bogus")
    assert proc.returncode == 2 and "rerun+http" in proc.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_prometheus_endpoint_is_scrapable_while_holding(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.exporter.prometheus")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "demo", "--out", str(tmp_path),
         "--layers", "3", "--width", "8", "--rerun", "off", "--prometheus-port", str(port),
         "--hold", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "proof_layer_duration" not in body:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=2) as resp:
                    body = resp.read().decode()
            except OSError:
                time.sleep(0.2)
        assert 'proof_layer_duration_seconds_count{' in body
        assert 'proof_layer_kind="MatMul"' in body
    finally:
        proc.terminate()  # SIGTERM ends the hold; the bounded shutdown still runs
        proc.communicate(timeout=30)


def test_otlp_endpoint_replaces_the_files(tmp_path: Path) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the demo exports OTLP (a real gRPC receiver
    on loopback) and writes no JSON-lines files."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.metrics.v1 import (
        metrics_service_pb2,
        metrics_service_pb2_grpc,
    )
    from opentelemetry.proto.collector.trace.v1 import (
        trace_service_pb2,
        trace_service_pb2_grpc,
    )

    received: dict[str, list[str]] = {"spans": [], "metrics": []}

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
        def Export(self, request, context):  # type: ignore[no-untyped-def]
            received["spans"] += [s.name for rs in request.resource_spans
                                  for ss in rs.scope_spans for s in ss.spans]
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
        def Export(self, request, context):  # type: ignore[no-untyped-def]
            received["metrics"] += [m.name for rm in request.resource_metrics
                                    for sm in rm.scope_metrics for m in sm.metrics]
            return metrics_service_pb2.ExportMetricsServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {**_env(), "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        proc = subprocess.run(
            [sys.executable, "-m", "otel_proofscope", "demo", "--out", str(tmp_path),
             "--layers", "3", "--width", "8", "--rerun", "off"],
            capture_output=True, text=True, timeout=120, env=env)
    finally:
        server.stop(grace=None)
    assert proc.returncode == 0, proc.stderr
    assert received["spans"].count(SpanName.PROOF) == 1
    assert received["spans"].count(SpanName.LAYER) == 3
    assert "proof.layer.duration" in received["metrics"]
    assert not (tmp_path / "traces.jsonl").exists()
    assert "exported to otlp" in proc.stdout


def test_summary_states_both_soundness_figures(run: tuple[Path, str]) -> None:
    from otel_proofscope.demo.circuit import HASH_QUERIES_LOG2

    _, stdout = run
    net = build_network(LAYERS, WIDTH)
    line = next(x for x in stdout.splitlines() if "soundness" in x)
    assert f"{net.soundness_bits():.1f} bits interactive" in line
    assert (f"{net.fiat_shamir_bits():.1f} bits non-interactive (Fiat–Shamir, against "
            f"2^{HASH_QUERIES_LOG2} hash queries)") in line


def test_readme_and_prover_doc_state_both_soundness_figures() -> None:
    root = Path(__file__).resolve().parent.parent
    net = build_network()
    readme = (root / "README.md").read_text()
    assert f"~{net.soundness_bits():.0f} bits interactive" in readme
    assert f"~{net.fiat_shamir_bits():.1f} bits non-interactive (Fiat–Shamir)" in readme
    doc = (root / "docs" / "prover.md").read_text()
    assert f"**{net.soundness_bits():.2f} bits** | **{net.fiat_shamir_bits():.2f} bits**" in doc


def test_layer_duration_is_one_measurement_in_span_metric_and_summary(
        run: tuple[Path, str]) -> None:
    """Per layer kind: the spans' durations, the proof.layer.duration histogram sum and
    the CLI's "time per layer kind" are the same number."""
    out, stdout = run
    span_s: Counter[str] = Counter()
    proof_s = 0.0
    for line in (out / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for s in ss["spans"]:
                    if s["name"] == SpanName.PROOF:
                        proof_s += (int(s["endTimeUnixNano"])
                                    - int(s["startTimeUnixNano"])) / 1e9
                    if s["name"] == SpanName.LAYER:
                        kind = _attrs(s["attributes"])[Attr.LAYER_KIND]
                        span_s[kind] += (int(s["endTimeUnixNano"])
                                         - int(s["startTimeUnixNano"])) / 1e9
    metric_s: Counter[str] = Counter()
    for p in read_metric_points(out / "metrics.jsonl")["proof.layer.duration"]:
        metric_s[p["attributes"][Attr.LAYER_KIND]] += float(p["sum"])
    assert set(span_s) == set(metric_s)
    for kind, seconds in span_s.items():
        assert metric_s[kind] == pytest.approx(seconds, abs=1e-9), kind
    # The proof's duration too: the histogram is the root span's own duration.
    (proof_point,) = read_metric_points(out / "metrics.jsonl")["proof.duration"]
    assert float(proof_point["sum"]) == pytest.approx(proof_s, abs=1e-9)
    line = next(x for x in stdout.splitlines() if "time per layer kind:" in x)
    for kind, seconds in span_s.items():
        assert f"{kind} {seconds * 1e3:.1f} ms" in line, (kind, seconds, line)


@pytest.mark.parametrize("display", [None, ":99"], ids=["no-display", "dead-display"])
def test_spawn_without_a_usable_display_is_reported_not_claimed(tmp_path: Path,
                                                                 display: str | None) -> None:
    """`demo --rerun spawn` where no viewer can open a window: the summary never says the
    viewer received the recording; it counts the loss (or says delivery is unconfirmed)
    and suggests --rerun file: plus `rerun FILE`."""
    env = _env()
    for var in ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET"):
        env.pop(var, None)
    if display is not None:
        env["DISPLAY"] = display  # an X server that does not exist: the viewer dies
    proc = subprocess.run([sys.executable, "-m", "otel_proofscope", "demo", "--out",
                           str(tmp_path), "--layers", "3", "--width", "8", "--rerun", "spawn"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "received the recording" not in out and "sent to the spawned" not in out, out
    rrd = tmp_path / "proofscope.rrd"
    assert f"--rerun file:{rrd}, then open it with: rerun {rrd}" in out
    # Both cases are caught before a viewer is spawned: the loss is counted and the
    # sink's one warning says why (a dead DISPLAY used to spawn a viewer that died).
    assert "dropped: nothing" not in out
    assert "spans → rerun (sink_unavailable)" in out
    if display is None:
        assert "no display" in proc.stderr
    else:
        assert f"no display server answers (DISPLAY={display} is set" in proc.stderr


def test_no_display_detection(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from otel_proofscope.rerun.sink import no_display

    for var in ("DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    assert no_display() is not None and "--rerun file:" in str(no_display())
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert no_display() is not None  # named, but no compositor listens there
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as compositor:
        compositor.bind(str(tmp_path / "wayland-0"))
        compositor.listen(1)
        assert no_display() is None
    monkeypatch.delenv("WAYLAND_DISPLAY")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert no_display() is None
