"""otel_proofscope: OpenTelemetry spans and metrics for zero-knowledge provers.

    import otel_proofscope as ps

    telemetry = ps.configure(service_name="my-prover")
    tracer = ps.get_tracer()
    with tracer.proof(system="gkr", backend="cpu", layers=2):
        with tracer.layer(index=0, kind="MatMul", rounds=3, claim_initial=5):
            tracer.sumcheck_round(0, poly=[1, 2, 3], claim=7)
    report = telemetry.shutdown()
"""

from typing import TYPE_CHECKING, Any

from otel_proofscope.version import __version__

if TYPE_CHECKING:
    from otel_proofscope.fields import canonical
    from otel_proofscope.instrumentation import (
        ActivationStats,
        CircuitNode,
        ProofTracer,
        current_span,
        get_tracer,
        sumcheck_round,
    )
    from otel_proofscope.semconv import (
        Attr,
        EventName,
        LayerKind,
        LayerProofKind,
        Metric,
        SpanName,
    )
    from otel_proofscope.setup import Telemetry, configure

#: Public name → the module that defines it. Imported on first use (PEP 562), so that
#: ``proofscope --version`` and the CLI's help do not pay for the OpenTelemetry SDK and
#: numpy (~0.7 s) before they need them.
_LAZY = {
    "canonical": "otel_proofscope.fields",
    **dict.fromkeys(("ActivationStats", "CircuitNode", "ProofTracer", "current_span",
                     "get_tracer", "sumcheck_round"), "otel_proofscope.instrumentation"),
    **dict.fromkeys(("Attr", "EventName", "LayerKind", "LayerProofKind", "Metric",
                     "SpanName"), "otel_proofscope.semconv"),
    **dict.fromkeys(("Telemetry", "configure"), "otel_proofscope.setup"),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'otel_proofscope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


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
