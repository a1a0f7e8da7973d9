"""Old home of :func:`configure` and :class:`Telemetry`; they live in
:mod:`otel_proofscope.setup` (the composition root) and are re-exported here so that
``from otel_proofscope.pipeline.config import configure`` goes on working."""

from otel_proofscope.setup.options import (
    DEFAULT_MAX_EVENTS_PER_SPAN,
    DEFAULT_MAX_QUEUE,
    DEFAULT_OUT_DIR,
    otlp_endpoint_configured,
)
from otel_proofscope.setup.telemetry import ShutdownReport, Telemetry
from otel_proofscope.setup.wiring import configure

__all__ = [
    "DEFAULT_MAX_EVENTS_PER_SPAN",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_OUT_DIR",
    "ShutdownReport",
    "Telemetry",
    "configure",
    "otlp_endpoint_configured",
]
