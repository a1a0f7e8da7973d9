"""fast_otlp: the direct wire encoder equals the official OTLP encoder, and the exporter
delivers to real gRPC and HTTP receivers on 127.0.0.1 within its timeout."""

from __future__ import annotations

import gzip
import logging
import math
import random
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from http.server import ThreadingHTTPServer
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.span import TraceFlags, TraceState
from serve_helpers import ProtobufReplies

from otel_proofscope.ledger import DropKey, DropLedger
from otel_proofscope.otlp.encode import encode_export_request
from otel_proofscope.pipeline.failure_log import FailureLog
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.semconv import DropReason

# ── random SDK spans ─────────────────────────────────────────────────────────────────

_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_FLOATS = st.floats(allow_nan=False)
_TEXT = st.text(max_size=12)
_SCALARS = st.one_of(_TEXT, st.booleans(), _INT64, _FLOATS, st.binary(max_size=6), st.none())
# Values that compare (and hash) equal across types, to catch a cache mixing them up.
_TRICKY = st.sampled_from([
    1, True, 1.0, 0, False, 0.0, -0.0, (1, 1), (1, True), (True, True), (1.0, 1.0),
    (0.0,), (-0.0,), ("a", "b"), ("a",), (), "", b"", None, (None, 1), (1, None),
    2**63, -(2**63) - 1, (2**64,), math.inf, -math.inf, "üñí©ødé ✓", [1, [2, "x"]],
])
_VALUES = st.one_of(
    _SCALARS,
    _TRICKY,
    st.lists(_TEXT, max_size=4),
    st.lists(_INT64, max_size=4),
    st.lists(st.booleans(), max_size=3),
    st.lists(_FLOATS, max_size=3),
    st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3)
                 | st.dictionaries(st.text(min_size=1, max_size=4), inner, max_size=3),
                 max_leaves=6),
)
_KEYS = st.one_of(st.sampled_from(["a", "b", "proof.layer.index", "k"]),
                  st.text(min_size=1, max_size=10))
_ATTRS = st.dictionaries(_KEYS, _VALUES, max_size=6)
_IDS = st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1))
_TRACE_STATE = st.lists(st.tuples(st.sampled_from(["vendor", "a1", "x-y"]),
                                  st.sampled_from(["v", "123", "a-b"])), max_size=2)


@st.composite
def _span_plan(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "provider": draw(st.integers(0, 2)),
        "scope": draw(st.integers(0, 2)),
        "name": draw(st.text(max_size=16)),
        "kind": draw(st.sampled_from(list(SpanKind))),
        "attrs": draw(_ATTRS),
        "events": draw(st.lists(st.tuples(st.text(max_size=8), _ATTRS,
                                          st.one_of(st.none(), st.integers(0, 2**62))),
                                max_size=4)),
        "links": draw(st.lists(st.tuples(_IDS, st.booleans(), _TRACE_STATE, _ATTRS),
                               max_size=3)),
        "status": draw(st.sampled_from([None, (StatusCode.OK, None),
                                        (StatusCode.ERROR, None),
                                        (StatusCode.ERROR, "bad ✗"),
                                        (StatusCode.UNSET, None)])),
        "parent": draw(st.sampled_from(["none", "local", "remote"])),
        "remote": draw(st.tuples(_IDS, _TRACE_STATE)),
        "times": draw(st.tuples(st.integers(0, 2**62), st.integers(0, 2**20))),
    }


#: Slack for the export-timeout bounds on a loaded machine; below the 1 s timeout.
TIMEOUT_MARGIN_S = 0.9


def _providers(exporter: InMemorySpanExporter) -> list[TracerProvider]:
    limits = SpanLimits(max_attributes=5, max_events=3, max_links=2,
                        max_event_attributes=4, max_link_attributes=4)
    resources = [Resource.create({"service.name": "prover"}),
                 Resource({"service.name": "other", "host.id": 7, "tags": ("x", "y")},
                          schema_url="https://opentelemetry.io/schemas/1.21.0"),
                 Resource({})]
    providers = []
    for resource in resources:
        provider = TracerProvider(resource=resource, span_limits=limits)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        providers.append(provider)
    return providers


_SCOPES = [("proofscope", "1.0", None, None),
           ("other.lib", None, "https://schema/1", {"scope.attr": 1, "t": ("a",)}),
           ("", None, None, None)]


