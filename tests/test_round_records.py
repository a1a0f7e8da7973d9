"""Sumcheck rounds recorded as compact records (otlp.deferred_events) read back exactly as
rounds recorded through the SDK's ``span.add_event``: same events, timestamps, drop
counts and OTLP wire bytes, whatever the inputs, limits and interleaved user events."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import opentelemetry.sdk.trace as sdk_trace
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope import fields, instrumentation
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS, REJECTIONS
from otel_proofscope.otlp import deferred_events as deferred_module
from otel_proofscope.otlp import encode as otlp_encode
from otel_proofscope.otlp import sdk_fields
from otel_proofscope.otlp.deferred_events import DeferredEvents
from otel_proofscope.otlp.encode import encode_export_request as encode_spans_request
from otel_proofscope.semconv import Attr, EventName, SpanName

# ── random round calls ───────────────────────────────────────────────────────────────

_FELT = st.integers(min_value=0, max_value=2**70)
_LIMBS = st.tuples(_FELT, _FELT, _FELT, _FELT)
_U64 = st.integers(min_value=0, max_value=2**64 - 1)
# Past sys.get_int_max_str_digits() (4300), str() raises: rejected as before, at the call.
_HUGE = st.sampled_from([10**5000, -(10**5000), (1, 10**5000), 10**650, (10**650, 1)])
_BAD = st.sampled_from(["x", True, 1.5, None, (), (1, "a"), [1, [2]], -1.0, b"b"])
_ELEMENT = st.one_of(_FELT, _LIMBS, st.lists(_FELT, min_size=1, max_size=4),
                     st.integers(min_value=-5, max_value=-1), _BAD, _HUGE)


def _polys() -> st.SearchStrategy[Any]:
    ints = st.lists(_FELT, min_size=1, max_size=5)
    limbs = st.lists(_LIMBS, min_size=1, max_size=5)
    return st.one_of(
        ints, ints.map(tuple), limbs, limbs.map(tuple),
        st.lists(_HUGE, min_size=1, max_size=2),
        limbs.map(lambda p: [list(c) for c in p]),               # limb lists (mutable)
        st.lists(_U64, min_size=1, max_size=5).map(               # numpy coefficients
            lambda p: np.array(p, dtype=np.uint64)),
        st.lists(st.tuples(_U64, _U64), min_size=1, max_size=5).map(  # numpy limb rows
            lambda p: np.array(p, dtype=np.uint64)),
        st.lists(_ELEMENT, min_size=0, max_size=4),              # mixed, bad, empty
        st.just(7), st.just("poly"))


def _maybe_lazy(value: Any, lazy: bool) -> Any:
    return (lambda: value) if lazy else value


@st.composite
def _round_call(draw: st.DrawFn) -> tuple[str, tuple[Any, ...]]:
    index = draw(st.one_of(st.integers(min_value=0, max_value=12), st.just(-1),
                           st.just(True), st.just(np.int64(3)), st.just("2")))
    poly = draw(_polys())
    claim = draw(st.one_of(st.none(), _ELEMENT))
    challenge = draw(st.one_of(st.none(), _ELEMENT))
    degree = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=4), st.just(-2),
                            st.just("3")))
    lazy = draw(st.booleans())
    return "round", (index, _maybe_lazy(poly, lazy), _maybe_lazy(claim, lazy), degree,
                     _maybe_lazy(challenge, lazy and draw(st.booleans())))


_USER_EVENT = st.tuples(st.just("user"), st.tuples(
    st.sampled_from(["user.mark", "gpu.note"]),
    st.dictionaries(st.sampled_from(["a", "b", "c"]),
                    st.one_of(st.integers(0, 9), st.text(max_size=6),
                              st.lists(st.text(max_size=3), max_size=3)), max_size=3)))
_OPS = st.lists(st.one_of(_round_call(), _round_call(), _USER_EVENT), max_size=25)
_LIMITS = st.builds(
    SpanLimits,
    max_events=st.one_of(st.none(), st.just(SpanLimits.UNSET),
                         st.integers(min_value=1, max_value=12)),
    max_event_attributes=st.one_of(st.none(), st.just(SpanLimits.UNSET),
                                   st.integers(min_value=1, max_value=7)),
    max_attribute_length=st.one_of(st.none(), st.integers(min_value=1, max_value=8)))


# ── the two paths under one deterministic clock ──────────────────────────────────────

@contextmanager
def _clock() -> Iterator[None]:
    """Every timestamp, the SDK's and the round records', from one counter: both paths
    take them at the same calls, so equal timestamps mean equal call order."""
    ticks = itertools.count(1_700_000_000_000_000_000, 1_000)
    now: Callable[[], int] = ticks.__next__
    with mock.patch.object(sdk_trace, "time_ns", now), \
            mock.patch.object(instrumentation.time, "time_ns", now):
        yield


def _run(ops: Sequence[tuple[str, tuple[Any, ...]]], limits: SpanLimits, cap: int | None,
         deferred: bool) -> tuple[list[ReadableSpan], dict[Any, int], dict[Any, int], bool]:
    DROPS.reset()
    REJECTIONS.reset()
    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    instrumentation.set_max_events_per_span(cap)
    installed = False
    patch = (mock.patch.object(instrumentation, "deferred_events", lambda *a: None)
             if not deferred else mock.patch.object(instrumentation, "time", instrumentation.time))
    try:
        with _clock(), patch, tracer.proof(system="gkr", backend="cpu"), \
                tracer.layer(index=0, kind="MatMul", rounds=10) as layer:
            installed = type(layer.span._events) is DeferredEvents  # type: ignore[attr-defined]
            for kind, args in ops:
                if kind == "round":
                    tracer.sumcheck_round(*args)
                else:
                    layer.span.add_event(*args)
    finally:
        instrumentation.set_max_events_per_span(None)
    return (list(memory.get_finished_spans()), dict(DROPS.snapshot()),
            dict(REJECTIONS.snapshot()), installed)


def _events(span: ReadableSpan) -> list[tuple[Any, ...]]:
    return [(e.name, e.timestamp, dict(e.attributes or {}), e.dropped_attributes)
            for e in span.events]


def _wire(spans: Sequence[ReadableSpan]) -> bytes:
    return encode_spans(spans).SerializeToString()  # type: ignore[no-any-return]


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=_OPS, limits=_LIMITS, cap=st.one_of(st.none(), st.integers(1, 10)))
def test_records_read_back_exactly_as_add_event(ops: list[tuple[str, tuple[Any, ...]]],
                                                limits: SpanLimits, cap: int | None) -> None:
    new, new_drops, new_rejections, installed = _run(ops, limits, cap, deferred=True)
    old, old_drops, old_rejections, plain = _run(ops, limits, cap, deferred=False)
    assert installed and not plain
    # Read before anything builds the events: the encoder and the witness filter read
    # the records themselves.
    from_records = encode_spans_request([new[0]])
    names = sdk_fields.event_names(sdk_fields.span_events_unread(new[0]))
    assert names == [e.name for e in old[0].events]
    assert [s.name for s in new] == [s.name for s in old] == [SpanName.LAYER, SpanName.PROOF]
    for a, b in zip(new, old, strict=True):
        assert _events(a) == _events(b)
        assert a.dropped_events == b.dropped_events
    assert new_drops == old_drops
    assert new_rejections == old_rejections
    # Span ids differ between the runs; the encoders see the same spans otherwise.
    layer_new, layer_old = new[0], old[0]
    layer_old._context = layer_new._context  # type: ignore[attr-defined]
    layer_old._parent = layer_new._parent  # type: ignore[attr-defined]
    layer_old._start_time = layer_new._start_time  # type: ignore[attr-defined]
    assert _wire([layer_new]) == _wire([layer_old])
    assert encode_spans_request([layer_new]) == encode_spans_request([layer_old])
    assert encode_spans_request([layer_new]) == _wire([layer_new]) == from_records


@pytest.mark.parametrize("deferred", [True, False], ids=["as-records", "formatted"])
def test_the_encoder_writes_round_records_without_building_them(deferred: bool) -> None:
    """The OTLP encoder writes a record's event straight from it (otlp.round_records):
    nothing built, and the very bytes the official encoder writes for the built events."""
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("round", (i, [i, 2**61 - i, 7], (1, 2, 3, 4), None, 5 * i)) for i in range(2)]
    calls.append(("round", (2, [(7, 8), (9, 2**31 - 1)], 6, 1, (0, 1))))  # limbs
    calls.insert(1, ("user", ("user.mark", {"a": 1})))
    calls.append(("round", (3, ["x"], None, None, None)))  # refused: an error event
    spans, *_ = _run(calls, SpanLimits(), None, True)
    layer = spans[0]
    store = layer._events  # type: ignore[attr-defined]
    assert type(store) is DeferredEvents
    if not deferred:  # rounds the prover formatted itself (a value it could not defer)
        store._dq = type(store._dq)(
            [(*x[:3], tuple(map(fields.canonical, x[3])), fields.canonical(x[4]),
              fields.canonical(x[5]), x[6], False) if type(x) is tuple and x[7] else x
             for x in store._dq])
    assert [x[7] for x in store._dq if type(x) is tuple] == [deferred] * 3
    written = encode_spans_request([layer])
    assert store.fields_if_built() is None and store._pending == 3
    assert written == _wire([layer])


def test_a_record_the_direct_encoder_refuses_is_encoded_from_its_event() -> None:
    """A round beyond int64 (the official encoder skips that attribute): the span is
    encoded from its built events, as before."""
    spans, *_ = _run([("round", (0, [1, 2], 3, None, None))], SpanLimits(), None, True)
    layer = spans[0]
    store = layer._events  # type: ignore[attr-defined]
    store._dq = type(store._dq)([(x[0], 2**64, *x[2:]) for x in store._dq])
    written = encode_spans_request([layer])
    assert store.fields_if_built() is not None  # built: the generic path read them
    assert written == _wire([layer])


def test_an_int_too_long_to_print_is_rejected_at_the_call() -> None:
    spans, _, rejections, installed = _run(
        [("round", (0, [1, 10**5000], 3, None, None)), ("round", (1, [1], (2, -(10**5000)),
                                                                  None, None))],
        SpanLimits(), None, True)
    assert installed
    assert rejections == {("poly/claim/challenge", "not_a_field_element"): 2}
    errors = [ev.attributes[Attr.ERROR_TYPE] for ev in spans[0].events]  # type: ignore[index]
    assert errors == ["invalid_field_element"] * 2


def test_a_callers_mutation_after_the_call_changes_nothing() -> None:
    spans, *_ = _run([("round", (0, [1, 2], [3, 4], None, None))], SpanLimits(), None, True)
    poly, claim = [[1, 2], [3, 4]], [5, 6]
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    array = np.array([[1, 2], [3, 4]], dtype=np.uint64)
    limbs = [(1, 2), (3, 4)]
    # An object array's tolist() hands back the caller's own inner lists.
    inner = [[1, 2], [3, 4]]
    objects = np.empty(2, dtype=object)
    objects[0], objects[1] = inner
    with tracer.layer(index=0, kind="MatMul", rounds=4):
        tracer.sumcheck_round(0, poly, claim)
        tracer.sumcheck_round(1, array, (9, 9))
        tracer.sumcheck_round(2, limbs, 3)
        tracer.sumcheck_round(3, objects, 3)
        poly[0][0], claim[0], array[0, 0], limbs[0] = 100, 100, 100, (100, 100)
        inner[0][0] = 100
    [layer] = memory.get_finished_spans()
    polys = [ev.attributes[Attr.SUMCHECK_POLY] for ev in layer.events]  # type: ignore[index]
    assert polys == [("(1,2)", "(3,4)")] * 4
    assert layer.events[0].attributes[Attr.CLAIM] == "(5,6)"  # type: ignore[index]
    assert spans[0].events[0].attributes[Attr.SUMCHECK_POLY] == ("1", "2")  # type: ignore[index]


def _prove(tracer: ProofTracer, layers: int = 3, rounds: int = 4) -> None:
    with tracer.proof(system="gkr", backend="cpu", layers=layers):
        for i in range(layers):
            with tracer.layer(index=i, kind="MatMul", rounds=rounds) as layer:
                for r in range(rounds):
                    tracer.sumcheck_round(r, ((r, 1, 2, 3), (4, 5, 6, 7)), (i, r, 0, 1),
                                          challenge=(r, 9, 9, 9))
                    if r == 1:
                        layer.span.add_event("user.mark", {"r": r})


def test_every_reader_sees_the_rounds() -> None:
    """InMemorySpanExporter, the official encoder, the fast one, copies, indexing."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _prove(ProofTracer(provider))
    layers = [s for s in memory.get_finished_spans() if s.name == SpanName.LAYER]
    assert len(layers) == 3
    for span in layers:
        names = [e.name for e in span.events]
        assert names == [EventName.SUMCHECK_ROUND] * 2 + ["user.mark"] + \
            [EventName.SUMCHECK_ROUND] * 2
        assert span.events[0].attributes[Attr.SUMCHECK_CHALLENGE] == "(0,9,9,9)"  # type: ignore[index]
        store = span._events  # type: ignore[attr-defined]
        assert type(store) is DeferredEvents
        assert store[-1].name == EventName.SUMCHECK_ROUND and len(store) == 5
        clone = copy.deepcopy(store)
        assert [e.name for e in clone] == names and clone.dropped == 0
    request = encode_spans(layers)
    got = [e.name for rs in request.resource_spans for ss in rs.scope_spans
           for s in ss.spans for e in s.events]
    assert got.count(EventName.SUMCHECK_ROUND) == 12
    assert encode_spans_request(layers) == request.SerializeToString()


