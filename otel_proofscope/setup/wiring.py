"""``configure()``: the one call that sets up tracing and metrics for a prover.

Exporter choice, in order:

1. ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` when set (``otlp``, ``console``,
   ``rerun``, ``none``, ``file`` or any installed exporter entry point), as in any
   OTel SDK;
2. otherwise OTLP when an endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or the
   per-signal variables; protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``, default grpc);
3. otherwise OTLP/JSON lines files ``traces.jsonl`` / ``metrics.jsonl`` in ``out_dir``
   (the collector's ``otlpjsonfile`` format, written by the official file exporter).

The Rerun view is added when ``rerun`` (or ``PROOFSCOPE_RERUN``) names a target: one
route, the export process (``rerun/export_process.py``), started here so its start-up
overlaps the prover's work; the OTLP spans go through it too. A Prometheus scrape
endpoint is added when ``prometheus_port`` is given. Every sink gets its own bounded
queue, so a dead collector never starves the Rerun view or the prover.

The arguments and variables are parsed once into :class:`~.options.Options`; the
exporters come from one builder per sink in :mod:`.sinks`; this module only wires them
into the providers.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from otel_proofscope import instrumentation
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.mapping import wiring as mapping
from otel_proofscope.pipeline.fork_exit import flush_forked_children
from otel_proofscope.pipeline.metric_export import CountingMetricExporter, SinkMetricReader
from otel_proofscope.pipeline.multi_sink import MultiSinkBatchSpanProcessor
from otel_proofscope.pipeline.privacy import Local, WitnessFilter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor, SpanLimitAccounting
from otel_proofscope.pipeline.self_metrics import register_self_metrics
from otel_proofscope.pipeline.sigterm import sigterm_to_exit
from otel_proofscope.setup import sinks
from otel_proofscope.setup.options import Options
from otel_proofscope.setup.telemetry import Telemetry
from otel_proofscope.version import __version__


class _Build:
    """The providers' parts as configure() collects them, sink by sink."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.resource = _resource(options)
        self.tracer_provider = TracerProvider(
            resource=self.resource, shutdown_on_exit=False,
            span_limits=SpanLimits(max_events=options.max_events_per_span))
        self.tracer_provider.add_span_processor(SpanLimitAccounting())
        self.processors: list[BoundedBatchSpanProcessor] = []
        self.witness_filters: list[WitnessFilter] = []
        self.counted: list[CountingMetricExporter] = []
        self.readers: list[MetricReader] = list(options.metric_readers)
        self.closers: list[Any] = []
        self.rerun: list[Any] = []  # the Rerun sinks / children, closed last at shutdown
        self.used_dir: Path | None = None
        # OTLP and Rerun spans through one child process (None: each sink its own route).
        self.export = sinks.export_process_config(options)
        self.export_built = False

    def add_spans(self, sink: str, exporter: SpanExporter, local: bool = False) -> None:
        # Mapping rules first: every sink receives the same contract spans.
        exporter = mapping.wrap(exporter, self.options.mapper)
        # Witness values stay in the process unless export_witness says otherwise;
        # local sinks (the Rerun exporter built here, and the caller's exporters marked
        # with privacy.local()) see them regardless. Each filter counts for its sink.
        if not local and not self.options.export_witness:
            exporter = WitnessFilter(exporter, sink)
            self.witness_filters.append(exporter)
        proc = BoundedBatchSpanProcessor(exporter, sink=sink,
                                         max_queue_size=self.options.max_queue_size,
                                         max_queue_bytes=self.options.max_queue_bytes)
        self.tracer_provider.add_span_processor(proc)
        self.processors.append(proc)

    def add_export_process(self) -> None:
        """One processor (and one packing per span) for the sinks the child serves."""
        if self.export_built:
            return
        self.export_built = True
        exporter: Any = sinks.export_process_span_exporter(self.export, self.options)
        self._keep_rerun(exporter)
        if "otlp" in self.export.sinks and not self.options.export_witness:
            self.witness_filters.append(exporter.worker.witness)  # the child filters
        proc = MultiSinkBatchSpanProcessor(
            mapping.wrap(exporter, self.options.mapper), sinks=self.export.sinks,
            max_queue_size=self.options.max_queue_size,
            max_queue_bytes=self.options.max_queue_bytes)
        self.tracer_provider.add_span_processor(proc)
        self.processors.append(proc)

    def add_metrics(self, sink: str, exporter: MetricExporter) -> None:
        wrapped = CountingMetricExporter(exporter, sink)
        self.counted.append(wrapped)
        self.readers.append(SinkMetricReader(wrapped, interval_s=self.options.metric_interval_s,
                                             timeout_s=self.options.shutdown_timeout_s))

    def _keep_rerun(self, exporter: object) -> None:
        # The sink (thread) or worker (child process) behind a Rerun exporter; span and
        # metric exporters of one target share it.
        for attr in ("sink", "worker"):
            resource = getattr(exporter, attr, None)
            if resource is not None and hasattr(resource, "close"):
                if all(resource is not r for r in self.rerun):
                    self.rerun.append(resource)
                return

    def file_dir(self) -> Path:
        directory = self.options.out_dir
        directory.mkdir(parents=True, exist_ok=True)
        self.used_dir = directory
        return directory

    def span_sink(self, name: str) -> None:
        opts = self.options
        if name == "none":
            return
        if self.export is not None and name in self.export.sinks:
            self.add_export_process()
        elif name == "otlp":
            self.add_spans("otlp", sinks.otlp_span_exporter(opts.shutdown_timeout_s))
        elif name == "file":
            self.add_spans("file", sinks.file_span_exporter(self.file_dir()))
        elif name == "console":
            self.add_spans("console", sinks.console_span_exporter())
        elif name == "rerun":
            exporter = sinks.rerun_span_exporter(opts)
            self._keep_rerun(exporter)
            self.add_spans("rerun", exporter, local=True)
        else:
            self.add_spans(name, sinks.entry_point("opentelemetry_traces_exporter", name)())

    def metric_sink(self, name: str) -> None:
        opts = self.options
        if name in ("none", "prometheus"):  # prometheus: a reader, added below
            return
        if name == "otlp":
            self.add_metrics("otlp", sinks.otlp_metric_exporter(opts.shutdown_timeout_s))
        elif name == "file":
            self.add_metrics("file", sinks.file_metric_exporter(self.file_dir()))
        elif name == "console":
            self.add_metrics("console", sinks.console_metric_exporter())
        elif name == "rerun":
            metric_exporter = sinks.rerun_metric_exporter(opts, self.export)
            self._keep_rerun(metric_exporter)
            self.add_metrics("rerun", metric_exporter)
        else:
            self.add_metrics(name,
                             sinks.entry_point("opentelemetry_metrics_exporter", name)())


