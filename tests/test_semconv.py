"""The semantic-conventions module is the contract; the doc is generated from it."""

from __future__ import annotations

from pathlib import Path

from otel_proofscope import semconv

DOC = Path(__file__).resolve().parent.parent / "docs" / "semantic-conventions.md"


def test_doc_is_generated_from_the_module() -> None:
    assert DOC.read_text() == semconv.render_markdown(), (
        "docs/semantic-conventions.md is stale: run scripts/gen-semconv-doc")


def test_names_are_unique() -> None:
    metrics = [m.name for m in semconv.Metric.all()]
    assert len(metrics) == len(set(metrics))
    spans = [s.name for s in semconv.SPANS]
    assert len(spans) == len(set(spans))


def test_design_contract_names_present() -> None:
    # A sample straight from DESIGN.md §3, spelled out so a rename fails here.
    metrics = {m.name: m for m in semconv.Metric.all()}
    for name, unit in [("hw.gpu.utilization", "1"), ("hw.gpu.memory.usage", "By"),
                       ("gpu.kernel.duration", "s"), ("gpu.queue.wait.duration", "s"),
                       ("proof.duration", "s"), ("proof.layer.duration", "s"),
                       ("hw.power", "W"), ("hw.energy", "J")]:
        assert metrics[name].unit == unit
    assert "proofscope.dropped" in metrics
    assert {s.name for s in semconv.SPANS} == {
        "proof", "proof.circuit.compile", "proof.layer", "proof.weight_opening",
        "proof.aggregated_binding", "proof.stark", "proof.verify", "proof.witness"}
    assert {"proof.layer.activation", "proof.attention.heatmap"} == semconv.WITNESS_EVENTS


def test_every_duration_histogram_has_seconds_buckets() -> None:
    for m in semconv.Metric.all():
        if m.kind == semconv.InstrumentKind.HISTOGRAM and m.unit == "s":
            assert m.buckets == semconv.SECONDS_BUCKETS, m.name


def test_layer_kind_colours_match_the_seed() -> None:
    assert semconv.layer_kind_colour("MatMul") == 0x429BF5
    assert semconv.layer_kind_colour("Nonsense") == 0x606060
