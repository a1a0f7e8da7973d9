"""An OTLP receiver (gRPC and HTTP) that feeds received telemetry into SDK exporters.

``proofscope serve`` runs it with the Rerun exporters, so a prover in any language that
exports OTLP gets the Rerun view; a collector can fan out to it. The proto → SDK
translation (:mod:`otel_proofscope.otlp.decode`) is pure and usable on its own.
"""

from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome
from otel_proofscope.integrations.otlp_receiver.server import OtlpReceiver
from otel_proofscope.otlp.decode import (
    MetricBatch,
    SpanBatch,
    metrics_from_request,
    spans_from_request,
)

__all__ = [
    "Ingest",
    "MetricBatch",
    "OtlpReceiver",
    "Outcome",
    "SpanBatch",
    "metrics_from_request",
    "spans_from_request",
]
