"""One small builder per sink: the exporter or reader behind each name that
``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` (or the defaults) can hold.

This is where the pipeline meets the Rerun layer: a Rerun sink of configure() is always
drawn by the export process (:mod:`otel_proofscope.rerun.export_process`), spans and
metrics into one recording; OTLP-only runs keep the in-thread fast exporter.
"""

from __future__ import annotations

import math
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, MetricExporter, MetricReader
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter

from otel_proofscope.setup.options import Options

DEFAULT_OTLP_TIMEOUT_S = 10.0


def _otlp_protocol(kind: str) -> str:
    return (os.environ.get(f"OTEL_EXPORTER_OTLP_{kind.upper()}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()


def otlp_timeout_s(bound_s: float) -> float:
    """The OTLP exporters' own timeout (incl. retries), capped by the shutdown bound so a
    dead collector cannot hold the last export past it. Seconds, as the official Python
    exporters read ``OTEL_EXPORTER_OTLP_TIMEOUT`` (the spec says milliseconds; either
    way the shutdown bound caps it)."""
    name = "OTEL_EXPORTER_OTLP_TIMEOUT"
    configured = os.environ.get(name)
    if configured:
        try:
            env_s = float(configured)
        except ValueError:
            raise ValueError(f"{name} must be a number of seconds, got {configured!r}") from None
        if not math.isfinite(env_s) or env_s < 0:
            raise ValueError(f"{name} must be a finite, non-negative number of seconds, "
                             f"got {configured!r}")
    else:
        env_s = DEFAULT_OTLP_TIMEOUT_S
    return max(0.1, min(env_s, bound_s))


def otlp_span_exporter(bound_s: float) -> SpanExporter:
    timeout = otlp_timeout_s(bound_s)
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


def otlp_metric_exporter(bound_s: float) -> MetricExporter:
    timeout = otlp_timeout_s(bound_s)
    if _otlp_protocol("metrics").startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(timeout=timeout)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GrpcMetricExporter,
    )

    return GrpcMetricExporter(timeout=timeout)  # type: ignore[no-any-return]


def file_span_exporter(directory: Path) -> SpanExporter:
    # The upstream FileSpanExporter's file, line for line, with a ~10x cheaper encoder.
    from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter

    return JsonLinesSpanExporter(directory / "traces.jsonl")


def file_metric_exporter(directory: Path) -> MetricExporter:
    from opentelemetry.exporter.otlp.json.file import FileMetricExporter

    return FileMetricExporter(directory / "metrics.jsonl")  # type: ignore[no-any-return]


def console_span_exporter() -> SpanExporter:
    return ConsoleSpanExporter()


def console_metric_exporter() -> MetricExporter:
    return ConsoleMetricExporter()


def rerun_target(options: Options) -> str:
    """The target a Rerun sink of configure() draws to: ``rerun=`` / ``PROOFSCOPE_RERUN``,
    else (``OTEL_TRACES_EXPORTER=rerun`` with no target) the Rerun exporters' default."""
    if options.rerun_on:
        return options.rerun_target
    from otel_proofscope.rerun.target import parse_target

    return parse_target(None).name


def rerun_span_exporter(options: Options) -> SpanExporter:
    """Only for a Rerun span sink whose target is off (nothing drawn, no thread): every
    other goes to the export process (:func:`export_process_config`)."""
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    return RerunSpanExporter("off", capture_witness=options.capture_witness)


def rerun_metric_exporter(options: Options, config: Any = None) -> MetricExporter:
    """Metrics to the Rerun view: into the export process that draws the spans
    (``config``, one recording), else into one of their own (``OTEL_METRICS_EXPORTER``
    names rerun, ``OTEL_TRACES_EXPORTER`` does not)."""
    from otel_proofscope.rerun.export_process import ExportConfig, ExportProcessMetricExporter
    from otel_proofscope.rerun.target import LEDGER_SINK, parse_target

    if config is None or LEDGER_SINK not in config.sinks:
        target = rerun_target(options)
        if parse_target(target).kind == "off":
            from otel_proofscope.rerun.exporter import RerunMetricExporter

            return RerunMetricExporter("off")
        config = ExportConfig(rerun_target=target, export_witness=options.export_witness,
                              otlp_queue=options.max_queue_size)
    return ExportProcessMetricExporter(config, shutdown_timeout_s=options.shutdown_timeout_s)


def export_process_config(options: Options) -> Any:
    """The export process's settings (``rerun.export_process.ExportConfig``) when
    configure() starts one, else None.

    The one route by which configure() draws Rerun: when ``OTEL_TRACES_EXPORTER`` (or
    the default) has a Rerun sink with a target, its spans go to the child, and the OTLP
    spans with them (unless ``export_process=False`` / ``PROOFSCOPE_EXPORT_PROCESS=0``).
    Without Rerun, OTLP spans go there only when ``export_process=True`` / ``=1``
    asks; otherwise they stay with the in-thread fast exporter.
    """
    try:  # the child lives in the rerun package, which needs rerun-sdk installed
        from otel_proofscope.rerun import export_process
        from otel_proofscope.rerun.target import parse_target
    except ImportError:
        if options.export_process:
            raise
        if os.environ.get("PROOFSCOPE_EXPORT_PROCESS", "").strip():
            import logging

            logging.getLogger(__name__).warning(
                "export process: needs rerun-sdk (pip install 'otel-proofscope[rerun]'); "
                "spans are exported from this process")
        return None
    explicit = export_process.switch(options.export_process)
    target = rerun_target(options) if "rerun" in options.trace_exporters else "off"
    rerun = parse_target(target).kind != "off"
    otlp = "otlp" in options.trace_exporters and (
        explicit is True or (explicit is None and rerun))
    protocol = _otlp_protocol("traces")
    encoder = os.environ.get("PROOFSCOPE_OTLP_ENCODER", "fast").strip().lower()
    if otlp and (protocol not in export_process.PROTOCOLS or encoder != "fast"):
        # The child speaks what FastOTLPSpanExporter speaks; anything else stays here.
        otlp = False
        if explicit:
            import logging

            logging.getLogger(__name__).warning(
                "export process: OTLP protocol %r / encoder %r is not served out of "
                "process; OTLP spans are exported from this process", protocol, encoder)
    if not (otlp or rerun):
        return None
    return export_process.ExportConfig(
        rerun_target=target if rerun else "off",
        otlp_protocol=protocol if otlp else None,
        otlp_timeout_s=otlp_timeout_s(options.shutdown_timeout_s),
        export_witness=options.export_witness, otlp_queue=options.max_queue_size)


def export_process_span_exporter(config: Any, options: Options) -> SpanExporter:
    from otel_proofscope.rerun.export_process import ExportProcessSpanExporter

    return ExportProcessSpanExporter(config, capture_witness=options.capture_witness,
                                     shutdown_timeout_s=options.shutdown_timeout_s)


def entry_point(group: str, name: str) -> Any:
    """An installed exporter entry point (``opentelemetry_traces_exporter`` …) by name."""
    for ep in entry_points(group=group, name=name):
        return ep.load()
    raise ValueError(f"unknown exporter {name!r}: no '{group}' entry point of that name "
                     "is installed")


def prometheus_reader(port: int, closers: list[Any]) -> MetricReader:
    """A Prometheus reader with its scrape endpoint on
    ``PROOFSCOPE_PROMETHEUS_HOST`` (default 127.0.0.1):``port``; the server's shutdown
    goes into ``closers``."""
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
