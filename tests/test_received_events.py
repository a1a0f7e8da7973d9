"""The lazy decode of received events (``otlp.received_events``) against the decoder's
former eager one: every reader (the SDK's public properties, ``sdk_fields``, the Rerun
round outline, the OTLP and OTLP/JSON encoders) sees the same events, attribute values,
dropped counts and names, on varied input (hypothesis); invalid spans are still rejected
one by one with partial success."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_proofscope.integrations.otlp_receiver import codec, feed
from otel_proofscope.integrations.otlp_receiver.core import Ingest
from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp import decode, encode_json, pb_values, sdk_fields
from otel_proofscope.otlp.encode import encode_export_request
from otel_proofscope.otlp.received_events import ReceivedEvents
from otel_proofscope.rerun.round_outline import full, outline
from otel_proofscope.semconv import Attr, EventName
from tests.test_otlp_receiver_fuzz import any_values

ROUND = EventName.SUMCHECK_ROUND
RES = Resource({"service.name": "t"})
SCOPE = InstrumentationScope("t")


def eager_events(pb: trace_pb2.Span) -> BoundedList:  # type: ignore[type-arg]
    """The decoder's events as it built them before the lazy list (its code, kept here
    as the reference)."""
    def bounded(kvs: Any, dropped: int) -> BoundedAttributes:
        values, empty = pb_values.attributes_counted(kvs)
        attrs = BoundedAttributes(None, None, immutable=False, extended_attributes=True)
        attrs._dict.update(values)
        attrs.dropped = int(dropped) + empty
        return attrs

    events: BoundedList = BoundedList.from_seq(None, [  # type: ignore[type-arg]
        Event(e.name, bounded(e.attributes, e.dropped_attributes_count), e.time_unix_nano,
              limit=None) for e in pb.events])
    events.dropped = int(pb.dropped_events_count)
    return events


def _same(a: Any, b: Any) -> bool:
    """Equality that counts NaN equal to NaN (a double attribute may be NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return type(a) is type(b) and len(a) == len(b) and all(
            _same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def public(events: Sequence[Any]) -> list[tuple[Any, ...]]:
    return [(e.name, e.timestamp, dict(e.attributes or {}), e.dropped_attributes)
            for e in events]


# ── strategies ───────────────────────────────────────────────────────────────────────

# Keys drawn from a small set (repeats: the last non-empty value wins) plus the round
# keys the walk outlines, and the empty key (invalid: counted as dropped).
keys = st.sampled_from(["", "a", "b", Attr.SUMCHECK_ROUND, Attr.CLAIM, Attr.ERROR_TYPE,
                        Attr.SUMCHECK_POLY])
key_values = st.lists(st.builds(KeyValue, key=keys, value=any_values), max_size=6)
events = st.builds(trace_pb2.Span.Event, name=st.sampled_from(["", "x", ROUND, "exception"]),
                   time_unix_nano=st.integers(0, 2**64 - 1), attributes=key_values,
                   dropped_attributes_count=st.integers(0, 2**32 - 1))
spans = st.builds(
    trace_pb2.Span, trace_id=st.just(b"\x01" * 16), span_id=st.just(b"\x02" * 8),
    name=st.text(max_size=6), attributes=key_values,
    dropped_attributes_count=st.integers(0, 3),
    start_time_unix_nano=st.integers(0, 2**64 - 1), end_time_unix_nano=st.integers(0, 2**64 - 1),
    events=st.lists(events, max_size=6), dropped_events_count=st.integers(0, 2**32 - 1))


# ── the lazy list against the eager one ──────────────────────────────────────────────


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_every_reader_sees_the_eager_events(pb: trace_pb2.Span) -> None:
    ref = eager_events(pb)
    got = decode.span(pb, RES, SCOPE)
    if pb.events:
        assert type(got._events) is ReceivedEvents  # type: ignore[attr-defined]
    # The SDK's public API.
    assert _same(public(got.events), public(ref))
    assert got.dropped_events == ref.dropped == pb.dropped_events_count
    # sdk_fields: names, timestamps and fields without building an Event.
    fresh = decode.span(pb, RES, SCOPE)
    unread = sdk_fields.span_events_unread(fresh)
    assert sdk_fields.event_names(unread) == [e.name for e in ref]
    assert sdk_fields.event_timestamps(unread) == [e.timestamp for e in ref]
    assert sdk_fields.event_count(fresh) == len(ref)
    assert _same([(n, t, dict(a), d) for n, t, a, d in sdk_fields.events_fields(unread)],
                 public(ref))
    assert sdk_fields.span_fields(fresh)[10] == ref.dropped
    # Some events built, the others not.
    fresh = decode.span(pb, RES, SCOPE)
    picked = list(range(0, len(pb.events), 2))
    assert _same(public(sdk_fields.events_at(sdk_fields.span_events_unread(fresh), picked)),
                 [public(ref)[i] for i in picked])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spans)
def test_round_outline_reads_the_round_keys_and_full_gives_the_exact_fields(
        pb: trace_pb2.Span) -> None:
    ref = public(eager_events(pb))
    got = outline(sdk_fields.span_events_unread(decode.span(pb, RES, SCOPE)))
    assert len(got) == len(ref)
    wanted = {Attr.SUMCHECK_ROUND, Attr.CLAIM, Attr.ERROR_TYPE}
    for item, (name, t, attrs, dropped) in zip(got, ref, strict=True):
        assert (item[0], item[1]) == (name, t)
        if name == ROUND:  # only the outlined keys, with the eager values
            assert _same(dict(item[2]), {k: v for k, v in attrs.items() if k in wanted})
        else:
            assert _same((item[0], item[1], dict(item[2]), item[3]), (name, t, attrs, dropped))
        n, ts, a, d = full(item)
        assert _same((n, ts, dict(a), d), (name, t, attrs, dropped))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(spans, min_size=1, max_size=3))