def _resource(options: Options) -> Resource:
    attrs: dict[str, str] = {"telemetry.distro.name": "otel_proofscope",
                             "telemetry.distro.version": __version__}
    if options.service_name and not os.environ.get("OTEL_SERVICE_NAME"):
        attrs[SERVICE_NAME] = options.service_name
    attrs.update(options.resource_attributes)
    return Resource.create(attrs)


def configure(
    *,
    service_name: str | None = None,
    resource_attributes: Mapping[str, str] | None = None,
    out_dir: str | Path | None = None,
    rerun: str | None = None,
    rerun_process: bool | None = None,
    prometheus_port: int | None = None,
    capture_witness: bool | None = None,
    export_witness: bool | None = None,
    metric_interval_s: float | None = None,
    shutdown_timeout_s: float | None = None,
    max_events_per_span: int | None = None,
    max_queue_size: int | None = None,
    handle_sigterm: bool = True,
    span_exporters: Sequence[tuple[str, SpanExporter]] = (),
    metric_readers: Sequence[MetricReader] = (),
    set_global: bool = True,
    map: str | Path | Any = None,  # a preset name, rule file, RuleSet or Mapper
    max_queue_bytes: int | None = None,
    export_process: bool | None = None,
) -> Telemetry:
    """Set up tracer + meter providers for a prover and return a :class:`Telemetry`.

    Args:
        service_name: default ``service.name`` (``OTEL_SERVICE_NAME`` wins when set).
        out_dir: where the JSON-lines files go when no OTLP endpoint is configured
            (``PROOFSCOPE_OUT_DIR``, default ``./proofscope-out``).
        rerun: ``spawn``, ``file:PATH.rrd``, ``rerun+http://HOST:PORT/proxy`` or ``off``
            (default ``PROOFSCOPE_RERUN``, else off).
        rerun_process: retired (issue 29): ignored with one warning, as is
            ``PROOFSCOPE_RERUN_PROCESS``. The Rerun view is always drawn by the export
            process (see ``export_process``).
        prometheus_port: also serve ``/metrics`` on 127.0.0.1:PORT
            (``PROOFSCOPE_PROMETHEUS_PORT``).
        capture_witness: record activation statistics and attention scores at all
            (``PROOFSCOPE_CAPTURE_WITNESS``, default off).
        export_witness: let them leave the process over OTLP / files
            (``PROOFSCOPE_EXPORT_WITNESS``, default off; Rerun may show them regardless).
        shutdown_timeout_s: bound on ``shutdown()`` and on process exit
            (``PROOFSCOPE_SHUTDOWN_TIMEOUT``, default 3 s). An export process that has
            not started by then (a short run on a busy machine) gets at most
            min(bound, 3 s) more, so the Rerun view is not lost to its start-up.
        span_exporters / metric_readers: extra ``(sink_name, exporter)`` pairs / readers.
            Witness events are filtered out of these too unless ``export_witness``, or
            the exporter is wrapped in :func:`otel_proofscope.pipeline.privacy.local`.
        max_queue_size: spans queued per sink before new ones are dropped and counted
            (``PROOFSCOPE_MAX_QUEUE``, default 8192: bounds memory with a dead collector).
        max_queue_bytes: the same bound in estimated bytes per sink
            (``PROOFSCOPE_MAX_QUEUE_BYTES``, default 24 MiB): a span with many events
            holds ~10x the memory of one without (``pipeline.processor.estimate_bytes``).
        handle_sigterm: when SIGTERM has its default action, turn it into ``SystemExit``
            so open spans end (marked as errors) and the bounded shutdown runs at exit.
        set_global: install the providers globally (``get_tracer()`` then uses them).
        map: mapping rules for a foreign prover's spans, a preset name (``"sp1"``) or a
            rule file (``PROOFSCOPE_MAP``; docs/mapping.md): every sink receives the
            contract spans, and the proof metrics are recorded for them.
        export_process: whether OTLP spans are exported from the export process, the
            child that packs each span once and draws the Rerun view, so neither
            competes with the prover for the GIL (``PROOFSCOPE_EXPORT_PROCESS``).
            Default: there whenever Rerun is on (the child then runs anyway), here
            (in-thread fast exporter) for OTLP-only runs. ``True`` moves OTLP-only runs
            there too; ``False`` keeps OTLP here. The Rerun view is drawn by the child
            either way; it starts inside configure(), so its start-up overlaps the
            prover's work. Metric export stays in this process (Rerun metrics go to the
            same child).

    Raises:
        ValueError: for an argument or variable that cannot be meant (``nan``, ``inf``,
            a negative or non-numeric amount …), naming it.
    """
    # Every parameter, by name: Options.resolve takes exactly configure()'s signature.
    options = Options.resolve(**locals())
    return build(options)


