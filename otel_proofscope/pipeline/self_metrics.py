"""Self-telemetry: the drop and rejection ledgers as observable counters."""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from otel_proofscope.ledger import DROPS, REJECTIONS
from otel_proofscope.semconv import METER_NAME, Attr, Metric
from otel_proofscope.version import __version__


def _dropped(_options: CallbackOptions) -> Iterable[Observation]:
    for key, n in DROPS.snapshot().items():
        yield Observation(n, key.attributes())


def _rejected(_options: CallbackOptions) -> Iterable[Observation]:
    for (field, reason), n in REJECTIONS.snapshot().items():
        yield Observation(n, {Attr.PROOFSCOPE_FIELD: field, Attr.REASON: reason})


def register_self_metrics(meter_provider: metrics.MeterProvider) -> None:
    meter = meter_provider.get_meter(METER_NAME, __version__)
    for d, cb in ((Metric.PROOFSCOPE_DROPPED, _dropped),
                  (Metric.PROOFSCOPE_REJECTED, _rejected)):
        meter.create_observable_counter(d.name, [cb], unit=d.unit, description=d.description)
