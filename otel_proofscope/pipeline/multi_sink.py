"""One bounded batch processor for an exporter that serves several sinks.

The export process (``rerun/export_process.py``) packs each span once for OTLP and the
Rerun view together, so one queue feeds both. A span this processor loses (queue full,
export failed, shutdown deadline) is then lost for each sink, and counted under each
sink's name; the exit report computes each sink's delivered spans from the same accepted
count, less what that sink lost (:meth:`ExportStats.delivered` per sink).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter

from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor
from otel_proofscope.semconv import DropReason


class MultiSinkBatchSpanProcessor(BoundedBatchSpanProcessor):
    def __init__(self, exporter: SpanExporter, *, sinks: Sequence[str], **kwargs: Any) -> None:
        if not sinks:
            raise ValueError("a multi-sink processor needs at least one sink")
        super().__init__(exporter, sink="+".join(sinks), **kwargs)
        #: The sinks this processor's exporter serves; the exit report has one line each.
        self.sinks = tuple(sinks)

    def _lose(self, spans: Sequence[ReadableSpan], reason: DropReason) -> None:
        events = sum(event_count(s) for s in spans)
        with self.stats.lock:
            self.stats.lost_spans += len(spans)
            self.stats.lost_events += events
        for sink in self.sinks:
            self._ledger.record("spans", sink, reason, len(spans))
            self._ledger.record("span_events", sink, reason, events)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Drain the queue into the exporter, then flush the exporter (the export process
        reports back once its sinks delivered), within ``timeout_millis`` in all: as
        with the in-process OTLP exporter, a True means delivered, not only handed on."""
        deadline = time.monotonic() + timeout_millis / 1000
        ok = super().force_flush(timeout_millis)
        left = int((deadline - time.monotonic()) * 1000)
        if left <= 0:
            return False
        try:
            return bool(self.exporter.force_flush(left)) and ok
        except Exception:  # an exporter's flush must not raise into the caller
            return False
