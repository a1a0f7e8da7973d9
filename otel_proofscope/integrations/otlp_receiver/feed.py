"""A trace request's spans converted a chunk at a time, not all at once.

Why: a converted ``ReadableSpan`` holds ~3 KB against the ~50 bytes a minimal span takes
on the wire, so converting a 4 MB request of 80,000 tiny spans in one go held ~240 MB
(4 such requests inside the 16 MiB byte budget: 1,179 MB peak RSS). Converting
:data:`CHUNK_SPANS` at a time and handing each chunk to the sinks before the next one
keeps the receiver's own share to one chunk per request; the sinks' queues are bounded
on their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.otlp import decode
from otel_proofscope.pipeline.processor import estimate_bytes

#: Spans converted and exported together (the sinks' queues are asked per chunk).
CHUNK_SPANS = 512
#: A chunk also ends once its spans' estimated bytes (``estimate_bytes``, what the span
#: queues count) reach this: a quarter of the Rerun sink's default byte bound (16 MiB).
#: Why: the sink takes any chunk while its queue is empty but queues only what fits its
#: byte bound, dropping the rest after the sender was told OK; 512 spans of 128 round
#: events are ~64 MiB by that estimate (a fleet of Node provers lost 85 spans so).
CHUNK_BYTES = 4 * 2**20
#: Distinct rejection messages kept for the partial-success answer.
MAX_MESSAGES = 5


@dataclass
class Rejections:
    """Spans refused while converting (malformed ids, unknown kinds), and why."""

    count: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, message: str) -> None:
        self.count += 1
        if message not in self.messages and len(self.messages) < MAX_MESSAGES:
            self.messages.append(message)

    @property
    def message(self) -> str:
        return "; ".join(self.messages)


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def chunks(request: ExportTraceServiceRequest, size: int, rejected: Rejections,
           max_bytes: int = CHUNK_BYTES) -> Iterator[tuple[list[ReadableSpan], int]]:
    """(converted spans, wire spans they came from) per chunk of up to ``size`` wire
    spans, ended early once its spans' estimated bytes reach ``max_bytes``; a span that
    cannot be converted is counted in ``rejected`` instead."""
    out: list[ReadableSpan] = []
    seen = nbytes = 0
    for rs in request.resource_spans:
        res = decode.resource(rs.resource, rs.schema_url)
        for ss in rs.scope_spans:
            sc = decode.scope(ss.scope, ss.schema_url)
            for pb in ss.spans:
                seen += 1
                try:
                    converted = decode.span(pb, res, sc)
                    out.append(converted)
                    nbytes += estimate_bytes(converted)
                except decode.Rejected as exc:
                    rejected.add(f"span rejected: {exc}")
                if seen >= size or nbytes >= max_bytes:
                    yield out, seen
                    out, seen, nbytes = [], 0, 0
    if seen:
        yield out, seen
