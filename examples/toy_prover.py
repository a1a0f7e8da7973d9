"""A toy prover instrumented with otel_proofscope: the smallest complete example.

Run:  python examples/toy_prover.py [OUT_DIR]     (default ./toy-out, printed at the end)
Writes OUT_DIR/traces.jsonl and OUT_DIR/metrics.jsonl (OTLP/JSON lines), or exports
OTLP when OTEL_EXPORTER_OTLP_ENDPOINT is set.

The toy proves, for each of two public tables T, the sum Σ_x T(x) with a sumcheck over
M31 whose challenges come from a SHA-256 Fiat–Shamir transcript. Its verifier replays
the transcript, checks every round and the final claim against T's multilinear
extension, so ``proof.verified`` is the verifier's answer and ``proof.size`` the length
of the encoded proof, never constants.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import otel_proofscope as ps

P = 2**31 - 1  # the M31 prime


@dataclass
class LayerProof:
    claim: int
    rounds: list[tuple[int, int]]  # g(0), g(1) per round

    def to_bytes(self) -> bytes:
        values = [self.claim, *(v for g in self.rounds for v in g)]
        return b"".join(v.to_bytes(4, "little") for v in values)


class Transcript:
    """Fiat–Shamir over SHA-256: each challenge depends on everything absorbed so far."""

    def __init__(self, label: bytes) -> None:
        self._state = hashlib.sha256(label).digest()

    def absorb(self, *values: int) -> None:
        data = b"".join(v.to_bytes(4, "little") for v in values)
        self._state = hashlib.sha256(self._state + data).digest()

    def challenge(self) -> int:
        self._state = hashlib.sha256(self._state + b"challenge").digest()
        return int.from_bytes(self._state[:8], "little") % P


def prove_sum(values: list[int], tracer: ps.ProofTracer,
              label: bytes) -> tuple[LayerProof, int]:
    """Sumcheck for Σ_x T(x): each round sends g(0), g(1) and folds the table at r.

    Returns the proof and the final claim, T̃ at the challenges.
    """
    transcript = Transcript(label)
    proof = LayerProof(sum(values) % P, [])
    transcript.absorb(proof.claim)
    claim = proof.claim
    for r in range((len(values) - 1).bit_length()):
        half = len(values) // 2
        low, high = values[:half], values[half:]
        g0, g1 = sum(low) % P, sum(high) % P
        transcript.absorb(g0, g1)
        challenge = transcript.challenge()
        values = [(a + challenge * (b - a)) % P for a, b in zip(low, high, strict=True)]
        claim = (g0 + challenge * (g1 - g0)) % P
        proof.rounds.append((g0, g1))
        # Evaluations g(0), g(1) and the challenge r: a reader checks g(0) + g(1) ==
        # previous claim and g(r) == this claim from the telemetry alone.
        tracer.sumcheck_round(r, poly=(g0, g1), claim=claim, challenge=challenge)
    return proof, claim


def mle(values: list[int], point: list[int]) -> int:
    """T̃(point): fold the table variable by variable, as the prover did."""
    for r in point:
        half = len(values) // 2
        values = [(a + r * (b - a)) % P for a, b in zip(values[:half], values[half:],
                                                          strict=True)]
    return values[0]


def verify_sum(values: list[int], proof: LayerProof, label: bytes) -> str | None:
    """None if ``proof`` shows Σ T = proof.claim for the public table T, else why not."""
    if len(proof.rounds) != (len(values) - 1).bit_length():
        return "wrong number of rounds"
    transcript = Transcript(label)
    transcript.absorb(proof.claim)
    claim, point = proof.claim, []
    for n, (g0, g1) in enumerate(proof.rounds):
        if (g0 + g1) % P != claim:
            return f"round {n}: g(0) + g(1) != claim"
        transcript.absorb(g0, g1)
        r = transcript.challenge()
        claim = (g0 + r * (g1 - g0)) % P
        point.append(r)
    if mle(values, point) != claim:
        return "final claim is not the table's evaluation"
    return None


def main(out_dir: str = "toy-out") -> int:
    telemetry = ps.configure(service_name="toy-prover", out_dir=out_dir)
    tracer = telemetry.tracer
    layers = [("MatMul", [3, 1, 4, 1, 5, 9, 2, 6]), ("Activation", [2, 7, 1, 8])]
    proofs: list[LayerProof] = []
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
                layer_proof, final = prove_sum(table, tracer, f"toy/{index}".encode())
                proofs.append(layer_proof)
                layer.set_final_claim(final)
        with tracer.verify() as verify:
            problems = [verify_sum(table, p, f"toy/{i}".encode())
                        for i, ((_, table), p) in enumerate(zip(layers, proofs, strict=True))]
            verified = all(problem is None for problem in problems)
            verify.set_verified(verified)
        size = sum(len(p.to_bytes()) for p in proofs)
        proof.set_result(layer_proofs=len(layers), weight_openings=0, size=size)
    report = telemetry.shutdown()
    print("\n".join(report.lines()))
    print(f"verified: {verified}" + "".join(f"; {p}" for p in problems if p))
    print(f"wrote {Path(out_dir).resolve()}/traces.jsonl and metrics.jsonl"
          if not _otlp_endpoint() else "exported over OTLP")
    return 0 if verified else 1


def _otlp_endpoint() -> bool:
    import os

    return any(os.environ.get(k) for k in ("OTEL_EXPORTER_OTLP_ENDPOINT",
                                           "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