def test_rerun_exporter_draws_the_same_rounds_from_records(tmp_path: Path) -> None:
    from otel_proofscope.rerun import readback
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    def rounds(deferred: bool, path: Path) -> list[Any]:
        memory = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(memory))
        patch = (mock.patch.object(instrumentation, "deferred_events", lambda *a: None)
                 if not deferred else mock.patch.object(instrumentation, "time",
                                                        instrumentation.time))
        with _clock(), patch:
            _prove(ProofTracer(provider))
        exporter = RerunSpanExporter(f"file:{path}")
        exporter.export(memory.get_finished_spans())
        assert exporter.force_flush(30_000)
        exporter.shutdown()
        rec = readback.read(path)
        return [(r.times, r.values) for path_ in sorted(rec.paths())
                if "/claim/" in path_ for r in rec.rows(path_)]

    new, old = rounds(True, tmp_path / "new.rrd"), rounds(False, tmp_path / "old.rrd")
    assert len(new) == 12
    assert new == old


def test_late_rounds_on_an_ended_span_are_dropped_as_the_sdk_drops_them() -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    with tracer.layer(index=0, kind="MatMul", rounds=3):
        state = instrumentation._current_layer.get()
        tracer.sumcheck_round(0, (1, 2), 3)
    assert state is not None and state.rounds is not None
    # A thread that copied the context before the layer closed, calling late.
    instrumentation._record_round(state, 1, (1, 2), 3, None)
    [layer] = memory.get_finished_spans()
    assert len(layer.events) == 1


