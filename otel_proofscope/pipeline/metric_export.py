"""A metric-exporter wrapper that counts every data point it fails to deliver."""

from __future__ import annotations

import logging
import threading

from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

from otel_proofscope.ledger import DROPS, DropLedger
from otel_proofscope.pipeline.cut_exports import cut_short, exporting
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)


def count_points(data: MetricsData) -> int:
    return sum(
        len(m.data.data_points)
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    )


class CountingMetricExporter(MetricExporter):
    """Delegates to ``inner``; failed or abandoned points go to the drop ledger."""

    def __init__(self, inner: MetricExporter, sink: str, ledger: DropLedger = DROPS) -> None:
        super().__init__(
            preferred_temporality=inner._preferred_temporality,
            preferred_aggregation=inner._preferred_aggregation,
        )
        self.inner = inner
        self.sink = sink
        self.points_exported = 0
        self.points_lost = 0
        self._ledger = ledger
        self._lock = threading.Lock()
        self._in_flight = 0
        self._exporting_threads: set[int] = set()  # the reader's and a final collect's
        self._abandoned = False

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        n = count_points(metrics_data)
        with self._lock:
            if self._abandoned:
                self.points_lost += n
                self._ledger.record("metric_points", self.sink, DropReason.SHUTDOWN, n)
                return MetricExportResult.FAILURE
            self._in_flight = n
        with exporting() as thread:
            with self._lock:
                self._exporting_threads.add(thread)
            try:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis)
            except Exception as exc:
                _log.warning("metric exporter %s raised: %r", self.sink, exc)
                result = MetricExportResult.FAILURE
        with self._lock:
            self._in_flight = 0
            self._exporting_threads.discard(thread)
            if self._abandoned:  # already counted by abandon()
                return result
            if result == MetricExportResult.SUCCESS:
                self.points_exported += n
            else:
                self.points_lost += n
                self._ledger.record("metric_points", self.sink, DropReason.EXPORT_FAILED, n)
        return result

    def delivered(self) -> int:
        """Points delivered: accepted, less what the exporter itself lost afterwards."""
        with self._lock:
            late = self._ledger.total(signal="metric_points", sink=self.sink) - self.points_lost
            return self.points_exported - max(0, late)

    def abandon(self) -> None:
        """Shutdown deadline passed: count an export still in flight as lost."""
        with self._lock:
            if not self._abandoned and self._in_flight:
                self.points_lost += self._in_flight
                self._ledger.record("metric_points", self.sink, DropReason.SHUTDOWN,
                                    self._in_flight)
            self._abandoned = True
            # Counted here: however the abandoned export ends later (the channel closed,
            # or its own deadline), its exporter's ERROR would say it a second time.
            self._cut_in_flight()

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        # An export still in flight fails once the channel closes; it is counted here
        # (lost at shutdown, or failed), so its exporter's ERROR line would say it twice.
        with self._lock:
            self._cut_in_flight()
        self.inner.shutdown(timeout_millis=timeout_millis)

    def _cut_in_flight(self) -> None:
        """Mark every export of this exporter now in flight as cut by us; under the lock."""
        for thread in self._exporting_threads:
            cut_short(thread)


class SinkMetricReader(PeriodicExportingMetricReader):
    """The periodic reader of one of our metric sinks, shut down on its own.

    Why: ``MeterProvider.shutdown`` shuts its readers down one after the other, so a
    sink that hangs (a silent collector) kept every reader after it ticking past the
    report, for as long as the process lived, each tick counting its points lost
    again. ``Telemetry.shutdown`` shuts these readers down side by side; the meter
    provider's own call afterwards is then a no-op instead of the SDK's warning.
    """

    def __init__(self, exporter: CountingMetricExporter, *, interval_s: float,
                 timeout_s: float) -> None:
        super().__init__(exporter, export_interval_millis=interval_s * 1000,
                         export_timeout_millis=timeout_s * 1000)
        self.sink = exporter.sink
        self._stop_lock = threading.Lock()
        self._stopping = False

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        with self._stop_lock:
            if self._stopping:
                return
            self._stopping = True
        super().shutdown(timeout_millis=timeout_millis, **kwargs)
