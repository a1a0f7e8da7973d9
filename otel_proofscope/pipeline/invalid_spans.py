"""Counting the spans an OTLP encoder refused (a time OTLP cannot carry, see
:mod:`otel_proofscope.otlp.times`): one place for the file and the gRPC/HTTP exporters,
so both count and say it the same way."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan

from otel_proofscope.ledger import DropLedger
from otel_proofscope.otlp.sdk_fields import event_count
from otel_proofscope.otlp.times import InvalidSpan, check_times
from otel_proofscope.semconv import DropReason

_log = logging.getLogger(__name__)


def count_invalid(refused: Sequence[ReadableSpan], sink: str, ledger: DropLedger,
                  warned: bool) -> None:
    """Count spans an encoder refused for a time OTLP cannot carry (reason ``invalid``);
    the first time per exporter, say which and why."""
    ledger.record("spans", sink, DropReason.INVALID, len(refused))
    ledger.record("span_events", sink, DropReason.INVALID,
                  sum(event_count(s) for s in refused))
    if not warned:
        try:
            span = refused[0]
            check_times(span.name, span.start_time, span.end_time,
                        [e.timestamp for e in span.events])
            why = "a time OTLP cannot carry"
        except InvalidSpan as error:
            why = str(error)
        _log.warning("%s: %d span(s) refused, the rest of the batch sent (%s); counted as "
                     "dropped (invalid), logged once", sink, len(refused), why)