def test_encoders_write_the_same_bytes_as_for_the_eager_spans(pbs: list[trace_pb2.Span]) -> None:
    lazy = [decode.span(pb, RES, SCOPE) for pb in pbs]
    eager = []
    for pb, s in zip(pbs, lazy, strict=True):
        eager.append(ReadableSpan(
            name=s.name, context=s.context, parent=s.parent, resource=RES,
            attributes=s._attributes, events=eager_events(pb),  # type: ignore[attr-defined]
            links=s.links, kind=s.kind, status=s.status, start_time=s.start_time,
            end_time=s.end_time, instrumentation_scope=SCOPE))
    assert encode_export_request(lazy) == encode_export_request(eager)
    assert encode_json.encode_json_line(lazy) == encode_json.encode_json_line(eager)


def test_span_attributes_keep_the_dropped_count_and_skip_bounded_attributes_when_none() -> None:
    pb = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s",
                        attributes=[KeyValue(key="a", value=AnyValue(int_value=1))])
    plain = decode.span(pb, RES, SCOPE)
    assert dict(plain.attributes) == {"a": 1} and plain.dropped_attributes == 0
    pb.attributes.add(key="", value=AnyValue(int_value=2))
    pb.dropped_attributes_count = 3
    counted = decode.span(pb, RES, SCOPE)
    assert dict(counted.attributes) == {"a": 1}
    assert counted.dropped_attributes == 4  # the sender's 3 and the empty key


def test_the_events_are_a_copy_not_a_view_into_the_request() -> None:
    pb = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s")
    pb.events.add(name=ROUND, time_unix_nano=5,
                  attributes=[KeyValue(key="a", value=AnyValue(int_value=1))])
    span = decode.span(pb, RES, SCOPE)
    pb.events[0].name = "changed"  # the request is reused or freed: the span keeps its own
    pb.events[0].attributes[0].value.int_value = 9
    assert [(e.name, dict(e.attributes)) for e in span.events] == [(ROUND, {"a": 1})]


def test_list_protocol_copy_and_append() -> None:
    pb = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s",
                        dropped_events_count=2)
    for i in range(3):
        pb.events.add(name=f"e{i}", time_unix_nano=i + 1,
                      attributes=[KeyValue(key="i", value=AnyValue(int_value=i))])
    events = decode.span(pb, RES, SCOPE)._events  # type: ignore[attr-defined]
    assert len(events) == 3 and events[1].name == "e1" and events[-1].timestamp == 3
    assert [e.name for e in events] == ["e0", "e1", "e2"]
    copied = copy.deepcopy(events)
    assert type(copied) is BoundedList and copied.dropped == 2
    assert public(copied) == public(events)
    events.append(Event("late", {"k": 1}, 9))
    assert sdk_fields.event_names(events) == ["e0", "e1", "e2", "late"]
    assert sdk_fields.event_timestamps(events) == [1, 2, 3, 9]
    assert [f[0] for f in sdk_fields.events_fields(events)] == ["e0", "e1", "e2", "late"]
    assert len(events) == 4 and events.dropped == 2


# ── invalid input: still rejected one by one, with partial success ───────────────────