def _make_spans(plans: list[dict[str, Any]]) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    providers = _providers(exporter)
    for plan in plans:
        name, version, schema, scope_attrs = _SCOPES[plan["scope"]]
        tracer = providers[plan["provider"]].get_tracer(name, version, schema, scope_attrs)
        (tid, sid), state = plan["remote"]
        ctx: otel_context.Context | None = None
        if plan["parent"] == "remote":
            remote = SpanContext(tid, sid, is_remote=True, trace_flags=TraceFlags(1),
                                 trace_state=TraceState(state))
            ctx = trace.set_span_in_context(NonRecordingSpan(remote))
        links = [Link(SpanContext(lt, ls, is_remote=rem, trace_state=TraceState(lst)), la)
                 for (lt, ls), rem, lst, la in plan["links"]]
        start, length = plan["times"]

        def body(plan: dict[str, Any] = plan, links: list[Link] = links,
                 ctx: otel_context.Context | None = ctx, tracer: Any = tracer,
                 start: int = start, length: int = length) -> None:
            span = tracer.start_span(plan["name"], context=ctx, kind=plan["kind"],
                                     attributes=plan["attrs"], links=links,
                                     start_time=start or None)
            for ev_name, ev_attrs, ts in plan["events"]:
                span.add_event(ev_name, ev_attrs, timestamp=ts)
            if plan["status"] is not None:
                span.set_status(Status(*plan["status"]))
            span.end(end_time=(start + length) if start else None)

        if plan["parent"] == "local":
            with tracer.start_as_current_span("parent"):
                body()
        else:
            body()
    return list(exporter.get_finished_spans())


def _assert_same(spans: Sequence[ReadableSpan]) -> None:
    ours = encode_export_request(spans)
    official = encode_spans(spans)
    assert ExportTraceServiceRequest.FromString(ours) == official
    # Same field order as upb's serializer, hence the very same bytes.
    assert ours == official.SerializeToString()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_span_plan(), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_encoder_matches_official_on_random_sdk_spans(plans: list[dict[str, Any]],
                                                      rnd: random.Random) -> None:
    spans = _make_spans(plans)
    rnd.shuffle(spans)  # interleave resources and scopes within the batch
    _assert_same(spans)


def test_cache_never_mixes_equal_values_of_different_types() -> None:
    plans = []
    for value in [1, True, 1.0, (1, 1), (1, True), (1.0, 1.0), (True, True), 0.0, -0.0,
                  (0.0,), (-0.0,), 1, (1, 1), True]:
        plans.append({"provider": 0, "scope": 0, "name": "s", "kind": SpanKind.INTERNAL,
                      "attrs": {"k": value}, "events": [("e", {"k": value}, None)],
                      "links": [], "status": None, "parent": "none",
                      "remote": ((1, 1), []), "times": (0, 0)})
    for spans in (_make_spans(plans), _make_spans(plans)):  # the second run hits caches
        for span in spans:
            _assert_same([span])


