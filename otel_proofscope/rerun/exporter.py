"""OpenTelemetry exporters that draw proofs in Rerun, next to (not instead of) OTLP.

Both are constructible without arguments (``OTEL_TRACES_EXPORTER=rerun`` /
``OTEL_METRICS_EXPORTER=rerun`` entry points) and then read ``PROOFSCOPE_RERUN``
(``spawn``, ``file:PATH.rrd``, ``rerun+http://HOST:PORT/proxy``, ``off``; default
``file:proofscope.rrd``). A span and a metric exporter with the same target share one
sink, so spans and metrics land in the same recording.

``export()`` only enqueues: it never blocks the caller and never raises. It returns
SUCCESS once the batch is queued *or its loss has been counted* in ``DROPS`` (sink
``rerun``), so a wrapping processor must not count it a second time.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.metrics.export import (
    MetricsData,
)
from opentelemetry.sdk.metrics.view import Aggregation
from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.rerun import sink as sinks
from otel_proofscope.rerun.exporter_base import (
    RerunMetricExporterBase,
    RerunSpanExporterBase,
    env_float,
    lose_spans,
)
from otel_proofscope.rerun.sink import RerunSink
from otel_proofscope.rerun.target import Target, parse_target
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)

ENV_QUEUE = "PROOFSCOPE_RERUN_QUEUE"


def _open(target: str | None, queue_size: int | None) -> tuple[Target, RerunSink | None]:
    t = parse_target(target)
    if t.kind == "off":
        return t, None
    size = queue_size or int(env_float(ENV_QUEUE, sinks.DEFAULT_QUEUE))
    return t, sinks.acquire(t, queue_size=size)


class SinkBackend:
    """The in-process backend: the target's shared :class:`RerunSink`."""

    def __init__(self, sink: RerunSink) -> None:
        self.sink = sink

    def send_spans(self, spans: Sequence[ReadableSpan], witness: bool) -> None:
        try:
            self.sink.submit_spans(spans, witness=witness)
        except Exception as exc:  # never let the exporter raise into the SDK
            lose_spans(spans, DropReason.EXPORT_FAILED)
            _log.warning("rerun span export failed: %r", exc)

    def send_metrics(self, data: MetricsData, points: int) -> None:
        try:
            self.sink.submit_metrics(data)
        except Exception as exc:
            _log.warning("rerun metric export failed: %r", exc)

    def flush(self, timeout_s: float) -> bool:
        return self.sink.flush(timeout_s)

    def backlog(self) -> tuple[int, int]:
        return self.sink.backlog()

    def can_take(self, spans: Sequence[ReadableSpan]) -> bool:
        return self.sink.can_take(spans)

    def release(self, timeout_s: float) -> None:
        sinks.release(self.sink, timeout_s)


class RerunSpanExporter(RerunSpanExporterBase):
    """Draws proof spans (and their events) in Rerun.

    Args:
        target: where to send; ``None`` reads ``PROOFSCOPE_RERUN``.
        capture_witness: draw activation statistics and attention heatmaps (witness
            data). ``None`` follows ``PROOFSCOPE_CAPTURE_WITNESS`` / the process's
            capture switch (``configure(capture_witness=...)``).
        queue_size: spans queued before new ones are dropped and counted
            (``PROOFSCOPE_RERUN_QUEUE``, default 8192); only the first exporter of a
            target sets it.
        shutdown_timeout_s: bound on ``shutdown()`` (``PROOFSCOPE_SHUTDOWN_TIMEOUT``, 3 s).
    """

    def __init__(self, target: str | None = None, *, capture_witness: bool | None = None,
                 queue_size: int | None = None, shutdown_timeout_s: float | None = None) -> None:
        parsed, self.sink = _open(target, queue_size)
        super().__init__(parsed, SinkBackend(self.sink) if self.sink is not None else None,
                         capture_witness, shutdown_timeout_s)


class RerunMetricExporter(RerunMetricExporterBase):
    """Draws metric points (GPU, proof, self-telemetry) in Rerun."""

    def __init__(self, target: str | None = None, *,
                 preferred_temporality: dict[type, object] | None = None,
                 preferred_aggregation: dict[type, Aggregation] | None = None,
                 queue_size: int | None = None, shutdown_timeout_s: float | None = None) -> None:
        parsed, self.sink = _open(target, queue_size)
        super().__init__(parsed, SinkBackend(self.sink) if self.sink is not None else None,
                         preferred_temporality, preferred_aggregation, shutdown_timeout_s)
