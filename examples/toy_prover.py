"""A toy prover instrumented with otel_proofscope: the smallest complete example.

Run:  python examples/toy_prover.py [OUT_DIR]
Writes OUT_DIR/traces.jsonl and OUT_DIR/metrics.jsonl (OTLP/JSON lines), or exports
OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.
"""

from __future__ import annotations

import sys

import otel_proofscope as ps

P = 2**31 - 1  # the M31 prime


def toy_sumcheck(values: list[int], tracer: ps.ProofTracer) -> int:
    """Sumcheck over a multilinear table: each round halves the table (fixed challenges)."""
    claim = sum(values) % P
    rounds = (len(values) - 1).bit_length()
    challenge = 7
    for r in range(rounds):
        half = len(values) // 2
        g0 = sum(values[:half]) % P
        g1 = sum(values[half:]) % P
        low, high = values[:half], values[half:]
        values = [(a + challenge * (b - a)) % P for a, b in zip(low, high, strict=True)]
        claim = (g0 + challenge * (g1 - g0)) % P
        # Evaluations g(0), g(1): a reader checks g(0) + g(1) == previous claim.
        tracer.sumcheck_round(r, poly=(g0, g1), claim=claim)
    return claim


def main(out_dir: str = "toy-out") -> int:
    telemetry = ps.configure(service_name="toy-prover", out_dir=out_dir)
    tracer = telemetry.tracer
    layers = [("MatMul", [3, 1, 4, 1, 5, 9, 2, 6]), ("Activation", [2, 7, 1, 8])]
    with tracer.proof(system="toy", backend="cpu", model_name="two-layer", layers=len(layers),
                      input_shape=(1, 8), output_shape=(1, 4)) as proof:
        with tracer.circuit_compile() as compile_phase:
            compile_phase.set_circuit([
                ps.CircuitNode(index=0, kind="MatMul", trace_cost=8),
                ps.CircuitNode(index=1, kind="Activation", trace_cost=4, inputs=[0]),
            ])
        for index, (kind, table) in enumerate(layers):
            rounds = (len(table) - 1).bit_length()
            with tracer.layer(index=index, kind=kind, trace_cost=len(table), rounds=rounds,
                              input_shape=(len(table),), output_shape=(1,),
                              claim_initial=sum(table) % P) as layer:
                layer.set_final_claim(toy_sumcheck(table, tracer))
        with tracer.verify() as verify:
            verify.set_verified(True)
        proof.set_result(layer_proofs=len(layers), weight_openings=0, size=256)
    report = telemetry.shutdown()
    print("\n".join(report.lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