def test_a_key_whose_values_never_repeat_is_only_sampled_into_the_cache() -> None:
    """A round's claims fill the attribute cache with values never seen again: the key
    that filled a full cache is sampled from then on (one value in 16 cached), the
    others are cached as before, a value of the sampled key that does repeat is cached
    after a few sightings, and the bytes stay the official encoder's throughout."""
    from otel_proofscope.otlp import encode

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("t")
    unique = "test.unique.claim"
    encode._SAMPLED_KEYS.discard(unique)

    def check() -> None:
        spans = memory.get_finished_spans()
        memory.clear()
        assert encode_export_request(spans) == encode_spans(spans).SerializeToString()

    for batch in range(3):
        for layer in range(encode._KV_CACHE_MAX // 200):  # 100 events a span (limit 128)
            with tracer.start_as_current_span("layer") as span:
                for i in range(100):
                    claim = str(10**18 + (batch * 1000 + layer) * 1000 + i)
                    span.add_event("round", {unique: claim, "test.kind": "MatMul",
                                             "test.index": i % 7})
        check()
    assert unique in encode._SAMPLED_KEYS
    assert "test.kind" not in encode._SAMPLED_KEYS
    assert ("test.kind", "MatMul", str) in encode._KV_CACHE

    def held() -> int:
        return sum(1 for key in encode._KV_CACHE if key[0] == unique)

    before = held()
    for layer in range(40):  # 4,000 more values never seen: about 250 of them cached
        with tracer.start_as_current_span("layer") as span:
            for i in range(100):
                span.add_event("round", {unique: str(10**19 + layer * 1000 + i)})
    check()
    assert 0 < held() - before <= 4000 // encode._SAMPLE_EVERY + 1
    # A value of the sampled key that repeats is cached after at most 16 sightings.
    with tracer.start_as_current_span("layer") as span:
        for _ in range(encode._SAMPLE_EVERY):
            span.add_event("round", {unique: "repeated"})
    check()
    assert (unique, "repeated", str) in encode._KV_CACHE


def test_special_floats_and_unencodable_ints() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attributes({"nan": math.nan, "neg_zero": -0.0, "big": 2**64, "ok": -5,
                             "arr": (math.nan, 1.5), "nested_big": (1, 2**63)})
    spans = exporter.get_finished_spans()
    # NaN != NaN defeats message equality; the bytes must still be identical.
    assert encode_export_request(spans) == encode_spans(spans).SerializeToString()
    decoded = ExportTraceServiceRequest.FromString(encode_export_request(spans))
    keys = [kv.key for kv in decoded.resource_spans[0].scope_spans[0].spans[0].attributes]
    assert keys == ["nan", "neg_zero", "ok", "arr"]  # out-of-int64 values skipped, as upstream


def test_readable_span_subclass_uses_public_properties() -> None:
    class Redacted(ReadableSpan):
        @property
        def attributes(self) -> Any:
            return {"redacted": True}

    ctx = SpanContext(5, 6, is_remote=False)
    span = Redacted(name="r", context=ctx, attributes={"secret": "x"},
                    resource=Resource({}), start_time=1, end_time=2)
    _assert_same([span])
    decoded = ExportTraceServiceRequest.FromString(encode_export_request([span]))
    kv = decoded.resource_spans[0].scope_spans[0].spans[0].attributes
    assert [a.key for a in kv] == ["redacted"]


def test_prover_like_span_is_byte_identical() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("bench")
    for layer in range(3):
        with tracer.start_as_current_span("proof.layer", attributes={
                "proof.layer.index": layer, "proof.layer.kind": "MatMul",
                "proof.layer.input.shape": [1, 64], "proof.layer.output.shape": [1, 64]}) as s:
            for r in range(4):
                s.add_event("proof.sumcheck.round", {
                    "proof.sumcheck.round": r, "proof.sumcheck.degree": 2,
                    "proof.sumcheck.poly": [f"({r},1)", f"({r},2)", f"({r},3)"],
                    "proof.claim": f"({layer},{r})"})
    _assert_same(exporter.get_finished_spans())
    assert encode_export_request([]) == encode_spans([]).SerializeToString() == b""


# ── exporter against real receivers on 127.0.0.1 ────────────────────────────────────


class _GrpcReceiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """A real TraceService: records requests and metadata, can fail or partially reject."""

    def __init__(self, fail_first: int = 0, rejected: int = 0) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.calls = 0
        self.fail_first = fail_first
        self.rejected = rejected
        self.lock = threading.Lock()

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
        with self.lock:
            self.calls += 1
            if self.calls <= self.fail_first:
                context.abort(grpc.StatusCode.UNAVAILABLE, "warming up")
            self.requests.append(request)
            self.metadata.append(dict(context.invocation_metadata()))
        response = ExportTraceServiceResponse()
        if self.rejected:
            response.partial_success.rejected_spans = self.rejected
            response.partial_success.error_message = "too old"
        return response


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[_GrpcReceiver, int]]:
    receiver = _GrpcReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, port
    server.stop(0)


