"""Mapping foreign spans onto the contract: the pure mapper, then configure(map=...) end
to end (OTLP/JSON files + a real .rrd read back + the proof metrics)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from metric_helpers import metric_points
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext, Status, StatusCode

from otel_proofscope.mapping.apply import Mapper
from otel_proofscope.mapping.rules import load_rules, parse_rules
from otel_proofscope.mapping.wiring import MAP_ENV, mapper_for
from otel_proofscope.semconv import Attr, EventName, Metric, SpanName
from otel_proofscope.setup import configure

TRACE = 0x1234_5678_9ABC_DEF0_1234_5678_9ABC_DEF0


def _span(name: str, span_id: int, attrs: dict[str, Any] | None = None,
          events: list[Event] | None = None, trace: int = TRACE, start: int = 1_000,
          end: int = 2_000, status: Status | None = None) -> ReadableSpan:
    return ReadableSpan(name=name, context=SpanContext(trace, span_id, False),
                        resource=Resource({}), attributes=attrs or {}, events=events or [],
                        start_time=start, end_time=end, status=status or Status())


RULES = parse_rules({
    "meta": {"name": "test", "system": "myzk"},
    "span": [
        {"match": "prove", "to": "proof", "attributes": {"proof.backend": "cuda"}},
        {"match_regex": "^layer", "to": "layer", "index_from": "i",
         "kinds": {"layer_mm": "MatMul"}, "copy": {"proof.sumcheck.rounds": "n"}},
        {"match": "check", "to": "verify", "copy": {"proof.verified": "ok"}},
    ],
    "event": [{"match": "round done", "to": "round", "on_regex": "^layer",
               "copy": {"proof.claim": "claim"}}],
})


def test_unmatched_spans_pass_through_as_the_same_object() -> None:
    mapper = Mapper(RULES)
    other = _span("execute", 1, {"cycles": 7})
    assert mapper.map_span(other) is other
    contract = _span(SpanName.LAYER, 2, {Attr.LAYER_INDEX: 0})
    assert mapper.map_span(contract) is contract  # contract spans are never renamed
    assert mapper.stats.total_mapped() == 0 and mapper.stats.spans_seen == 2


def test_a_mapped_span_keeps_everything_but_its_name() -> None:
    mapper = Mapper(RULES)
    status = Status(StatusCode.ERROR, "shard failed")
    src = _span("prove", 9, {"cycles": 100}, status=status)
    out = mapper.map_span(src)
    assert out.name == SpanName.PROOF
    assert out.context == src.context and out.parent == src.parent
    assert (out.start_time, out.end_time) == (src.start_time, src.end_time)
    assert out.status.status_code is StatusCode.ERROR
    assert out.attributes == {"cycles": 100, Attr.PROOF_BACKEND: "cuda",
                              Attr.PROOF_SYSTEM: "myzk", Attr.MAPPING_SOURCE_NAME: "prove",
                              Attr.MAPPING_RULES: "test"}


def test_layer_index_from_attribute_else_occurrence_order_stable_across_sinks() -> None:
    mapper = Mapper(RULES)
    a = _span("layer_mm", 1, {"i": 7, "n": 3})
    b = _span("layer_add", 2, {})  # no index attribute: first in occurrence order
    c = _span("layer_add", 3, {"i": "not a number"})
    other_trace = _span("layer_add", 4, {}, trace=TRACE + 1)
    first = [mapper.map_span(s) for s in (a, b, c, other_trace)]
    again = [mapper.map_span(s) for s in (a, b, c, other_trace)]  # a second sink
    for out in (first, again):
        assert [s.attributes[Attr.LAYER_INDEX] for s in out] == [7, 0, 1, 0]
        assert [s.attributes[Attr.LAYER_KIND] for s in out] == ["MatMul", "Unknown",
                                                              "Unknown", "Unknown"]
    assert first[0].attributes[Attr.SUMCHECK_ROUNDS] == 3
    # b, c and other_trace have no usable "i": each counted once though mapped twice
    assert mapper.stats.index_fallbacks == 3
    assert mapper.stats.spans_mapped == {SpanName.LAYER: 4}


def test_round_events_numbered_within_their_span() -> None:
    mapper = Mapper(RULES)
    events = [Event("round done", {"claim": "5"}, 1_100), Event("log", {"m": "x"}, 1_150),
              Event("round done", {"claim": "(1,2,3,4)"}, 1_200)]
    out = mapper.map_span(_span("layer_mm", 1, {"i": 0}, events))
    rounds = [e for e in out.events if e.name == EventName.SUMCHECK_ROUND]
    assert [e.attributes[Attr.SUMCHECK_ROUND] for e in rounds] == [0, 1]
    assert [e.attributes[Attr.CLAIM] for e in rounds] == ["5", "(1,2,3,4)"]
    assert [e.timestamp for e in rounds] == [1_100, 1_200]
    assert [e.name for e in out.events][1] == "log"
    # the same event on a span the rule's "on" excludes is left alone
    untouched = _span("prove", 2, {}, [Event("round done", {}, 1_100)])
    assert [e.name for e in mapper.map_span(untouched).events] == ["round done"]


def test_mapper_for_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert mapper_for(None) is None
    monkeypatch.setenv(MAP_ENV, "jolt")
    mapper = mapper_for(None)
    assert mapper is not None and mapper.rules.label == "jolt"
    assert mapper_for(None, use_env=False) is None


def _sp1_like_proof(tracer: Any) -> int:
    """An SP1-shaped trace (span names from the sp1 preset's sources) as a foreign prover
    instrumented with plain OpenTelemetry would emit it."""
    with tracer.start_as_current_span("prove_core") as root:
        with tracer.start_as_current_span("setup"):
            pass
        with tracer.start_as_current_span("execute", attributes={"cycles": 12_345}):
            pass
        for shard in range(4):
            with tracer.start_as_current_span("prove_shard") as span:
                with tracer.start_as_current_span("open multi batches"):
                    pass
                if shard == 3:
                    span.set_status(Status(StatusCode.ERROR, "opening failed"))
        with tracer.start_as_current_span("compress"):
            pass
        with tracer.start_as_current_span("verify"):
            pass
        trace_id: int = root.get_span_context().trace_id
    return trace_id


def test_configure_map_turns_a_foreign_trace_into_the_walk(tmp_path: Path) -> None:
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    from otel_proofscope.rerun.readback import read

    rrd = tmp_path / "sp1.rrd"
    reader = InMemoryMetricReader()
    telemetry = configure(service_name="sp1-like", out_dir=tmp_path, set_global=False,
                          rerun=f"file:{rrd}", handle_sigterm=False,
                          metric_readers=[reader], map="sp1")
    tracer = telemetry.tracer_provider.get_tracer("sp1-like")
    trace_id = _sp1_like_proof(tracer)
    points = metric_points(reader)
    telemetry.shutdown()

    spans = [s for line in (tmp_path / "traces.jsonl").read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    names = sorted(s["name"] for s in spans)
    assert names == sorted([SpanName.PROOF, SpanName.CIRCUIT_COMPILE, "execute",
                            *[SpanName.LAYER] * 4, *[SpanName.WEIGHT_OPENING] * 4,
                            SpanName.STARK, SpanName.VERIFY])
    layers = [s for s in spans if s["name"] == SpanName.LAYER]
    attrs = [{a["key"]: a["value"] for a in s["attributes"]} for s in layers]
    assert sorted(int(a[Attr.LAYER_INDEX]["intValue"]) for a in attrs) == [0, 1, 2, 3]
    assert {a[Attr.MAPPING_SOURCE_NAME]["stringValue"] for a in attrs} == {"prove_shard"}
    assert {a[Attr.MAPPING_RULES]["stringValue"] for a in attrs} == {"sp1"}

    # the proof metrics behind the Grafana proof dashboards
    layer_points = points[Metric.PROOF_LAYER_DURATION.name]
    assert sum(p.count for p in layer_points) == 4
    assert {p.attributes[Attr.PROOF_SYSTEM] for p in layer_points} == {"sp1"}
    assert sum(p.count for p in points[Metric.PROOF_DURATION.name]) == 1

    rec = read(rrd)
    p = f"{trace_id:032x}"[:8]
    nodes = rec.rows("gkr/walk/nodes")
    assert len(nodes) == 8  # each of the 4 layers: one row as it starts, one as it ends
    assert f"gkr/walk/{p}/cursor" in rec.entities or f"/gkr/walk/{p}/cursor" in rec.entities
    entities = {e.lstrip("/") for e in rec.entities}
    assert f"proof/layer_seconds/{p}/Unknown" in entities
    assert f"logs/stark/{p}" in entities and f"logs/weights/{p}" in entities
    failed = [r for r in rec.rows(f"logs/gkr/{p}")
              if "FAILED" in str(r.values.get("TextLog:text"))]
    assert len(failed) == 1 and "opening failed" in str(failed[0].values["TextLog:text"])


def test_load_rules_label_for_a_file(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_text("[[span]]\nmatch = 'a'\nto = 'proof'\n")
    rules = load_rules(path)
    assert rules.label == str(path) and rules.meta.name == "x"


def test_the_documented_example_maps_layers_rounds_and_verdict(tmp_path: Path) -> None:
    """docs/mapping.md's worked example: examples/mapping/ (rules + a plain-OTel prover)."""
    pytest.importorskip("rerun", reason="rerun-sdk is not installed")
    import importlib.util

    from otel_proofscope.rerun.readback import read

    root = Path(__file__).resolve().parent.parent / "examples" / "mapping"
    spec = importlib.util.spec_from_file_location("foreign_prover", root / "foreign_prover.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    rrd = tmp_path / "walk.rrd"
    reader = InMemoryMetricReader()
    telemetry = configure(out_dir=tmp_path, set_global=False, rerun=f"file:{rrd}",
                          handle_sigterm=False, metric_readers=[reader],
                          map=str(root / "myprover.toml"))
    trace_id = example.prove(telemetry.tracer_provider.get_tracer("myprover"))
    points = metric_points(reader)
    telemetry.shutdown()

    assert sum(p.value for p in points[Metric.PROOF_SUMCHECK_ROUND_COUNT.name]) == 20
    kinds = {p.attributes[Attr.LAYER_KIND] for p in points[Metric.PROOF_LAYER_DURATION.name]}
    assert kinds == {"MatMul", "Activation", "Add"}
    verdicts = points[Metric.PROOF_VERIFY_COUNT.name]
    assert [(p.attributes[Attr.PROOF_VERIFIED], p.value) for p in verdicts] == [(True, 1)]

    rec = read(rrd)
    p = f"{trace_id:032x}"[:8]
    entities = {e.lstrip("/") for e in rec.entities}
    assert len(rec.rows("gkr/walk/nodes")) == 8
    assert {f"gkr/claim/{p}", f"gkr/remaining/{p}", f"proof/layer_seconds/{p}/MatMul",
            f"circuit/{p}/backbone"} <= entities
    assert len(rec.rows(f"gkr/claim/{p}")) == 20  # one fingerprint per round event


_names = st.sampled_from(["prove", "layer_mm", "layer_add", "check", "execute",
                          SpanName.LAYER, "round done", ""])
_values = st.one_of(st.integers(-5, 2**64), st.text(max_size=4), st.booleans(),
                    st.floats(allow_nan=True), st.none())
_attrs = st.dictionaries(st.sampled_from(["i", "n", "ok", "claim", "x"]), _values, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_names, _attrs, st.lists(st.tuples(_names, _attrs), max_size=4),
                          st.integers(1, 3)), max_size=12))
