"""GKR prover: walks the layers output → input, one sumcheck (or linear step) per layer.

The statement is bound into the transcript, a random point r_out is drawn and the claim
starts as Ỹ(r_out) for the public output Y. Each layer turns a claim on its output MLE
into a claim on its input MLE; the last claim is on the public input. Instrumentation
goes only through :class:`~otel_proofscope.instrumentation.ProofTracer`, every round
reported live with its real round polynomial and claim.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from otel_proofscope.demo import sumcheck
from otel_proofscope.demo.circuit import LayerSpec, Network, signed
from otel_proofscope.demo.commitment import commit
from otel_proofscope.demo.field import QM31, MatmulFn, U64Array, lift, m31_matmul, q_matvec
from otel_proofscope.demo.mle import eq_table, evaluate, log2_exact
from otel_proofscope.demo.proof import LayerProof, Proof
from otel_proofscope.demo.statement import begin_layer, bind_statement
from otel_proofscope.demo.transcript import Transcript
from otel_proofscope.demo.verifier import VerifyResult, verify
from otel_proofscope.instrumentation import ActivationStats, ProofTracer, get_tracer, span_seconds
from otel_proofscope.phase_cost import PhaseCostResult
from otel_proofscope.semconv import LayerKind

#: Progress callback: (layers done, layers total, what just happened).
Progress = Callable[[int, int, str], None]


@dataclass
class Claim:
    point: list[QM31]
    value: QM31


@dataclass
class LayerStep:
    proof: LayerProof
    claim: Claim  # on the layer's input
    weight_point: list[QM31] | None = None


@dataclass
class ProveResult:
    proof: Proof
    size: int
    verify: VerifyResult
    prove_s: float
    verify_s: float
    layer_seconds: dict[str, float] = field(default_factory=dict)  # by layer kind
    rounds: int = 0
    soundness_bits: float = 0.0
    #: GPU cost of the proof (sums over its phases); None when the span was not recorded.
    gpu_cost: PhaseCostResult | None = None

    @property
    def verified(self) -> bool:
        return self.verify.ok


def prove_layer(layer: LayerSpec, x: U64Array, claim: Claim, transcript: Transcript,
                matmul: MatmulFn = m31_matmul,
                on_round: sumcheck.RoundHook | None = None) -> LayerStep:
    """Reduce ``claim`` (on the layer's output MLE) to a claim on its input ``x``."""
    begin_layer(transcript, layer.index, layer.kind.value)
    n_vars = log2_exact(layer.rows)
    r_row, r_col = claim.point[:n_vars], claim.point[n_vars:]
    kind = layer.kind
    w = layer.weight
    if kind is LayerKind.ADD:
        assert w is not None
        bias = evaluate(w, r_col)
        x_eval = claim.value - bias
        transcript.absorb_qm31(b"layer.evals", [x_eval, bias])
        return LayerStep(LayerProof(layer.index, kind, [], x_eval, bias),
                         Claim(list(claim.point), x_eval), list(r_col))
    if kind is LayerKind.MATMUL:
        # Ỹ(r_row, r_col) = Σ_j X̃(r_row, j)·W̃(j, r_col)
        assert w is not None
        tables = [matmul(eq_table(r_row), x), q_matvec(w, eq_table(r_col), matmul)]
    elif kind is LayerKind.ATTENTION:
        # Ỹ(r_row, r_col) = Σ_i X̃(i, r_col)·Ã(r_row, i)
        assert w is not None
        tables = [q_matvec(x, eq_table(r_col), matmul), matmul(eq_table(r_row), w)]
    elif kind is LayerKind.MUL:
        # Ỹ(r) = Σ_z eq(r, z)·X(z)·S(z), S the scale broadcast over rows
        assert w is not None
        tables = [eq_table(claim.point), lift(x.reshape(-1)), lift(np.tile(w, layer.rows))]
    elif kind is LayerKind.ACTIVATION:
        xq = lift(x.reshape(-1))
        tables = [eq_table(claim.point), xq, xq]
    else:
        raise ValueError(f"layer {layer.index}: unsupported kind {kind}")
    sc = sumcheck.prove(tables, claim.value, transcript, on_round)
    s = sc.challenges
    if kind is LayerKind.MATMUL:
        x_eval, w_eval = sc.finals
        new_point, w_point = [*r_row, *s], [*s, *r_col]
    elif kind is LayerKind.ATTENTION:
        x_eval, w_eval = sc.finals
        new_point, w_point = [*s, *r_col], [*r_row, *s]
    elif kind is LayerKind.MUL:
        _, x_eval, w_eval = sc.finals
        new_point, w_point = list(s), list(s[n_vars:])
    else:
        x_eval = sc.finals[1]
        new_point, w_point = list(s), []
    weight_eval = w_eval if w is not None else None
    evals = [x_eval] if weight_eval is None else [x_eval, weight_eval]
    transcript.absorb_qm31(b"layer.evals", evals)
    return LayerStep(LayerProof(layer.index, kind, sc.round_polys, x_eval, weight_eval),
                     Claim(new_point, x_eval), w_point if w is not None else None)


def activation_stats(values: U64Array) -> ActivationStats:
    v = signed(values)
    return ActivationStats(mean=float(v.mean()), std_dev=float(v.std()), min=float(v.min()),
                           max=float(v.max()), sparsity=float(np.mean(v == 0)),
                           sample=[float(a) for a in v.reshape(-1)[:16]])


def prove(network: Network, *, tracer: ProofTracer | None = None, backend: str = "cpu",
          matmul: MatmulFn | None = None, hw_id: str | None = None,
          progress: Progress | None = None) -> ProveResult:
    """Prove and verify ``network`` on its input, instrumented through ``tracer``."""
    tracer = tracer if tracer is not None else get_tracer()
    mm = matmul or m31_matmul
    layers = network.layers
    total = len(layers)
    layer_seconds: dict[str, float] = {}
    t_start = time.perf_counter()
    with tracer.proof(system="gkr", backend=backend, model_name=network.name, layers=total,
                      input_shape=network.input_shape,
                      output_shape=network.output_shape) as proof_span:
        with tracer.circuit_compile(nodes=network.circuit_nodes()):
            commitments = {layer.index: commit(layer.weight) for layer in layers
                           if layer.weight is not None}
        with tracer.witness():
            acts = network.forward(mm)
        proof = prove_witness(network, acts, commitments, tracer=tracer,
                              matmul=mm, hw_id=hw_id, progress=progress,
                              layer_seconds=layer_seconds)
        size = len(proof.to_bytes())
        prove_s = time.perf_counter() - t_start
        t1 = time.perf_counter()
        with tracer.verify() as verify_span:
            result = verify(network, proof)
            verify_span.set_verified(result.ok)
        verify_s = time.perf_counter() - t1
        proof_span.set_result(layer_proofs=len(proof.layers),
                              weight_openings=proof.weight_openings, size=size,
                              verified=result.ok)
    if progress is not None:
        progress(total, total, "verified" if result.ok else f"REJECTED: {result.reason}")
    return ProveResult(proof, size, result, prove_s, verify_s, layer_seconds,
                       network.total_rounds(), network.soundness_bits(), proof_span.gpu_cost)


def prove_witness(network: Network, acts: list[U64Array], commitments: dict[int, bytes], *,
                  tracer: ProofTracer | None = None, matmul: MatmulFn = m31_matmul,
                  hw_id: str | None = None, progress: Progress | None = None,
                  layer_seconds: dict[str, float] | None = None) -> Proof:
    """The GKR walk over a given witness ``acts = [input, out_0, …, out_{L-1}]``.

    An honest caller passes ``network.forward()``; tests pass a corrupted witness to
    play a cheating prover.
    """
    tracer = tracer if tracer is not None else get_tracer()
    output = acts[-1]
    transcript = Transcript()
    bind_statement(transcript, network, commitments, output)
    point = transcript.challenges(log2_exact(network.rows) + log2_exact(network.width))
    claim = Claim(point, evaluate(output, point))
    layer_proofs: list[LayerProof] = []
    total = len(network.layers)
    for done, layer in enumerate(reversed(network.layers)):
        claim, seconds = _prove_instrumented(tracer, layer, acts, claim, transcript, matmul,
                                             hw_id, commitments, layer_proofs)
        kind = layer.kind.value
        if layer_seconds is not None:
            layer_seconds[kind] = layer_seconds.get(kind, 0.0) + seconds
        if progress is not None:
            progress(done + 1, total, f"layer {layer.index} {kind}")
    return Proof(output, dict(commitments), layer_proofs)


def _prove_instrumented(tracer: ProofTracer, layer: LayerSpec, acts: list[U64Array],
                        claim: Claim, transcript: Transcript, mm: MatmulFn,
                        hw_id: str | None, commitments: dict[int, bytes],
                        out: list[LayerProof]) -> tuple[Claim, float]:
    """Prove one layer under its span; returns the claim on its input and the layer's
    duration: the span's own (the same number as the span and ``proof.layer.duration``)."""
    i = layer.index
    t0 = time.perf_counter_ns()
    degree = layer.degree
    layer_hw = hw_id if layer.kind in (LayerKind.MATMUL, LayerKind.ATTENTION) else None
    with tracer.layer(index=i, kind=layer.kind, proof_kind=layer.proof_kind,
                      trace_cost=layer.trace_cost, input_shape=layer.input_shape,
                      output_shape=layer.output_shape, rounds=layer.rounds,
                      claim_initial=claim.value, hw_id=layer_hw) as layer_span:
        output = acts[i + 1]
        tracer.layer_activation(lambda: activation_stats(output))
        if layer.kind is LayerKind.ATTENTION and layer.rows <= 64:
            tracer.attention_heatmap(0, 1, layer.attention_scores)

        def on_round(rnd: int, evals: list[QM31], r: QM31, after: QM31) -> None:
            # Evaluations at t = 0..d, the challenge r and g(r): enough for a reader to
            # redo both checks, g(0) + g(1) = claim and g(r) = next claim. Limb tuples,
            # built only if the layer records (their canonical form is the same as
            # QM31's, and cheaper to produce).
            tracer.sumcheck_round(rnd, lambda: [e.limbs for e in evals],
                                  lambda: after.limbs, degree, challenge=lambda: r.limbs)

        step = prove_layer(layer, acts[i], claim, transcript, mm, on_round)
        out.append(step.proof)
        if layer.weight is not None and step.weight_point is not None:
            with tracer.weight_opening(node_id=i,
                                       eval_point_length=len(step.weight_point)) as opening:
                # The opening's work: evaluate the committed weight MLE at the point
                # (cross-checks the value the sumcheck bound the weight to).
                value = evaluate(layer.weight, step.weight_point)
                if value != step.proof.weight_eval:
                    raise AssertionError(f"layer {i}: weight opening disagrees with sumcheck")
                opening.set_commitment(commitments[i].hex())
        layer_span.set_final_claim(step.claim.value)
    return step.claim, span_seconds(layer_span.span, t0)