def test_spans_that_cannot_take_records_keep_add_event() -> None:
    class Custom(sdk_trace.Span):
        def add_event(self, *args: Any, **kwargs: Any) -> None:
            super().add_event(*args, **kwargs)

    span = Custom("x", None)
    span.start()
    assert sdk_fields.deferred_events(span, lambda r: ("e", {})) is None
    sdk_tracer = TracerProvider().get_tracer("t")
    plain = sdk_tracer.start_span("y")
    assert sdk_fields.deferred_events(plain, lambda r: ("e", {})) is not None
    assert sdk_fields.deferred_events(plain, lambda r: ("e", {})) is None  # already has one
    plain.end()
    ended = sdk_tracer.start_span("z")
    ended.end()
    assert sdk_fields.deferred_events(ended, lambda r: ("e", {})) is None
    # A no-op tracer's spans record nothing either way.
    tracer = ProofTracer(instrumentation.trace.NoOpTracerProvider())
    with tracer.layer(index=0, kind="MatMul", rounds=1):
        tracer.sumcheck_round(0, (1,), 1)


def test_concurrent_readers_and_a_writer_agree() -> None:
    """Export threads read while the prover appends: every read is a prefix-consistent
    list of real events, and the final read holds every record once, in order."""
    span = TracerProvider(span_limits=SpanLimits(max_events=SpanLimits.UNSET)).get_tracer(
        "t").start_span("live")
    store = sdk_fields.deferred_events(span, lambda r: ("r", {"i": r[1]}))
    assert store is not None
    stop = threading.Event()
    bad: list[str] = []

    def read() -> None:
        while not stop.is_set():
            seen = [e.attributes["i"] for e in store.events()]
            if seen != list(range(len(seen))):
                bad.append(repr(seen[:10]))

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(3000):
        assert store.add((i + 1, i), span)
    stop.set()
    for t in readers:
        t.join()
    span.end()
    assert not bad
    assert [e.attributes["i"] for e in span.events] == list(range(3000))  # type: ignore[index]
    assert deferred_module.DeferredEvents is DeferredEvents