class _HttpReceiver:
    """A real OTLP/HTTP receiver; ``statuses`` are answered in order, then 200."""

    def __init__(self, statuses: Sequence[int] = (), rejected: int = 0) -> None:
        self.statuses = list(statuses)
        self.rejected = rejected
        self.posts: list[tuple[str, dict[str, str], bytes]] = []
        self.delivered: list[ExportTraceServiceRequest] = []
        receiver = self

        class Handler(ProtobufReplies):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.posts.append((self.path, headers, body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                payload = b""
                if status == 200:
                    if headers.get("content-encoding") == "gzip":
                        body = gzip.decompress(body)
                    receiver.delivered.append(ExportTraceServiceRequest.FromString(body))
                    response = ExportTraceServiceResponse()
                    if receiver.rejected:
                        response.partial_success.rejected_spans = receiver.rejected
                    payload = response.SerializeToString()
                self.reply(status, payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port that accepts TCP connections (kernel backlog) and never says a word."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _sample_spans() -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "prover"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("otel_proofscope.test", "1.0")
    with tracer.start_as_current_span("proof", attributes={"proof.id": "p1"}):
        for layer in range(3):
            with tracer.start_as_current_span("proof.layer",
                                              attributes={"proof.layer.index": layer,
                                                          "proof.layer.input.shape": [1, 64]},
                                              kind=SpanKind.INTERNAL) as span:
                span.add_event("proof.sumcheck.round", {"proof.sumcheck.round": layer,
                                                        "poly": ["a", "b", "c"]})
    return list(exporter.get_finished_spans())


def test_grpc_delivers_intact_with_env_headers_and_gzip(
        grpc_receiver: tuple[_GrpcReceiver, int], monkeypatch: pytest.MonkeyPatch) -> None:
    receiver, port = grpc_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cr3t,x-tenant=zk")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "5")
    exporter = FastOTLPSpanExporter()
    assert (exporter.protocol, exporter.endpoint, exporter.timeout) == \
        ("grpc", f"127.0.0.1:{port}", 5.0)
    spans = _sample_spans()
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert receiver.requests == [encode_spans(spans)]
    assert receiver.metadata[0]["authorization"] == "Bearer s3cr3t"
    assert receiver.metadata[0]["x-tenant"] == "zk"


def test_grpc_retries_unavailable_and_delivers_once(
        grpc_receiver: tuple[_GrpcReceiver, int]) -> None:
    receiver, port = grpc_receiver
    receiver.fail_first = 2
    exporter = FastOTLPSpanExporter(f"127.0.0.1:{port}", insecure=True, timeout=5,
                                    headers={"Authorization": "Bearer t0k"})
    spans = _sample_spans()
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert receiver.calls == 3
    assert receiver.requests == [encode_spans(spans)]
    assert receiver.metadata[0]["authorization"] == "Bearer t0k"


def test_grpc_partial_success_rejections_are_counted_once(
        grpc_receiver: tuple[_GrpcReceiver, int]) -> None:
    receiver, port = grpc_receiver
    receiver.rejected = 2
    ledger = DropLedger(log_interval_s=3600)
    exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{port}", timeout=5, ledger=ledger)
    assert exporter.export(_sample_spans()) == SpanExportResult.SUCCESS
    exporter.shutdown()
    assert ledger.snapshot() == {DropKey("spans", "otlp", DropReason.INVALID): 2}


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_dead_port_fails_within_timeout(protocol: str) -> None:
    port = _dead_port()
    endpoint = f"http://127.0.0.1:{port}" + ("/v1/traces" if protocol != "grpc" else "")
    exporter = FastOTLPSpanExporter(endpoint, protocol=protocol, timeout=1.0)
    start = time.monotonic()
    assert exporter.export(_sample_spans()) == SpanExportResult.FAILURE
    # Within the 1 s timeout plus slack smaller than the timeout, so one extra attempt
    # (a second full timeout) would still fail this.
    assert time.monotonic() - start < 1.0 + TIMEOUT_MARGIN_S
    exporter.shutdown()


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_silent_port_fails_within_timeout(protocol: str, blackhole: int) -> None:
    endpoint = f"http://127.0.0.1:{blackhole}" + ("/v1/traces" if protocol != "grpc" else "")
    exporter = FastOTLPSpanExporter(endpoint, protocol=protocol, timeout=1.0)
    start = time.monotonic()
    assert exporter.export(_sample_spans()) == SpanExportResult.FAILURE
    # Within the 1 s timeout plus slack smaller than the timeout, so one extra attempt
    # (a second full timeout) would still fail this.
    assert time.monotonic() - start < 1.0 + TIMEOUT_MARGIN_S
    exporter.shutdown()


def test_http_503_then_200_is_retried_and_delivered_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = _HttpReceiver(statuses=[503])
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver.port}/")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
        exporter = FastOTLPSpanExporter(timeout=5, compression="gzip",
                                        headers={"Authorization": "Bearer h77p"})
        spans = _sample_spans()
        assert exporter.export(spans) == SpanExportResult.SUCCESS
        exporter.shutdown()
    finally:
        receiver.close()
    assert [path for path, _, _ in receiver.posts] == ["/v1/traces", "/v1/traces"]
    assert receiver.delivered == [encode_spans(spans)]
    headers = receiver.posts[-1][1]
    assert headers["authorization"] == "Bearer h77p"
    assert headers["content-type"] == "application/x-protobuf"
    assert headers["content-encoding"] == "gzip"


def test_http_client_error_is_not_retried_and_rejections_counted() -> None:
    ledger = DropLedger(log_interval_s=3600)
    receiver = _HttpReceiver(statuses=[400], rejected=1)
    try:
        exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{receiver.port}/v1/traces",
                                        protocol="http/protobuf", timeout=5, ledger=ledger)
        assert exporter.export(_sample_spans()) == SpanExportResult.FAILURE
        assert len(receiver.posts) == 1
        assert exporter.export(_sample_spans()) == SpanExportResult.SUCCESS
        exporter.shutdown()
        assert exporter.export(_sample_spans()) == SpanExportResult.FAILURE  # after shutdown
    finally:
        receiver.close()
    assert len(receiver.delivered) == 1
    assert ledger.snapshot() == {DropKey("spans", "otlp", DropReason.INVALID): 1}


def test_shutdown_aborts_a_retry_wait() -> None:
    receiver = _HttpReceiver(statuses=[503] * 50)
    try:
        exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{receiver.port}/v1/traces",
                                        protocol="http/protobuf", timeout=30)
        results: list[SpanExportResult] = []
        worker = threading.Thread(target=lambda: results.append(exporter.export(_sample_spans())),
                                  daemon=True)
        worker.start()
        while not receiver.posts:
            time.sleep(0.01)
        exporter.shutdown()
        worker.join(5)
    finally:
        receiver.close()
    assert results == [SpanExportResult.FAILURE]