def test_invalid_spans_among_lazy_ones_are_rejected_with_partial_success() -> None:
    good = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="ok")
    good.events.add(name=ROUND, time_unix_nano=1,
                    attributes=[KeyValue(key=Attr.SUMCHECK_ROUND, value=AnyValue(int_value=0))])
    bad_id = trace_pb2.Span(trace_id=b"\x01" * 15, span_id=b"\x02" * 8, name="bad")
    bad_id.events.extend(good.events)
    bad_kind = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x03" * 8, name="kind",
                              kind=99)
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.extend([good, bad_id, bad_kind])
    rejected = feed.Rejections()
    got = [s for chunk, _ in feed.chunks(request, 512, rejected) for s in chunk]
    assert [s.name for s in got] == ["ok"] and rejected.count == 2

    class Keep:
        def __init__(self) -> None:
            self.spans: list[ReadableSpan] = []

        def export(self, spans: Sequence[ReadableSpan]) -> Any:
            from opentelemetry.sdk.trace.export import SpanExportResult
            self.spans.extend(spans)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    keep = Keep()
    ingest = Ingest([keep], ledger=DropLedger())  # type: ignore[list-item]
    result = ingest.handle(codec.Signal.TRACES, request.SerializeToString(),
                           codec.Encoding.PROTOBUF)
    assert result.response is not None
    assert result.response.partial_success.rejected_spans == 2  # type: ignore[attr-defined]
    assert "trace_id must be 16 bytes" in result.message
    assert [(e.name, dict(e.attributes)) for e in keep.spans[0].events] == [
        (ROUND, {Attr.SUMCHECK_ROUND: 0})]


def test_empty_events_and_links_keep_the_senders_drop_counts() -> None:
    pb = trace_pb2.Span(trace_id=b"\x01" * 16, span_id=b"\x02" * 8, name="s")
    bare = decode.span(pb, RES, SCOPE)
    assert (bare.events, bare.links, bare.dropped_events, bare.dropped_links) == ((), (), 0, 0)
    assert sdk_fields.event_count(bare) == 0 and sdk_fields.span_fields(bare)[10] == 0
    pb.dropped_events_count, pb.dropped_links_count = 3, 2
    counted = decode.span(pb, RES, SCOPE)
    assert (counted.dropped_events, counted.dropped_links) == (3, 2)
    assert sdk_fields.span_fields(counted)[10] == 3
    pb.status.code, pb.status.message = trace_pb2.Status.STATUS_CODE_ERROR, "why"
    failed = decode.span(pb, RES, SCOPE)
    assert (failed.status.status_code.name, failed.status.description) == ("ERROR", "why")
    pb.status.code = trace_pb2.Status.STATUS_CODE_OK  # a message only an error carries
    assert decode.span(pb, RES, SCOPE).status.description is None


# ── heavy spans: chunks sized in bytes too ───────────────────────────────────────────


def _heavy_request(spans: int, rounds: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    ss = request.resource_spans.add().scope_spans.add()
    for i in range(spans):
        pb = ss.spans.add(trace_id=b"\x01" * 16, span_id=(i + 1).to_bytes(8, "big"),
                          name="proof.layer", start_time_unix_nano=1_000,
                          end_time_unix_nano=2_000)
        pb.attributes.add(key=Attr.LAYER_INDEX, value=AnyValue(int_value=i))
        for r in range(rounds):
            pb.events.add(name=ROUND, time_unix_nano=1_000 + r, attributes=[
                KeyValue(key=Attr.SUMCHECK_ROUND, value=AnyValue(int_value=r)),
                KeyValue(key=Attr.CLAIM, value=AnyValue(string_value=f"({r},1,2,3)"))])
    return request


def test_chunks_end_at_the_byte_bound() -> None:
    from otel_proofscope.pipeline.processor import estimate_bytes

    request = _heavy_request(60, 128)
    got = list(feed.chunks(request, 512, feed.Rejections()))
    assert sum(w for _, w in got) == 60 and len(got) > 1
    for chunk, wire in got:
        assert len(chunk) == wire
        # Each ends at the first span that reaches the bound, none later.
        assert sum(estimate_bytes(s) for s in chunk[:-1]) < feed.CHUNK_BYTES
    assert sum(estimate_bytes(s) for s in got[0][0]) >= feed.CHUNK_BYTES


def test_a_heavy_request_into_an_empty_rerun_queue_loses_nothing(tmp_path: Any) -> None:
    # 300 spans of 128 round events: ~38 MiB by the queues' estimate, more than the Rerun
    # sink's 16 MiB byte bound. Chunked in spans only, the first chunk went into the
    # empty queue whole and the sink dropped what did not fit after the sender's OK.
    from otel_proofscope.ledger import DROPS
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    exporter = RerunSpanExporter(f"file:{tmp_path / 'heavy.rrd'}")
    try:
        ingest = Ingest([exporter], ledger=DropLedger())
        before = DROPS.total(signal="spans", reason="queue_full")
        body = _heavy_request(300, 128).SerializeToString()
        accepted = 0
        for _ in range(400):  # the sender's retries while the queue drains
            result = ingest.handle(codec.Signal.TRACES, body, codec.Encoding.PROTOBUF,
                                   reply_by=__import__("time").monotonic() + 30)
            if result.outcome.value == "ok":
                accepted = ingest.stats().get("spans_accepted", 0)
                break
            __import__("time").sleep(0.05)
        assert exporter.force_flush(60_000)
        assert accepted == 300
        assert DROPS.total(signal="spans", reason="queue_full") == before
    finally:
        exporter.shutdown()
