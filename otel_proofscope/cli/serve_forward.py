"""``proofscope serve --forward``: re-export what serve received over OTLP.

Why: serve draws a foreign prover's spans in Rerun, but Grafana reads the proof metrics
(``proof.duration``, ``proof.layer.duration``, ``proof.sumcheck.round.count``) that only
an instrumented prover used to make. Forwarding sends on:

* every received span, mapped when ``--map`` is on (contract names, the original kept
  in ``proofscope.mapping.source_name``), through the project's bounded batch processor
  and OTLP exporter (sink ``forward``: every loss counted in the drop ledger);
* every received metric point, through a counting OTLP metric exporter;
* the proof metrics the mapped spans imply (``ProofMetricsFromSpans.record``), on a
  periodic reader of their own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from urllib.parse import urlparse

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from otel_proofscope.ledger import DROPS
from otel_proofscope.mapping.apply import Mapper
from otel_proofscope.mapping.wiring import ProofMetricsFromSpans
from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter
from otel_proofscope.pipeline.metric_export import CountingMetricExporter, SinkMetricReader
from otel_proofscope.pipeline.processor import DEFAULT_MAX_QUEUE_BYTES, BoundedBatchSpanProcessor

_log = logging.getLogger("otel_proofscope.serve.forward")

#: The drop-ledger sink of everything forwarded.
SINK = "forward"
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOLS = ("grpc", "http/protobuf")
#: Spans queued for the forward exporter (and bytes, estimated): beyond, counted lost.
MAX_QUEUE_SPANS = 65_536
#: Seconds between two exports of the received and implied metrics.
METRIC_INTERVAL_S = 5.0
#: Bound on one export, and on the flush at shutdown.
TIMEOUT_S = 5.0


class ForwardError(ValueError):
    """A forward endpoint that cannot be used; the message names it."""


def endpoint_from(cli_value: str | None) -> tuple[str | None, str]:
    """(endpoint, where it came from): ``--forward``, else the OTLP variable, else None."""
    if cli_value:
        return cli_value.strip(), "--forward"
    env = (os.environ.get(ENDPOINT_ENV) or "").strip()
    return (env, ENDPOINT_ENV) if env else (None, "")


def _host_port(endpoint: str) -> tuple[str, int | None]:
    parsed = urlparse(endpoint if "//" in endpoint else f"//{endpoint}")
    try:
        port = parsed.port
    except ValueError:
        raise ForwardError(f"bad port in {endpoint!r}") from None
    return (parsed.hostname or "").lower(), port


def check_not_self(endpoint: str, own_host: str, own_ports: Sequence[int | None]) -> None:
    """Refuse an endpoint that is serve itself: it would receive its own exports again
    and again (a shell that exported OTEL_EXPORTER_OTLP_ENDPOINT for the prover)."""
    host, port = _host_port(endpoint)
    local = {"127.0.0.1", "localhost", "::1", "0.0.0.0", "::", own_host.strip().lower()}
    if host in local and port is not None and port in [p for p in own_ports if p]:
        raise ForwardError(f"{endpoint!r} is this serve's own port; forwarding to it would "
                           "loop")


#: The header variables every OTLP exporter reads, the forward ones included.
HEADER_ENVS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
               "OTEL_EXPORTER_OTLP_METRICS_HEADERS")


def check_token_stays(token: str | None) -> None:
    """Refuse to forward when an OTLP header variable holds serve's own token: the
    forward exporters send those headers as every OTLP exporter does, so a shell that
    set them for its prover (``authorization=Bearer $TOKEN``, as serve's help says)
    would hand serve's secret to the forward endpoint. The token is never printed."""
    if not token:
        return
    from opentelemetry.util.re import parse_env_headers

    for name in HEADER_ENVS:
        # Read as the exporters read them (URL-decoded, "key=value" pairs); a value is
        # the token itself or a scheme and the token ("Bearer T").
        values = parse_env_headers(os.environ.get(name, ""), liberal=True).values()
        if any(v.split()[-1:] == [token] for v in values):
            raise ForwardError(f"${name} holds this serve's own token, which the forward "
                               "exporters would send on to the endpoint; unset it for "
                               "serve, or give the prover and serve another token")


def check_base_url(endpoint: str, protocol: str) -> None:
    """OTLP/HTTP's endpoint is a base URL, as ``OTEL_EXPORTER_OTLP_ENDPOINT`` is: the
    signal paths are added. A signal path given too would post to ``/v1/traces/v1/
    traces``, and every span would be counted lost."""
    if protocol != "http/protobuf":
        return
    path = urlparse(endpoint).path.rstrip("/")
    if path.endswith(("/v1/traces", "/v1/metrics")):
        raise ForwardError(f"{endpoint!r}: give the base URL (without {path[path.rfind('/v1/'):]}"
                           "): /v1/traces and /v1/metrics are added to it")


def _sampled(span: ReadableSpan) -> ReadableSpan:
    """``span`` with the sampled flag set. A received span was sampled by its sender,
    but OTLP senders may leave the W3C flags out of ``Span.flags`` (the Python SDK's
    encoder does), and the batch processor skips unsampled spans without a count."""
    ctx = span.context
    if ctx is None or ctx.trace_flags.sampled:
        return span
    sampled = SpanContext(ctx.trace_id, ctx.span_id, ctx.is_remote,
                          TraceFlags(ctx.trace_flags | TraceFlags.SAMPLED), ctx.trace_state)
    return ReadableSpan(
        name=span.name, context=sampled, parent=span.parent, resource=span.resource,
        attributes=span.attributes, events=span.events, links=span.links, kind=span.kind,
        status=span.status, start_time=span.start_time, end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope)


class _Received(SpanExporter):
    """What Ingest hands over (mapped already, when mapping is on): queued for OTLP in
    the bounded processor, and the proof metrics of the mapped spans recorded."""

    def __init__(self, processor: BoundedBatchSpanProcessor,
                 metrics: ProofMetricsFromSpans | None) -> None:
        self.processor = processor
        self.metrics = metrics

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self.processor.on_end(_sampled(span))  # never blocks; a full queue is counted there
            if self.metrics is not None:
                try:
                    self.metrics.record(span)
                except Exception:  # one odd span must not stop the rest
                    _log.exception("proof metrics of forwarded span %r failed", span.name)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


class Fanout(SpanExporter):
    """One exporter for Ingest in front of several, so a batch is mapped once (the
    mapper's counts stay per span). The first (the Rerun exporter) answers for the
    queue (``backlog``/``can_take``) and for the result; the others queue on their own
    and count their own losses."""

    def __init__(self, first: SpanExporter, *others: SpanExporter) -> None:
        self.first = first
        self.others = others

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for other in self.others:
            other.export(spans)
        return self.first.export(spans)

    def shutdown(self) -> None:
        self.first.shutdown()
        for other in self.others:
            other.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.first.force_flush(timeout_millis)

    def __getattr__(self, name: str) -> object:
        return getattr(self.first, name)


class _ReceivedMetrics(MetricExporter):
    """Received metric points, sent on as they are (counted by the wrapper)."""

    def __init__(self, inner: CountingMetricExporter) -> None:
        super().__init__()
        self.inner = inner

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        return self.inner.export(metrics_data, timeout_millis=timeout_millis)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        pass


def _metric_exporter(endpoint: str, protocol: str) -> MetricExporter:
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(  # type: ignore[no-any-return]
            endpoint=f"{endpoint.removesuffix('/')}/v1/metrics", timeout=TIMEOUT_S)
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    insecure = not endpoint.startswith("https://")
    return GrpcMetricExporter(endpoint=endpoint, insecure=insecure,  # type: ignore[no-any-return]
                              timeout=TIMEOUT_S)


class Forward:
    """The forward route: a span exporter and a metric exporter for Ingest, plus the
    meter that records the implied proof metrics."""

    def __init__(self, endpoint: str, mapper: Mapper | None, protocol: str | None = None,
                 metric_interval_s: float = METRIC_INTERVAL_S) -> None:
        protocol = (protocol or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
                    ).strip().lower()
        if protocol not in PROTOCOLS:
            raise ForwardError(f"protocol {protocol!r} is not supported; use "
                               f"{' or '.join(PROTOCOLS)}")
        check_base_url(endpoint, protocol)
        self.endpoint = endpoint
        self.protocol = protocol
        span_target = endpoint if protocol == "grpc" \
            else f"{endpoint.removesuffix('/')}/v1/traces"
        spans = FastOTLPSpanExporter(span_target, protocol=protocol, timeout=TIMEOUT_S,
                                     sink=SINK)
        self.processor = BoundedBatchSpanProcessor(
            spans, sink=SINK, max_queue_size=MAX_QUEUE_SPANS,
            max_queue_bytes=DEFAULT_MAX_QUEUE_BYTES)
        otlp_metrics = _metric_exporter(endpoint, protocol)
        self.received_metrics = CountingMetricExporter(otlp_metrics, SINK)
        self.implied = CountingMetricExporter(_metric_exporter(endpoint, protocol), SINK)
        self.meter_provider: MeterProvider | None = None
        proof_metrics = None
        if mapper is not None:
            self._reader = SinkMetricReader(self.implied, interval_s=metric_interval_s,
                                            timeout_s=TIMEOUT_S)
            self.meter_provider = MeterProvider(
                metric_readers=[self._reader],
                resource=Resource.create({"service.name": "proofscope-serve"}))
            proof_metrics = ProofMetricsFromSpans(mapper, self.meter_provider)
        self.span_exporter = _Received(self.processor, proof_metrics)
        self.metric_exporter = _ReceivedMetrics(self.received_metrics)

    def shutdown(self, timeout_s: float = TIMEOUT_S) -> None:
        """Flush within ``timeout_s`` each; what is left is counted by the processor."""
        self.processor.shutdown(timeout_millis=int(timeout_s * 1000))
        if self.meter_provider is not None:
            try:
                self.meter_provider.shutdown(timeout_millis=timeout_s * 1000)
            except Exception:
                _log.exception("forward: the proof-metric reader failed to shut down")
        # The reader shut its own exporter (implied) down; a second call only warns.
        shut = (self.received_metrics,) if self.meter_provider is not None \
            else (self.received_metrics, self.implied)
        for exp in shut:
            try:
                exp.shutdown(timeout_millis=timeout_s * 1000)
            except Exception:
                _log.exception("forward: metric exporter failed to shut down")

    def summary(self) -> str:
        spans, _ = self.processor.stats.delivered(DROPS, SINK)
        return (f"forwarded to {self.endpoint} ({self.protocol}): {spans} spans, "
                f"{self.received_metrics.delivered()} received metric points, "
                f"{self.implied.points_exported} proof metric points")