@contextmanager
def _where_events_are_built() -> Iterator[list[str]]:
    """The name of the thread each round event is built on, in this process."""
    built: list[str] = []
    real = DeferredEvents._event

    def spy(self: DeferredEvents, record: tuple[Any, ...]) -> Any:
        built.append(threading.current_thread().name)
        return real(self, record)

    with mock.patch.object(DeferredEvents, "_event", spy):
        yield built


def _prove_three_layers(tracer: ProofTracer) -> None:
    with tracer.proof(system="gkr", backend="cpu", layers=3):
        for index in range(3):
            with tracer.layer(index=index, kind="MatMul", rounds=4):
                for r in range(4):
                    tracer.sumcheck_round(r, poly=[(1, 2, 3, 4)], claim=(r, 0, 0, 0))


def test_ending_a_layer_builds_no_event_on_the_prover_thread(tmp_path: Path) -> None:
    """configure()'s processors size each span as it ends (the byte bound): reading
    ``span.events`` there built every round's Event on the prover thread, ~4 µs a round,
    which the records exist to move to the export threads."""
    import otel_proofscope as ps

    telemetry = ps.configure(out_dir=str(tmp_path), rerun=f"file:{tmp_path / 'r.rrd'}",
                             shutdown_timeout_s=2.0, set_global=False)
    prover = threading.current_thread().name
    try:
        with _where_events_are_built() as built_on:
            _prove_three_layers(telemetry.tracer)
            built_here = built_on.count(prover)
            assert telemetry.force_flush(10)
    finally:
        telemetry.shutdown()
    assert built_here == 0
    # Nor anywhere else: the files route and the Rerun view read the records' fields;
    # the 12 rounds are in the file all the same.
    assert built_on == []
    text = (tmp_path / "traces.jsonl").read_text(encoding="utf-8")
    assert text.count('"name":"proof.sumcheck.round"') == 12


