"""A proof through the real stack: prover → OpenTelemetry Collector → Jaeger.

``proofscope demo`` and the real Plonky3 prover (tests/plonky3_prover) export OTLP to
the Collector built by ``scripts/peers``, running ``collector-config/otel-collector.yaml``
as docs/deployment.md runs it on a bare host; the Collector sends traces to a real
Jaeger v2 (``collector-config/jaeger.yaml``, in-memory storage). Jaeger's HTTP query API
must return each proof as one trace: every span the prover says it exported, every
parent link inside the trace, and the contract's ``proof.*`` attributes and round
events. The Collector's span-metrics connector must count the same spans.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from peers import Collector, Jaeger, http_text, peer, wait_for

ROOT = Path(__file__).resolve().parent.parent
LAYERS = 6


@dataclass
class Stack:
    collector: Collector
    jaeger: Jaeger
    workdir: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("stack")
    jaeger = Jaeger(workdir)
    try:
        collector = Collector(["otel-collector.yaml"], workdir,
                              {"JAEGER_OTLP_ENDPOINT": jaeger.otlp_endpoint})
        try:
            yield Stack(collector, jaeger, workdir)
        finally:
            collector.stop()
    finally:
        jaeger.stop()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env.update(extra)
    return env


def _attrs(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in items}


def _span_metrics(stack: Stack, service: str, spans: int) -> dict[str, float]:
    """span name → calls, from the Collector's Prometheus exporter, once it has counted
    ``spans`` spans of the service (the connector flushes every few seconds)."""
    def counted() -> dict[str, float] | None:
        text = http_text(f"http://127.0.0.1:{stack.collector.prometheus}/metrics") or ""
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("traces_span_metrics_calls_total{") \
                    and f'service_name="{service}"' in line:
                name = re.search(r'span_name="([^"]+)"', line)
                assert name
                found[name.group(1)] = found.get(name.group(1), 0) + float(line.split()[-1])
        return found if sum(found.values()) >= spans else None
    calls: dict[str, float] = wait_for(f"span metrics of {service}", counted, 30,
                                       stack.collector.proc, stack.collector.log, every_s=0.5)
    return calls


def _one_trace(jaeger: Jaeger, service: str, spans: int) -> dict[str, Any]:
    """The service's only trace, once Jaeger holds ``spans`` spans of it."""
    def ready() -> dict[str, Any] | None:
        traces = jaeger.traces(service)
        if len(traces) == 1 and len(traces[0]["spans"]) >= spans:
            return traces[0]
        return None
    trace: dict[str, Any] = wait_for(f"{service}'s trace in Jaeger", ready, 30,
                                     jaeger.proc, jaeger.log, every_s=0.5)
    return trace


def _parents(trace: dict[str, Any]) -> dict[str, str | None]:
    """span id → its parent's span id (None for the root), from Jaeger's references."""
    out: dict[str, str | None] = {}
    for s in trace["spans"]:
        refs = [r for r in s.get("references", []) if r["refType"] == "CHILD_OF"]
        assert len(refs) <= 1, s
        out[s["spanID"]] = refs[0]["spanID"] if refs else None
        for r in refs:
            assert r["traceID"] == trace["traceID"]
    return out