def test_arbitrary_spans_map_without_raising(specs: list[Any]) -> None:
    mapper = Mapper(RULES)
    spans = [_span(name, n + 1, {k: v for k, v in attrs.items() if v is not None},
                   [Event(en, {k: v for k, v in ea.items() if v is not None}, 1_500)
                    for en, ea in events], trace=TRACE + t)
             for n, (name, attrs, events, t) in enumerate(specs)]
    out = mapper.map_spans(spans)
    again = mapper.map_spans(spans)
    assert len(out) == len(spans)
    for src, a, b in zip(spans, out, again, strict=True):
        assert a.context == src.context and len(a.events) == len(src.events)
        assert (a.name, dict(a.attributes or {})) == (b.name, dict(b.attributes or {}))
        if a is src:
            continue
        assert mapper.map_span(a) is a  # a contract span is never mapped again
        if a.name == SpanName.LAYER:
            index = a.attributes[Attr.LAYER_INDEX]
            assert isinstance(index, int) and index >= 0
    assert mapper.stats.spans_seen == len(spans)
    assert mapper.stats.total_mapped() == sum(1 for s in out if Attr.MAPPING_RULES in
                                              (s.attributes or {}))


def test_round_spans_become_events_of_their_parent_layer() -> None:
    """Jolt opens one span per round (compute_quadratic) under the layer span."""
    from opentelemetry.trace import SpanContext as Ctx

    mapper = Mapper(load_rules("jolt"))
    layer_id = 100
    parent = Ctx(TRACE, layer_id, False)

    def child(span_id: int, end: int) -> ReadableSpan:
        return ReadableSpan(name="compute_quadratic", context=Ctx(TRACE, span_id, False),
                            parent=parent, resource=Resource({}), start_time=end - 10,
                            end_time=end)

    rounds = [child(7, 1_300), child(5, 1_100), child(6, 1_200)]  # any arrival order
    assert [mapper.map_span(c) for c in rounds] == rounds  # the spans themselves stay
    layer = _span("prove_batch_opening_reduction", layer_id, start=1_000, end=1_400)
    first, second = mapper.map_span(layer), mapper.map_span(layer)  # two sinks
    for out in (first, second):
        assert out.name == SpanName.LAYER
        assert out.attributes[Attr.LAYER_KIND] == "OpeningReduction"
        assert [(e.name, e.attributes[Attr.SUMCHECK_ROUND], e.timestamp) for e in out.events] \
            == [(EventName.SUMCHECK_ROUND, 0, 1_100), (EventName.SUMCHECK_ROUND, 1, 1_200),
                (EventName.SUMCHECK_ROUND, 2, 1_300)]
        assert {e.attributes[Attr.MAPPING_SOURCE_NAME] for e in out.events} == \
            {"compute_quadratic"}
    assert mapper.stats.round_spans == 3
    # a layer without round spans gets none
    other = mapper.map_span(_span("Sumcheck.prove", 101))
    assert other.name == SpanName.LAYER and not other.events