def test_unsupported_protocol_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(ValueError, match="http/json"):
        FastOTLPSpanExporter()


def test_processor_counts_a_failed_export_exactly_once() -> None:
    ledger = DropLedger(log_interval_s=3600)
    exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{_dead_port()}", timeout=0.5,
                                    ledger=ledger)
    processor = BoundedBatchSpanProcessor(exporter, sink="otlp", ledger=ledger)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for _ in range(5):
        with tracer.start_as_current_span("s") as span:
            span.add_event("e")
    provider.shutdown()
    assert ledger.snapshot() == {
        DropKey("spans", "otlp", DropReason.EXPORT_FAILED): 5,
        DropKey("span_events", "otlp", DropReason.EXPORT_FAILED): 5,
    }


def test_live_sdk_span_objects_encode_the_same() -> None:
    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("live", attributes={"a": 1, "b": ("x",)})
    span.add_event("e", {"k": True})
    span.end()
    _assert_same([span])  # type: ignore[list-item]


# ── failure lines: the first in full, then at most one per interval ────────────────────


def _export_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "otel_proofscope.pipeline.fast_otlp" and r.levelno == logging.WARNING]


def test_a_dead_collector_is_warned_about_once_not_once_per_batch(
        caplog: pytest.LogCaptureFixture) -> None:
    port = _dead_port()
    ledger = DropLedger(log_interval_s=3600)
    exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{port}", timeout=0.3, ledger=ledger)
    caplog.set_level(logging.WARNING)
    for _ in range(4):
        assert exporter.export(_sample_spans()) == SpanExportResult.FAILURE
    exporter.shutdown()
    lines = _export_warnings(caplog)
    assert len(lines) == 1, lines
    assert f"127.0.0.1:{port}" in lines[0] and "4 span(s)" in lines[0]


def test_recovery_is_said_once_and_the_next_failure_is_warned_at_once(
        caplog: pytest.LogCaptureFixture) -> None:
    receiver = _HttpReceiver(statuses=[400, 400, 200, 400])
    caplog.set_level(logging.WARNING)
    try:
        exporter = FastOTLPSpanExporter(f"http://127.0.0.1:{receiver.port}/v1/traces",
                                        protocol="http/protobuf", timeout=5,
                                        ledger=DropLedger(log_interval_s=3600))
        results = [exporter.export(_sample_spans()) for _ in range(4)]
        exporter.shutdown()
    finally:
        receiver.close()
    assert results == [SpanExportResult.FAILURE, SpanExportResult.FAILURE,
                       SpanExportResult.SUCCESS, SpanExportResult.FAILURE]
    lines = _export_warnings(caplog)
    assert len(lines) == 3, lines
    assert "failed: HTTP 400" in lines[0]
    assert "works again after 2 failed export(s)" in lines[1]
    assert "failed: HTTP 400" in lines[2]


def test_the_line_after_an_interval_counts_the_failures_not_logged() -> None:
    log = logging.getLogger("test_fast_otlp.failure_log")
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Keep()
    log.addHandler(handler)
    try:
        failures = FailureLog(log, "collector:4317", interval_s=0.2)
        failures.failed(10, "export of %d span(s) failed", 10)
        for _ in range(3):
            failures.failed(5, "export of %d span(s) failed", 5)
        time.sleep(0.25)
        failures.failed(7, "export of %d span(s) failed: %s", 7, "refused")
        failures.succeeded()
        failures.succeeded()  # said once
    finally:
        log.removeHandler(handler)
    assert records == [
        "export of 10 span(s) failed",
        "export of 7 span(s) failed: refused (3 earlier failed export(s) of 15 span(s) to "
        "collector:4317 not logged one by one)",
        "OTLP export to collector:4317 works again after 5 failed export(s) (their spans "
        "are counted in proofscope.dropped)",
    ]
