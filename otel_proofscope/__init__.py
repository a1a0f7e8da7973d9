"""otel_proofscope: OpenTelemetry spans and metrics for zero-knowledge provers.

    import otel_proofscope as ps

    telemetry = ps.configure(service_name="my-prover")
    tracer = ps.get_tracer()
    with tracer.proof(system="gkr", backend="cpu", layers=2):
        with tracer.layer(index=0, kind="MatMul", rounds=3, claim_initial=5):
            tracer.sumcheck_round(0, poly=[1, 2, 3], claim=7)
    report = telemetry.shutdown()
"""

from otel_proofscope.fields import canonical
from otel_proofscope.instrumentation import (
    ActivationStats,
    CircuitNode,
    ProofTracer,
    current_span,
    get_tracer,
    sumcheck_round,
)
from otel_proofscope.semconv import Attr, EventName, LayerKind, LayerProofKind, Metric, SpanName
from otel_proofscope.setup import Telemetry, configure
from otel_proofscope.version import __version__

__all__ = [
    "ActivationStats",
    "Attr",
    "CircuitNode",
    "EventName",
    "LayerKind",
    "LayerProofKind",
    "Metric",
    "ProofTracer",
    "SpanName",
    "Telemetry",
    "__version__",
    "canonical",
    "configure",
    "current_span",
    "get_tracer",
    "sumcheck_round",
]
