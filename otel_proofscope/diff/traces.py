"""OTLP/JSON lines → the few facts a comparison needs from each span. Pure: no files.

Each line of a ``traces.jsonl`` (written by ``proofscope demo``/``replay``/``configure()``,
by the official ``opentelemetry-exporter-otlp-json-file`` or by the collector's ``file``
exporter) is one OTLP/JSON ``ExportTraceServiceRequest``. Lines are decoded with the OTLP
receiver's codec and the shared decoder (:mod:`otel_proofscope.otlp.decode`), so ids,
attributes and malformed spans are treated exactly as ``proofscope serve`` treats them.
A line that is not valid OTLP/JSON is reported (line number and reason) and counted; it
never stops the lines after it.

Only what the comparison uses is kept per span (:class:`SpanRecord`), so a large file is
read in one pass without holding SDK span objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.integrations.otlp_receiver import codec
from otel_proofscope.otlp import decode
from otel_proofscope.semconv import Attr, EventName

#: Distinct bad lines kept with their reason (all are counted).
MAX_BAD_LINES_KEPT = 20

#: Attributes that describe the *work* a span did (not how long it took): two runs whose
#: proofs carry the same values did the same work.
WORK_ATTRS: tuple[str, ...] = (Attr.PROOF_MODEL_NAME, Attr.PROOF_LAYERS,
                               Attr.PROOF_INPUT_SHAPE, Attr.LAYER_KIND,
                               Attr.LAYER_TRACE_COST, Attr.LAYER_INPUT_SHAPE,
                               Attr.LAYER_OUTPUT_SHAPE, Attr.SUMCHECK_ROUNDS,
                               Attr.WEIGHT_EVAL_POINT_LENGTH)


@dataclass(frozen=True)
class SpanRecord:
    """One span, reduced to what grouping and timing need."""

    trace_id: int
    span_id: int
    parent_id: int | None
    name: str
    start_ns: int
    end_ns: int
    #: ``proof.layer.kind`` of a contract layer span, else None.
    layer_kind: str | None = None
    #: Timestamps of the span's ``proof.sumcheck.round`` events, in event order.
    round_times_ns: tuple[int, ...] = ()
    #: (attribute, value as text) of the :data:`WORK_ATTRS` the span carries.
    work: tuple[tuple[str, str], ...] = ()

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True)
class BadLine:
    line: int  # 1-based
    reason: str


@dataclass
class TraceFile:
    """Everything read from one trace file."""

    source: str
    spans: list[SpanRecord] = field(default_factory=list)
    lines: int = 0
    #: Lines that could not be decoded (the first :data:`MAX_BAD_LINES_KEPT` kept).
    bad_lines: list[BadLine] = field(default_factory=list)
    bad_line_count: int = 0
    #: Spans inside valid lines that the converter refused (bad ids, unknown status…).
    rejected_spans: int = 0
    rejected_reasons: list[str] = field(default_factory=list)

    def bad(self, line: int, reason: str) -> None:
        self.bad_line_count += 1
        if len(self.bad_lines) < MAX_BAD_LINES_KEPT:
            self.bad_lines.append(BadLine(line, reason))

    def where(self, bad: BadLine) -> str:
        return f"{self.source}:{bad.line}"


def record(span: ReadableSpan) -> SpanRecord:
    """The :class:`SpanRecord` of one SDK span."""
    ctx = span.context
    assert ctx is not None  # the converter always sets one
    attrs = span.attributes or {}
    kind = attrs.get(Attr.LAYER_KIND)
    rounds = tuple(e.timestamp for e in span.events
                   if e.name == EventName.SUMCHECK_ROUND and e.timestamp is not None)
    return SpanRecord(
        trace_id=ctx.trace_id, span_id=ctx.span_id,
        parent_id=span.parent.span_id if span.parent is not None else None,
        name=span.name, start_ns=int(span.start_time or 0), end_ns=int(span.end_time or 0),
        layer_kind=kind if isinstance(kind, str) and kind else None,
        round_times_ns=rounds,
        work=tuple((k, str(attrs[k])) for k in WORK_ATTRS if k in attrs))


def read_lines(lines: Iterable[bytes | str], source: str) -> TraceFile:
    """Decode OTLP/JSON lines; blank lines are skipped, bad ones counted with a reason."""
    out = TraceFile(source)
    for number, raw in enumerate(lines, start=1):
        out.lines = number
        body = raw.encode("utf-8") if isinstance(raw, str) else raw
        if not body.strip():
            continue
        try:
            request = codec.decode(codec.Signal.TRACES, body, codec.Encoding.JSON)
        except codec.BadRequest as exc:
            out.bad(number, str(exc))
            continue
        batch = decode.spans_from_request(request)  # type: ignore[arg-type]
        if batch.rejected:
            out.rejected_spans += batch.rejected
            if batch.error_message and len(out.rejected_reasons) < MAX_BAD_LINES_KEPT:
                out.rejected_reasons.append(f"line {number}: {batch.error_message}")
        out.spans.extend(record(s) for s in batch.spans)
    return out