@pytest.mark.parametrize("route", [{}, {"export_process": False}],
                         ids=["export-process", "otlp-here-rerun-in-child"])
def test_the_child_routes_build_no_event_in_the_provers_process(
        tmp_path: Path, monkeypatch: Any, route: dict[str, bool]) -> None:
    """With OTLP and the Rerun view in the export process (configure()'s default with
    Rerun on), the prover's process only packs: the round records cross unbuilt and the
    child builds their events (counting a batch's events for the accounting built them
    all here before). With the Rerun view alone in the child (``export_process=False``),
    OTLP encodes the records here and they cross unbuilt too."""
    import socket

    import otel_proofscope as ps

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: the child's OTLP export fails, counted there
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    telemetry = ps.configure(rerun=f"file:{tmp_path / 'r.rrd'}", shutdown_timeout_s=2.0,
                             set_global=False, **route)
    try:
        with _where_events_are_built() as built:
            _prove_three_layers(telemetry.tracer)
            telemetry.force_flush(5)
            assert built == []
    finally:
        report = telemetry.shutdown()
    # The view got them: drawn by the child (or the loss is counted, never silent).
    assert "rerun" in " ".join(report.lines())


@pytest.mark.parametrize("rerun", [False, True], ids=["otlp", "otlp+rerun-thread"])
def test_the_in_process_routes_read_rounds_without_building_them(
        tmp_path: Path, monkeypatch: Any, rerun: bool) -> None:
    """The witness filter reads the records' names, the OTLP encoder and both Rerun
    translations their fields: an ``Event`` per round cost the export threads, which
    share the GIL with the prover, ~2 µs a round for nothing. (The in-thread Rerun
    exporter is no configure() route since issue 29; it is given explicitly here.)"""
    import socket

    import otel_proofscope as ps
    from otel_proofscope.pipeline.privacy import local
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: the export fails after encoding, counted
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    extra = [("rerun", local(RerunSpanExporter(f"file:{tmp_path / 'r.rrd'}")))] \
        if rerun else []
    telemetry = ps.configure(rerun="off", span_exporters=extra,
                             shutdown_timeout_s=1.0, set_global=False)
    with _where_events_are_built() as built:
        try:
            _prove_three_layers(telemetry.tracer)
            telemetry.force_flush(5)  # False: the collector is dead (counted below)
        finally:
            report = telemetry.shutdown()
    assert built == []
    summary = " ".join(report.lines())
    assert "otlp" in summary
    if rerun:  # the view was drawn, from the records: 3 layers of 4 rounds
        from otel_proofscope.rerun import readback

        rec = readback.read(tmp_path / "r.rrd")
        assert sum(len(rec.rows(p)) for p in rec.paths() if "/claim/" in p) == 12


