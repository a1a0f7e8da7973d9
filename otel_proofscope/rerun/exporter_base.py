"""The Rerun exporters' one lifecycle, whatever draws their batches: export, flush and a
bounded shutdown, and the backend protocol behind them.

Kept apart from :mod:`otel_proofscope.rerun.exporter` (the in-process exporters, which
need the Rerun SDK for their sink) so that the export process's exporters
(:mod:`otel_proofscope.rerun.export_process`, ``configure()``'s one Rerun route) load in
the prover's process without importing the Rerun SDK: the child pays that ~1.2 s of
CPU, overlapping the prover's work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Protocol

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.metrics.view import Aggregation
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope import instrumentation
from otel_proofscope.ledger import DROPS
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.deadline import parse_timeout, remaining
from otel_proofscope.rerun.target import LEDGER_SINK, Target
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

ENV_WITNESS = "PROOFSCOPE_CAPTURE_WITNESS"
ENV_TIMEOUT = "PROOFSCOPE_SHUTDOWN_TIMEOUT"


def lose_spans(spans: Sequence[ReadableSpan], reason: DropReason) -> None:
    # Spans and their events, as every other sink counts them (the exit report's
    # delivered figures subtract both).
    DROPS.record("spans", LEDGER_SINK, reason, len(spans))
    DROPS.record("span_events", LEDGER_SINK, reason, sum(event_count(s) for s in spans))


def show_witness(explicit: bool | None) -> bool:
    """Whether to draw witness events: the argument, else the env switch, else capture."""
    if explicit is not None:
        return explicit
    raw = os.environ.get(ENV_WITNESS, "").strip().lower()
    if raw:
        return raw in ("1", "true", "yes", "on")
    return instrumentation.capture_witness_enabled()


def env_float(name: str, default: float) -> float:
    try:
        return parse_timeout(os.environ.get(name), name=name, default=default)
    except ValueError as exc:
        _log.warning("%s; using %s", exc, default)
        return default


def _points(data: MetricsData) -> int:
    return sum(len(m.data.data_points) for rm in data.resource_metrics
               for sm in rm.scope_metrics for m in sm.metrics)


class RerunBackend(Protocol):
    """Where a Rerun exporter's batches go: a sink thread in this process
    (:class:`SinkBackend`) or a child process (``rerun.process.WorkerBackend``).

    ``send_*`` never raise: a batch is queued, or its loss is counted in ``DROPS``.
    """

    def send_spans(self, spans: Sequence[ReadableSpan], witness: bool) -> None: ...

    def send_metrics(self, data: MetricsData, points: int) -> None: ...

    def flush(self, timeout_s: float) -> bool: ...

    def release(self, timeout_s: float) -> None: ...


class RerunSpanExporterBase(SpanExporter):
    """The span exporters' one lifecycle (export, flush, bounded shutdown); the
    backend decides where batches go."""

    def __init__(self, target: Target, backend: RerunBackend | None,
                 capture_witness: bool | None, shutdown_timeout_s: float | None) -> None:
        self.target = target
        self._backend = backend
        self._witness = capture_witness
        self._timeout = shutdown_timeout_s or env_float(ENV_TIMEOUT, 3.0)
        self._closed = False

    def _show_witness(self) -> bool:
        return show_witness(self._witness)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._backend is None or not spans:
            return SpanExportResult.SUCCESS
        if self._closed:
            lose_spans(spans, DropReason.SHUTDOWN)
            return SpanExportResult.FAILURE
        self._backend.send_spans(spans, self._show_witness())
        # SUCCESS: the batch is queued or its loss is counted (not again by the processor)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._backend is None or self._closed:
            return True
        return self._backend.flush(timeout_millis / 1000)

    def backlog(self) -> tuple[int, int] | None:
        """(spans and points queued, queue capacity) of an in-process sink, so a
        receiver can ask its senders to retry instead of overflowing the queue; None
        where unknown (a child process, or off)."""
        backlog = getattr(self._backend, "backlog", None)
        return backlog() if callable(backlog) else None

    def can_take(self, spans: Sequence[ReadableSpan]) -> bool | None:
        """Whether an in-process sink's queue takes ``spans`` now (count and bytes);
        None where unknown."""
        can_take = getattr(self._backend, "can_take", None)
        return can_take(spans) if callable(can_take) else None

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._backend is not None:
            # Within what the pipeline's shutdown has left (pipeline/deadline.py).
            self._backend.release(remaining(self._timeout))


class RerunMetricExporterBase(MetricExporter):
    """The metric exporters' one lifecycle; the backend decides where points go.

    Temporality and aggregation default to the SDK's (cumulative); the translation
    differences cumulative points itself.
    """

    def __init__(self, target: Target, backend: RerunBackend | None,
                 preferred_temporality: dict[type, object] | None,
                 preferred_aggregation: dict[type, Aggregation] | None,
                 shutdown_timeout_s: float | None) -> None:
        super().__init__(preferred_temporality=preferred_temporality,  # type: ignore[arg-type]
                         preferred_aggregation=preferred_aggregation)
        self.target = target
        self._backend = backend
        self._timeout = shutdown_timeout_s or env_float(ENV_TIMEOUT, 3.0)
        self._closed = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        if self._backend is None:
            return MetricExportResult.SUCCESS
        points = _points(metrics_data)
        if points == 0:
            return MetricExportResult.SUCCESS
        if self._closed:
            DROPS.record("metric_points", LEDGER_SINK, DropReason.SHUTDOWN, points)
            return MetricExportResult.FAILURE
        self._backend.send_metrics(metrics_data, points)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        if self._backend is None or self._closed:
            return True
        return self._backend.flush(timeout_millis / 1000)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        if self._closed:
            return
        self._closed = True
        if self._backend is not None:
            self._backend.release(remaining(min(self._timeout, timeout_millis / 1000)))