def test_the_demo_s_proof_is_one_whole_trace_in_jaeger(stack: Stack) -> None:
    service = "stack-demo"
    proc = subprocess.run(
        [sys.executable, "-m", "otel_proofscope", "demo", "--layers", str(LAYERS),
         "--out", str(stack.workdir / "demo"), "--rerun", "off"],
        capture_output=True, text=True, timeout=180, cwd=stack.workdir,
        env=_clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=stack.collector.grpc_endpoint,
                       OTEL_SERVICE_NAME=service))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    m = re.search(r"exported to otlp: (\d+) spans, (\d+) span events", out)
    assert m, out
    sent_spans, sent_events = int(m.group(1)), int(m.group(2))
    assert "dropped: nothing" in out, out

    trace = _one_trace(stack.jaeger, service, sent_spans)
    spans = trace["spans"]
    assert len(spans) == sent_spans
    parents = _parents(trace)
    ids = set(parents)
    roots = [sid for sid, parent in parents.items() if parent is None]
    assert len(roots) == 1
    assert all(p in ids for p in parents.values() if p is not None), "a parent missing"
    by_id = {s["spanID"]: s for s in spans}
    root = by_id[roots[0]]
    assert root["operationName"] == "proof"
    tags = _attrs(root["tags"])
    assert tags["proof.system"] == "gkr"
    assert tags["proof.backend"] == "cpu"
    assert tags["proof.layers"] == LAYERS
    assert tags["proof.verified"] is True
    names = Counter(s["operationName"] for s in spans)
    assert names["proof.layer"] == LAYERS
    assert names["proof.weight_opening"] == tags["proof.weight_openings"]
    assert names["proof.circuit.compile"] == 1
    assert names["proof.verify"] == 1
    layers = [_attrs(s["tags"]) for s in spans if s["operationName"] == "proof.layer"]
    assert sorted(t["proof.layer.index"] for t in layers) == list(range(LAYERS))
    for t in layers:
        assert {"proof.layer.kind", "proof.sumcheck.rounds", "proof.claim.initial",
                "proof.claim.final"} <= set(t)
    # Round events arrive as span logs, one per sumcheck round, witness data kept out.
    logs = [_attrs(log["fields"]) for s in spans for log in s.get("logs", [])]
    rounds = [f for f in logs if f.get("event") == "proof.sumcheck.round"]
    assert len(rounds) == sent_events
    assert sum(t["proof.sumcheck.rounds"] for t in layers) == len(rounds)
    assert all("proof.claim" in f for f in rounds)
    assert not [f for f in logs if f.get("event") in ("proof.layer.activation",
                                                      "proof.attention.heatmap")]

    # The span-metrics connector counted the same spans by name (Prometheus exposition).
    assert _span_metrics(stack, service, sent_spans) == {k: float(v) for k, v in names.items()}


def test_a_plonky3_proof_is_one_whole_trace_in_jaeger(stack: Stack) -> None:
    service = "stack-plonky3"
    proc = subprocess.run(
        [str(peer("plonky3-prover")), "--log-rows", "12"],
        capture_output=True, text=True, timeout=300,
        env=_clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=stack.collector.grpc_endpoint,
                       OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_SERVICE_NAME=service))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Plonky3's own INFO spans (p3-uni-stark, p3-fri), under the program's root.
    wanted = {"plonky3-prover", "prove", "commit to trace data",
              "commit to quotient poly chunks", "open", "FRI prover", "commit phase",
              "query phase", "verify"}
    trace = _one_trace(stack.jaeger, service, len(wanted))
    names = {s["operationName"] for s in trace["spans"]}
    assert wanted <= names, wanted - names
    parents = _parents(trace)
    by_id = {s["spanID"]: s for s in trace["spans"]}
    (root,) = [by_id[sid] for sid, p in parents.items() if p is None]
    assert root["operationName"] == "plonky3-prover"
    assert all(p in parents for p in parents.values() if p is not None), "a parent missing"

    def parent_name(name: str) -> str:
        span = next(s for s in trace["spans"] if s["operationName"] == name)
        parent = parents[span["spanID"]]
        assert parent is not None
        return str(by_id[parent]["operationName"])
    assert parent_name("commit phase") == "FRI prover"
    spans = Counter(s["operationName"] for s in trace["spans"])
    assert _span_metrics(stack, service, len(trace["spans"])) == {
        k: float(v) for k, v in spans.items()}
    assert parent_name("query phase") == "FRI prover"
    assert parent_name("commit to trace data") == "prove_with_preprocessed"