def _prove_with_witness(tracer: ProofTracer) -> None:
    from otel_proofscope.instrumentation import ActivationStats

    with tracer.proof(system="gkr", backend="cpu", layers=3):
        for index in range(3):
            with tracer.layer(index=index, kind="MatMul", rounds=4):
                for r in range(4):
                    tracer.sumcheck_round(r, poly=[2**61 - r, r + 1], claim=7919 * r)
                    if r == 1:  # a witness event among the rounds
                        tracer.layer_activation(ActivationStats(0.5, 1.0, -2.0, 3.0, 0.1))


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([{}, {"max_events": 3}, {"max_event_attributes": 2}]))
def test_stripping_witness_events_keeps_the_rounds_as_records(limits: dict[str, int]) -> None:
    """capture_witness puts a witness event in every layer: the OTLP copy without it
    keeps the rounds as records and shares their fields with the original, so no round
    is built for it, and the bytes are those of the old copy of built events."""
    from otel_proofscope.pipeline.privacy import strip_witness

    def layers(spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
        return [s for s in spans if s.name == SpanName.LAYER]

    memory = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(**limits))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrumentation.set_capture_witness(True)
    try:
        _prove_with_witness(ProofTracer(provider))
    finally:
        instrumentation.set_capture_witness(False)
    spans = layers(memory.get_finished_spans())
    calls = []
    for s in spans:  # count the records' builds, originals and copies together
        real = s._events._build  # type: ignore[attr-defined]
        s._events._build = lambda r, real=real: calls.append(r) or real(r)  # type: ignore[attr-defined]
        # The encoder knows a builder by identity: the counting one writes as the real.
        otlp_encode._RECORD_ENCODERS[s._events._build] = \
            otlp_encode._RECORD_ENCODERS[real]  # type: ignore[attr-defined]
    records = sum(1 for s in spans for x in s._events.items()  # type: ignore[attr-defined]
                  if type(x) is tuple)
    with _where_events_are_built() as built:
        stripped = [strip_witness(s) for s in spans]
        ours = encode_spans_request(stripped)
        for s in spans:  # the original's other readers (the Rerun view) read them too
            sdk_fields.events_fields(sdk_fields.span_events_unread(s))
    if "max_event_attributes" not in limits:  # (under it the SDK's constructor truncates)
        assert built == []
        # Built once, for the original's reader; the copy's OTLP bytes are written
        # from the records themselves.
        assert len(calls) == records
        assert all(sdk_fields.unbuilt_events(s) is not None for s in stripped)
        assert all(s._events.fields_if_built() is None  # type: ignore[attr-defined]
                   for s in stripped)
    for a, b in zip(spans, stripped, strict=True):
        assert b is not a and b.dropped_events == a.dropped_events
        assert [(e.name, e.timestamp, dict(e.attributes or {})) for e in b.events] == [
            (e.name, e.timestamp, dict(e.attributes or {})) for e in a.events
            if e.name != EventName.LAYER_ACTIVATION]
    assert ours == _wire(stripped)  # the official encoder, on the copies' SDK events


