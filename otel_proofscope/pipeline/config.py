"""``configure()``: the one call that sets up tracing and metrics for a prover.

Exporter choice, in order:

1. ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` when set (``otlp``, ``console``,
   ``rerun``, ``none``, ``file`` or any installed exporter entry point), as in any
   OTel SDK;
2. otherwise OTLP when an endpoint is configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or the
   per-signal variables; protocol from ``OTEL_EXPORTER_OTLP_PROTOCOL``, default grpc);
3. otherwise OTLP/JSON lines files ``traces.jsonl`` / ``metrics.jsonl`` in ``out_dir``
   (the collector's ``otlpjsonfile`` format, written by the official file exporter).

The Rerun exporter is added when ``rerun`` (or ``PROOFSCOPE_RERUN``) names a target,
and a Prometheus scrape endpoint when ``prometheus_port`` is given. Every sink gets
its own bounded queue, so a dead collector never starves the Rerun view or the prover.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from otel_proofscope import instrumentation
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.pipeline.deadline import (
    ENV_SHUTDOWN_TIMEOUT,
    parse_timeout,
    set_shutdown_deadline,
)
from otel_proofscope.pipeline.drops import DROPS, DropLedger
from otel_proofscope.pipeline.fork_exit import flush_forked_children
from otel_proofscope.pipeline.metric_export import CountingMetricExporter
from otel_proofscope.pipeline.privacy import Local, WitnessFilter
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor, SpanLimitAccounting
from otel_proofscope.pipeline.sigterm import hold_sigterm, sigterm_to_exit
from otel_proofscope.version import __version__

_log = logging.getLogger(__name__)

DEFAULT_OUT_DIR = "proofscope-out"
DEFAULT_MAX_EVENTS_PER_SPAN = 16_384
DEFAULT_MAX_QUEUE = 8_192


def _env_bool(name: str) -> bool | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return raw.strip().lower() in ("1", "true", "yes", "on")


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return value


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return [p.strip().lower() for p in raw.split(",") if p.strip()]


def otlp_endpoint_configured(kind: str) -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get(f"OTEL_EXPORTER_OTLP_{kind.upper()}_ENDPOINT"))


def _otlp_protocol(kind: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{kind.upper()}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()


def _otlp_timeout_s(bound_s: float) -> float:
    # The exporter's own timeout (incl. retries) may not exceed the shutdown bound,
    # or a dead collector would hold the last export past it.
    # Seconds, as the official Python exporters read it (the spec says milliseconds;
    # either way the shutdown bound caps it).
    configured = os.environ.get("OTEL_EXPORTER_OTLP_TIMEOUT")
    env_s = float(configured) if configured else 10.0
    return max(0.1, min(env_s, bound_s))


def _otlp_span_exporter(bound_s: float) -> SpanExporter:
    timeout = _otlp_timeout_s(bound_s)
    protocol = _otlp_protocol("traces")
    encoder = os.environ.get("PROOFSCOPE_OTLP_ENCODER", "fast").strip().lower()
    if encoder not in ("fast", "sdk"):
        raise ValueError(f"PROOFSCOPE_OTLP_ENCODER must be 'fast' or 'sdk', got {encoder!r}")
    if protocol in ("grpc", "http/protobuf") and encoder == "fast":
        # Same wire bytes as the official encoder (tested), ~10x cheaper: the export
        # thread then steals far less of the prover's GIL time.
        from otel_proofscope.pipeline.fast_otlp import FastOTLPSpanExporter

        return FastOTLPSpanExporter(protocol=protocol, timeout=timeout)
    if protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(timeout=timeout)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
        OTLPSpanExporter as GrpcSpanExporter,
    )

    return GrpcSpanExporter(timeout=timeout)  # type: ignore[no-any-return]


def _otlp_metric_exporter(bound_s: float) -> MetricExporter:
    timeout = _otlp_timeout_s(bound_s)
    if _otlp_protocol("metrics").startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(timeout=timeout)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    return GrpcMetricExporter(timeout=timeout)  # type: ignore[no-any-return]


def _entry_point(group: str, name: str) -> Any:
    for ep in entry_points(group=group, name=name):
        return ep.load()
    raise ValueError(f"unknown exporter {name!r}: no '{group}' entry point of that name "
                     "is installed")


@dataclass
class ShutdownReport:
    """What the pipeline delivered and lost, for the exit summary."""

    duration_s: float
    spans_exported: dict[str, int]
    events_exported: dict[str, int]
    metric_points_exported: dict[str, int]
    dropped: int
    drop_lines: list[str]
    rejected: int
    witness_events_withheld: int
    timed_out: bool
    #: Witness events each filtered sink withheld (never counted as exported there).
    witness_by_sink: dict[str, int] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = []
        for sink, n in sorted(self.spans_exported.items()):
            out.append(f"exported to {sink}: {n} spans, {self.events_exported.get(sink, 0)} "
                       f"span events, {self.metric_points_exported.get(sink, 0)} metric points")
        for sink, n in sorted(self.metric_points_exported.items()):
            if sink not in self.spans_exported:
                out.append(f"exported to {sink}: {n} metric points")
        out += self.drop_lines
        if self.rejected:
            out.append(f"rejected bad input: {self.rejected} (see proofscope.rejected)")
        if self.witness_events_withheld:
            per_sink = ", ".join(f"{k}: {n}" for k, n in sorted(self.witness_by_sink.items())
                                 if n)
            out.append(f"witness events kept out of OTLP: {self.witness_events_withheld} "
                       f"({per_sink})")
        if self.timed_out:
            out.append(f"shutdown hit its {self.duration_s:.1f} s bound")
        return out


@dataclass
class Telemetry:
    """Handle returned by :func:`configure`."""

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    tracer: ProofTracer
    span_processors: list[BoundedBatchSpanProcessor]
    metric_exporters: list[CountingMetricExporter]
    shutdown_timeout_s: float
    out_dir: Path | None
    ledger: DropLedger = DROPS
    witness_filters: list[WitnessFilter] = field(default_factory=list)
    _closers: list[Any] = field(default_factory=list)
    _before_shutdown: list[Any] = field(default_factory=list)
    _rerun: list[Any] = field(default_factory=list)
    _report: ShutdownReport | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start_gpu_sampler(self, interval_s: float = 1.0, *,
                          evidence: Literal["first_dispatch", "immediately"] = "first_dispatch",
                          ) -> Any:
        """Sample NVML devices into ``hw.*`` instruments until shutdown.

        Returns the sampler, or None when no NVML device is present (a CPU-only machine
        stays silent). ``evidence="immediately"`` reports capability gaps at once
        (for wrapped processes whose dispatches we cannot see).
        """
        from otel_proofscope.gpu import start_sampler

        sampler = start_sampler(meter_provider=self.meter_provider, interval_s=interval_s,
                                evidence=evidence)
        if sampler is not None:
            self._before_shutdown.append(sampler.stop)
        return sampler

    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Export what is queued; bounded by ``timeout_s`` (default: the shutdown bound)."""
        budget = timeout_s if timeout_s is not None else self.shutdown_timeout_s
        deadline = time.monotonic() + budget
        ok = all(p.force_flush(int(max(0.0, deadline - time.monotonic()) * 1000))
                 for p in self.span_processors)
        # Metrics get their own share of the budget: a dead span sink must not leave
        # them none (the SDK raises MetricsTimeoutError on a zero timeout).
        remaining = max(budget / 4, deadline - time.monotonic()) * 1000
        try:
            return self.meter_provider.force_flush(int(remaining)) and ok
        except Exception as exc:
            _log.warning("metric flush did not finish within %.1f s: %s", remaining / 1000, exc)
            return False

    def shutdown(self, timeout_s: float | None = None) -> ShutdownReport:
        """Flush and close every sink within ``timeout_s``; report what was lost."""
        with self._lock:
            if self._report is not None:
                return self._report
            budget = timeout_s if timeout_s is not None else self.shutdown_timeout_s
            start = time.monotonic()
            deadline = start + budget
            # Exporters whose shutdown takes no timeout (Rerun) close within what is left;
            # cleared afterwards, or a later pipeline in this process would inherit it.
            set_shutdown_deadline(deadline)
            # A second SIGTERM (an impatient supervisor) must not abort the accounting
            # half way: the bound already guarantees a prompt exit.
            restore = hold_sigterm()
            try:
                self._close_all(budget, deadline)
            finally:
                set_shutdown_deadline(None)
                restore()
            elapsed = time.monotonic() - start
            self._report = self._make_report(budget, elapsed > budget)
            if self._report.dropped:
                for line in self._report.drop_lines:
                    _log.warning("%s", line)
            return self._report

    def _close_all(self, budget: float, deadline: float) -> None:
        for stop in self._before_shutdown:
            self._bounded(stop, min(deadline, time.monotonic() + budget / 4))
        # Metrics first: the final collection includes the last proof's durations. We
        # wait for them at most half the budget before the spans' turn (a hung metric
        # sink used to leave the spans no time: they were reported as delivered), and
        # then again with whatever the spans left.
        metrics = self._bounded(lambda: self.meter_provider.shutdown(
            timeout_millis=max(1, (deadline - time.monotonic()) * 1000)),
            min(deadline, time.monotonic() + budget / 2))
        for processor in self.span_processors:
            processor.shutdown(int(max(0.0, deadline - time.monotonic()) * 1000))
        metrics.join(max(0.0, deadline - time.monotonic()))
        for exporter in self.metric_exporters:
            exporter.abandon()
        # A Rerun sink is shared by the span and the metric exporter and closes on the
        # last release; a metric shutdown that ran out of time never released, which
        # left the sink open past the report with its queue uncounted. Close it now
        # (a later release is then a no-op).
        for resource in self._rerun:
            try:
                resource.close(max(0.0, deadline - time.monotonic()))
            except Exception as exc:
                _log.debug("closing %r raised %r", resource, exc)
        for close in self._closers:
            try:
                close()
            except Exception as exc:
                _log.debug("closer raised %r", exc)

    @staticmethod
    def _bounded(fn: Any, deadline: float) -> threading.Thread:
        thread = threading.Thread(target=fn, daemon=True, name="proofscope-shutdown")
        thread.start()
        thread.join(max(0.0, deadline - time.monotonic()))
        return thread

    def _make_report(self, budget: float, timed_out: bool) -> ShutdownReport:
        from otel_proofscope.pipeline.drops import REJECTIONS

        delivered = {p.sink: p.stats.delivered(self.ledger, p.sink)
                     for p in self.span_processors}
        withheld: dict[str, int] = {}
        for f in self.witness_filters:
            withheld[f.sink] = withheld.get(f.sink, 0) + f.withheld_events
        return ShutdownReport(
            duration_s=budget,
            spans_exported={sink: d[0] for sink, d in delivered.items()},
            events_exported={sink: max(0, d[1] - withheld.get(sink, 0))
                             for sink, d in delivered.items()},
            witness_by_sink=withheld,
            metric_points_exported={e.sink: e.delivered() for e in self.metric_exporters},
            dropped=self.ledger.total(),
            drop_lines=self.ledger.summary_lines(),
            rejected=REJECTIONS.total(),
            witness_events_withheld=sum(f.withheld_events for f in self.witness_filters),
            timed_out=timed_out,
        )


