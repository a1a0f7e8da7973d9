"""Where mapping rules meet a pipeline: an exporter wrapper and the proof metrics.

``configure(map=...)`` / ``PROOFSCOPE_MAP`` and ``proofscope serve --map`` call into
here, so their own bodies only gain a line each:

* :func:`mapper_for` turns ``map=`` (a preset name, a path, a loaded :class:`RuleSet` or
  a :class:`Mapper`) or the environment into one shared :class:`Mapper`, or None;
* :func:`wrap` puts a :class:`MappingSpanExporter` in front of every span sink (OTLP,
  files, Rerun), so every sink receives the same contract spans;
* :class:`ProofMetricsFromSpans` records ``proof.duration``, ``proof.layer.duration``,
  ``proof.verify.count`` and ``proof.sumcheck.round.count`` for the spans that mapping
  turned into contract spans, which is what the Grafana proof dashboards read. Contract
  spans made by :class:`~otel_proofscope.instrumentation.ProofTracer` already recorded
  theirs, so they are not counted twice.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode
from opentelemetry.util.types import AttributeValue

from otel_proofscope.mapping.apply import CONTRACT_SPANS, Mapper
from otel_proofscope.mapping.rules import RuleSet, load_rules
from otel_proofscope.semconv import METER_NAME, Attr, EventName, Metric, SpanName
from otel_proofscope.version import __version__

_log = logging.getLogger(__name__)

#: Environment variable naming a preset or a rule file (``configure()`` without ``map=``).
MAP_ENV = "PROOFSCOPE_MAP"

MapSpec = str | os.PathLike[str] | RuleSet | Mapper | None


def mapper_for(spec: MapSpec, *, use_env: bool = True) -> Mapper | None:
    """One Mapper for ``spec`` (or ``$PROOFSCOPE_MAP`` when ``spec`` is None), or None.

    Raises :class:`~otel_proofscope.mapping.rules.RuleError` for a bad rule file: a
    typo must stop the setup, not silently map nothing.
    """
    if spec is None and use_env:
        spec = os.environ.get(MAP_ENV, "").strip() or None
    if spec is None:
        return None
    if isinstance(spec, Mapper):
        return spec
    rules = spec if isinstance(spec, RuleSet) else load_rules(os.fspath(spec))
    _log.info("mapping spans with %s (%d span rules, %d event rules)", rules.label,
              len(rules.spans), len(rules.events))
    return Mapper(rules)


class MappingSpanExporter(SpanExporter):
    """Maps each batch, then hands it to ``inner``; shutdown and flush pass through."""

    def __init__(self, inner: SpanExporter, mapper: Mapper) -> None:
        self.inner = inner
        self.mapper = mapper

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export(self.mapper.map_spans(spans))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def __getattr__(self, name: str) -> object:
        # Sink-specific extras (a Rerun exporter's stats, …) stay reachable.
        return getattr(self.inner, name)


def wrap(exporter: SpanExporter, mapper: Mapper | None) -> SpanExporter:
    """``exporter`` behind the mapper, or unchanged when there is none."""
    return exporter if mapper is None else MappingSpanExporter(exporter, mapper)


class ProofMetricsFromSpans(SpanProcessor):
    """Proof metrics for spans that mapping turns into contract spans."""

    def __init__(self, mapper: Mapper, meter_provider: metrics.MeterProvider | None = None,
                 ) -> None:
        self.mapper = mapper
        meter = metrics.get_meter(METER_NAME, __version__, meter_provider)
        self._proof = Metric.PROOF_DURATION.histogram(meter)
        self._layer = Metric.PROOF_LAYER_DURATION.histogram(meter)
        self._rounds = Metric.PROOF_SUMCHECK_ROUND_COUNT.counter(meter)
        self._verify = Metric.PROOF_VERIFY_COUNT.counter(meter)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        if span.name in CONTRACT_SPANS:
            return  # made by ProofTracer, which recorded its own metrics
        try:
            self.record(self.mapper.map_span(span))
        except Exception:  # telemetry must never break the prover
            _log.exception("proof metrics of mapped span %r failed", span.name)

    def record(self, span: ReadableSpan) -> None:
        """Record the metrics of one (already mapped) contract span."""
        a = span.attributes or {}
        if Attr.MAPPING_SOURCE_NAME not in a:
            return
        start, end = span.start_time, span.end_time
        seconds = (end - start) / 1e9 if isinstance(start, int) and isinstance(end, int) \
            and end >= start else None
        system = str(a.get(Attr.PROOF_SYSTEM) or self.mapper.rules.meta.system or "unknown")
        backend = str(a.get(Attr.PROOF_BACKEND) or "unknown")
        failed = span.status.status_code is StatusCode.ERROR
        verified = a.get(Attr.PROOF_VERIFIED)
        name = span.name
        if name == SpanName.PROOF and seconds is not None:
            attrs: dict[str, AttributeValue] = {Attr.PROOF_SYSTEM: system,
                                                Attr.PROOF_BACKEND: backend}
            if isinstance(verified, bool):
                attrs[Attr.PROOF_VERIFIED] = verified
            elif failed:
                attrs[Attr.PROOF_VERIFIED] = False
            self._proof.record(seconds, attrs)
        elif name == SpanName.LAYER:
            kind = str(a.get(Attr.LAYER_KIND) or "Unknown")
            if seconds is not None:
                self._layer.record(seconds, {Attr.PROOF_SYSTEM: system, Attr.PROOF_BACKEND:
                                             backend, Attr.LAYER_KIND: kind})
            rounds = sum(1 for ev in span.events if ev.name == EventName.SUMCHECK_ROUND)
            if rounds:
                self._rounds.add(rounds, {Attr.PROOF_SYSTEM: system, Attr.LAYER_KIND: kind})
        # A verification counts only with an outcome the span states: a verdict
        # attribute, or ERROR as a rejection.
        elif name == SpanName.VERIFY and (isinstance(verified, bool) or failed):
            ok = verified if isinstance(verified, bool) else False
            self._verify.add(1, {Attr.PROOF_SYSTEM: system, Attr.PROOF_VERIFIED: ok})

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def install_metrics(tracer_provider: object, meter_provider: metrics.MeterProvider,
                    mapper: Mapper | None) -> None:
    """Add :class:`ProofMetricsFromSpans` to an SDK TracerProvider when mapping is on."""
    if mapper is None:
        return
    add = getattr(tracer_provider, "add_span_processor", None)
    if add is not None:
        add(ProofMetricsFromSpans(mapper, meter_provider))


def summary(mapper: Mapper) -> str:
    """One line: what the rules renamed (``mapped: 5 spans (proof.layer=4, proof=1) …``)."""
    st = mapper.stats
    parts = ", ".join(f"{k}={v}" for k, v in sorted(st.spans_mapped.items()))
    line = (f"mapped with {mapper.rules.label}: {st.total_mapped()} of {st.spans_seen} spans"
            + (f" ({parts})" if parts else "") + f", {st.events_mapped} round events")
    if st.round_spans:
        line += f", {st.round_spans} round spans as events of their layer"
    if st.index_fallbacks:
        line += f"; {st.index_fallbacks} without a usable index attribute (numbered in order)"
    if st.traces_forgotten:
        line += f"; {st.traces_forgotten} traces' layer counters forgotten (bound)"
    return line