def build(options: Options) -> Telemetry:
    """Wire the providers, sinks and self-metrics that ``options`` describe."""
    parts = _Build(options)
    for name in options.trace_exporters:
        parts.span_sink(name)
    for name in options.metric_exporters:
        parts.metric_sink(name)
    for sink, exporter in options.span_exporters:
        # Filtered unless the caller opted in with privacy.local(): an extra exporter
        # (a backup collector) may well leave the process.
        parts.add_spans(sink, exporter, local=isinstance(exporter, Local))
    if options.prometheus_port is not None:
        parts.readers.append(sinks.prometheus_reader(options.prometheus_port, parts.closers))

    meter_provider = MeterProvider(resource=parts.resource, metric_readers=parts.readers,
                                   shutdown_on_exit=False)
    mapping.install_metrics(parts.tracer_provider, meter_provider, options.mapper)
    instrumentation.set_capture_witness(options.capture_witness)
    if options.capture_witness:
        # Witness capture is process-wide: once this pipeline (and its privacy filter) is
        # shut down, a tracer on another provider must not go on recording witness data
        # into spans that an unfiltered exporter may send.
        parts.closers.append(functools.partial(instrumentation.set_capture_witness, False))
    instrumentation.set_max_events_per_span(options.max_events_per_span)
    parts.closers.append(functools.partial(instrumentation.release_max_events_per_span,
                                           options.max_events_per_span))
    if options.set_global:
        trace.set_tracer_provider(parts.tracer_provider)
        metrics.set_meter_provider(meter_provider)
    register_self_metrics(meter_provider)
    telemetry = Telemetry(
        tracer_provider=parts.tracer_provider, meter_provider=meter_provider,
        tracer=ProofTracer(parts.tracer_provider, meter_provider),
        span_processors=parts.processors, metric_exporters=parts.counted,
        shutdown_timeout_s=options.shutdown_timeout_s, out_dir=parts.used_dir,
        witness_filters=parts.witness_filters, _closers=parts.closers, _rerun=parts.rerun,
        _sink_readers=[r for r in parts.readers if isinstance(r, SinkMetricReader)])
    atexit.register(telemetry.shutdown)
    flush_forked_children(telemetry)
    if options.handle_sigterm:
        sigterm_to_exit()
    return telemetry