def rerun_resource(exporter: object) -> Any:
    """The Rerun sink or child process behind a Rerun exporter (None for others)."""
    for attr in ("sink", "worker"):
        resource = getattr(exporter, attr, None)
        if resource is not None and hasattr(resource, "close"):
            return resource
    return None


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
) -> Telemetry:
    """Set up tracer + meter providers for a prover and return a :class:`Telemetry`.

    Args:
        service_name: default ``service.name`` (``OTEL_SERVICE_NAME`` wins when set).
        out_dir: where the JSON-lines files go when no OTLP endpoint is configured
            (``PROOFSCOPE_OUT_DIR``, default ``./proofscope-out``).
        rerun: ``spawn``, ``file:PATH.rrd``, ``rerun+http://HOST:PORT/proxy`` or ``off``
            (default ``PROOFSCOPE_RERUN``, else off).
        rerun_process: translate for Rerun in a child process, so the translation does
            not compete with the prover for the GIL, or in a thread of this process
            (``PROOFSCOPE_RERUN_PROCESS``; default: a child where 4 or more CPUs are
            usable).
        prometheus_port: also serve ``/metrics`` on 127.0.0.1:PORT
            (``PROOFSCOPE_PROMETHEUS_PORT``).
        capture_witness: record activation statistics and attention scores at all
            (``PROOFSCOPE_CAPTURE_WITNESS``, default off).
        export_witness: let them leave the process over OTLP / files
            (``PROOFSCOPE_EXPORT_WITNESS``, default off; Rerun may show them regardless).
        shutdown_timeout_s: bound on ``shutdown()`` and on process exit
            (``PROOFSCOPE_SHUTDOWN_TIMEOUT``, default 3 s).
        span_exporters / metric_readers: extra ``(sink_name, exporter)`` pairs / readers.
            Witness events are filtered out of these too unless ``export_witness``, or
            the exporter is wrapped in :func:`otel_proofscope.pipeline.privacy.local`.
        max_queue_size: spans queued per sink before new ones are dropped and counted
            (``PROOFSCOPE_MAX_QUEUE``, default 8192: bounds memory with a dead collector).
        handle_sigterm: when SIGTERM has its default action, turn it into ``SystemExit``
            so open spans end (marked as errors) and the bounded shutdown runs at exit.
        set_global: install the providers globally (``get_tracer()`` then uses them).
    """
    bound = parse_timeout(shutdown_timeout_s if shutdown_timeout_s is not None
                          else os.environ.get(ENV_SHUTDOWN_TIMEOUT),
                          name="shutdown_timeout_s" if shutdown_timeout_s is not None
                          else ENV_SHUTDOWN_TIMEOUT)
    interval = metric_interval_s if metric_interval_s is not None else _env_float(
        "OTEL_METRIC_EXPORT_INTERVAL", 5000.0) / 1000
    capture = capture_witness if capture_witness is not None else bool(
        _env_bool("PROOFSCOPE_CAPTURE_WITNESS"))
    export_w = export_witness if export_witness is not None else bool(
        _env_bool("PROOFSCOPE_EXPORT_WITNESS"))
    rerun_target = rerun if rerun is not None else os.environ.get("PROOFSCOPE_RERUN", "off")
    rerun_target = rerun_target.strip()
    if prometheus_port is None and os.environ.get("PROOFSCOPE_PROMETHEUS_PORT"):
        prometheus_port = int(os.environ["PROOFSCOPE_PROMETHEUS_PORT"])
    max_events = max_events_per_span or int(
        os.environ.get("PROOFSCOPE_MAX_EVENTS_PER_SPAN", DEFAULT_MAX_EVENTS_PER_SPAN))
    queue_size = max_queue_size or int(os.environ.get("PROOFSCOPE_MAX_QUEUE",
                                                      DEFAULT_MAX_QUEUE))
    directory = Path(out_dir or os.environ.get("PROOFSCOPE_OUT_DIR") or DEFAULT_OUT_DIR)

    attrs: dict[str, str] = {"telemetry.distro.name": "otel_proofscope",
                             "telemetry.distro.version": __version__}
    if service_name and not os.environ.get("OTEL_SERVICE_NAME"):
        attrs[SERVICE_NAME] = service_name
    attrs.update(resource_attributes or {})
    resource = Resource.create(attrs)

    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False,
                                     span_limits=SpanLimits(max_events=max_events))
    tracer_provider.add_span_processor(SpanLimitAccounting())
    processors: list[BoundedBatchSpanProcessor] = []
    witness_filters: list[WitnessFilter] = []
    counted: list[CountingMetricExporter] = []
    readers: list[MetricReader] = list(metric_readers)
    closers: list[Any] = []
    rerun_resources: list[Any] = []
    used_dir: Path | None = None

    def add_spans(sink: str, exporter: SpanExporter, local: bool = False) -> None:
        if not local and not export_w:
            exporter = WitnessFilter(exporter, sink)
            witness_filters.append(exporter)
        proc = BoundedBatchSpanProcessor(exporter, sink=sink, max_queue_size=queue_size)
        tracer_provider.add_span_processor(proc)
        processors.append(proc)

    def add_metrics(sink: str, exporter: MetricExporter) -> None:
        wrapped = CountingMetricExporter(exporter, sink)
        counted.append(wrapped)
        readers.append(PeriodicExportingMetricReader(
            wrapped, export_interval_millis=interval * 1000,
            export_timeout_millis=bound * 1000))

    def file_dir() -> Path:
        nonlocal used_dir
        directory.mkdir(parents=True, exist_ok=True)
        used_dir = directory
        return directory

    rerun_on = rerun_target.lower() not in ("", "off", "none")
    trace_names = _env_list("OTEL_TRACES_EXPORTER")
    if trace_names is None:
        trace_names = ["otlp" if otlp_endpoint_configured("traces") else "file"]
        if rerun_on:
            trace_names.append("rerun")
    metric_names = _env_list("OTEL_METRICS_EXPORTER")
    if metric_names is None:
        metric_names = ["otlp" if otlp_endpoint_configured("metrics") else "file"]
        if rerun_on:
            metric_names.append("rerun")

    for name in trace_names:
        if name == "none":
            continue
        if name == "otlp":
            add_spans("otlp", _otlp_span_exporter(bound))
        elif name == "file":
            from opentelemetry.exporter.otlp.json.file import FileSpanExporter

            add_spans("file", FileSpanExporter(file_dir() / "traces.jsonl"))
        elif name == "console":
            add_spans("console", ConsoleSpanExporter())
        elif name == "rerun":
            from otel_proofscope.rerun import process as rerun_child
            from otel_proofscope.rerun.exporter import RerunSpanExporter

            target = rerun_target if rerun_on else None
            # Spans and metrics must take the same route: one recording.
            span_cls = (rerun_child.RerunProcessSpanExporter
                        if rerun_child.enabled(rerun_process) else RerunSpanExporter)
            rerun_spans = span_cls(target, capture_witness=capture)
            rerun_resources.append(rerun_resource(rerun_spans))
            add_spans("rerun", rerun_spans, local=True)
        else:
            add_spans(name, _entry_point("opentelemetry_traces_exporter", name)())
    for name in metric_names:
        if name == "none":
            continue
        if name == "otlp":
            add_metrics("otlp", _otlp_metric_exporter(bound))
        elif name == "file":
            from opentelemetry.exporter.otlp.json.file import FileMetricExporter

            add_metrics("file", FileMetricExporter(file_dir() / "metrics.jsonl"))
        elif name == "console":
            add_metrics("console", ConsoleMetricExporter())
        elif name == "rerun":
            from otel_proofscope.rerun import process as rerun_child
            from otel_proofscope.rerun.exporter import RerunMetricExporter

            metric_cls = (rerun_child.RerunProcessMetricExporter
                          if rerun_child.enabled(rerun_process) else RerunMetricExporter)
            rerun_metrics = metric_cls(rerun_target if rerun_on else None)
            rerun_resources.append(rerun_resource(rerun_metrics))
            add_metrics("rerun", rerun_metrics)
        elif name == "prometheus":
            prometheus_port = prometheus_port or 9464
        else:
            add_metrics(name, _entry_point("opentelemetry_metrics_exporter", name)())
    for sink, exporter in span_exporters:
        # Filtered unless the caller opted in with privacy.local(): an extra exporter
        # (a backup collector) may well leave the process.
        add_spans(sink, exporter, local=isinstance(exporter, Local))
    if prometheus_port is not None:
        readers.append(_prometheus_reader(prometheus_port, closers))

    meter_provider = MeterProvider(resource=resource, metric_readers=readers,
                                   shutdown_on_exit=False)
    instrumentation.set_capture_witness(capture)
    instrumentation.set_max_events_per_span(max_events)
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    from otel_proofscope.pipeline.self_metrics import register_self_metrics

    register_self_metrics(meter_provider)
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=meter_provider,
        tracer=ProofTracer(tracer_provider, meter_provider), span_processors=processors,
        metric_exporters=counted, shutdown_timeout_s=bound, out_dir=used_dir,
        witness_filters=witness_filters, _closers=closers,
        _rerun=[r for i, r in enumerate(rerun_resources)
                if r is not None and r not in rerun_resources[:i]])
    atexit.register(telemetry.shutdown)
    flush_forked_children(telemetry)
    if handle_sigterm:
        sigterm_to_exit()
    return telemetry


def _prometheus_reader(port: int, closers: list[Any]) -> MetricReader:
    try:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
    except ImportError as exc:
        raise ValueError("prometheus_port needs the 'prometheus' extra: "
                         "pip install 'otel-proofscope[prometheus]'") from exc
    addr = os.environ.get("PROOFSCOPE_PROMETHEUS_HOST", "127.0.0.1")
    server, _thread = start_http_server(port, addr=addr)
    closers.append(server.shutdown)
    return PrometheusMetricReader()  # type: ignore[no-any-return]