def test_witness_capture_builds_no_round_event_on_the_files_and_rerun_routes(
        tmp_path: Path) -> None:
    """With capture_witness, every layer has a witness event among its rounds: the
    witness filter of the files route and the Rerun view's round loop set it aside
    without building the rounds, the view draws it, and the file does not carry it.
    (The in-thread Rerun exporter, given explicitly: no configure() route since issue
    29, and the spy sees only this process.)"""
    import otel_proofscope as ps
    from otel_proofscope.pipeline.privacy import local
    from otel_proofscope.rerun import readback
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    view = RerunSpanExporter(f"file:{tmp_path / 'r.rrd'}", capture_witness=True)
    telemetry = ps.configure(out_dir=str(tmp_path), rerun="off",
                             span_exporters=[("rerun", local(view))],
                             capture_witness=True, shutdown_timeout_s=2.0,
                             set_global=False)
    try:
        with _where_events_are_built() as built:
            _prove_with_witness(telemetry.tracer)
            assert telemetry.force_flush(10)
    finally:
        telemetry.shutdown()
        instrumentation.set_capture_witness(False)
    assert built == []
    text = (tmp_path / "traces.jsonl").read_text(encoding="utf-8")
    assert text.count('"name":"proof.sumcheck.round"') == 12
    assert EventName.LAYER_ACTIVATION not in text
    rec = readback.read(tmp_path / "r.rrd")
    assert sum(len(rec.rows(p)) for p in rec.paths() if "/claim/" in p) == 12
    stats = [p for p in rec.paths() if p.startswith("/inference/stats/")]
    assert sum(len(rec.rows(p)) for p in stats) == 15  # 3 layers x 5 statistics


def test_the_childs_frame_loop_and_backlog_build_no_round_event(tmp_path: Path) -> None:
    """A child counts each frame's events for its accounting; reading ``span.events``
    for that built every round's ``Event`` in the child (11 % of the export process's
    CPU in a round-heavy burst), which its OTLP encoder and Rerun translation never
    need: they read the records' fields."""
    import io

    from otel_proofscope.ledger import DropLedger
    from otel_proofscope.rerun import span_wire
    from otel_proofscope.rerun.backlog import PackedBacklog
    from otel_proofscope.rerun.sink import RerunSink
    from otel_proofscope.rerun.target import parse_target
    from otel_proofscope.rerun.worker import Worker

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    _prove_three_layers(ProofTracer(provider))
    payload, _ = span_wire.pack_spans_full(list(memory.get_finished_spans()))
    sink = RerunSink(parse_target(f"file:{tmp_path / 'child.rrd'}"), ledger=DropLedger())

    class Closed:  # a Rerun sink whose queue is full: the backlog holds the frame
        def fits(self, spans: Sequence[ReadableSpan]) -> int:
            return 0

        def submit_spans(self, spans: Sequence[ReadableSpan], *,
                         witness: bool = False) -> int:
            return len(spans)

    ledger = DropLedger()
    try:
        with _where_events_are_built() as built:
            worker = Worker(sink, ledger, io.BytesIO(), 1 << 16)
            worker._spans(4, 12, payload, witness=False)
            backlog = PackedBacklog(Closed(), ledger)
            backlog.submit(span_wire.unpack_spans(payload).spans, payload)
            backlog.close(0.0)  # what it held is counted, events included
            assert sink.flush(30)
        assert built == []
    finally:
        sink.close(10)
    assert worker.received.span_events == 12
    assert ledger.total(signal="span_events", reason="shutdown") == 12
    assert sink.stats.spans_drawn == 4
