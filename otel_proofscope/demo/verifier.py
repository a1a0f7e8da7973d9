"""GKR verifier: replays the transcript and checks every round and every final claim.

It knows the public circuit (kinds, shapes, the committed weights) and the public input;
the output comes from the proof. Any malformed or inconsistent proof is rejected with a
reason, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

from otel_proofscope.demo import sumcheck
from otel_proofscope.demo.circuit import LayerSpec, Network
from otel_proofscope.demo.commitment import COMMITMENT_BYTES, commit, open_check
from otel_proofscope.demo.field import QM31
from otel_proofscope.demo.mle import eq_eval, evaluate, log2_exact
from otel_proofscope.demo.proof import LayerProof, Proof
from otel_proofscope.demo.statement import begin_layer, bind_statement
from otel_proofscope.demo.transcript import Transcript
from otel_proofscope.semconv import LayerKind


@dataclass(frozen=True)
class VerifyResult:
    ok: bool
    reason: str = ""


class Rejected(ValueError):
    pass


def verify(network: Network, proof: Proof) -> VerifyResult:
    try:
        _verify(network, proof)
    except (Rejected, sumcheck.SumcheckError) as exc:
        return VerifyResult(False, str(exc))
    except (ValueError, IndexError, TypeError) as exc:
        return VerifyResult(False, f"malformed proof: {exc}")
    return VerifyResult(True)


def _verify(network: Network, proof: Proof) -> None:
    if proof.output.shape != network.output_shape:
        raise Rejected(f"output shape {proof.output.shape} != {network.output_shape}")
    # Each commitment is checked against the model where its layer is opened.
    weighted = {layer.index for layer in network.layers if layer.weight is not None}
    if set(proof.commitments) != weighted:
        raise Rejected("proof commits to a different set of weight tensors")
    for idx, c in sorted(proof.commitments.items()):
        if len(c) != COMMITMENT_BYTES:
            raise Rejected(f"commitment for layer {idx} is {len(c)} bytes, "
                           f"not {COMMITMENT_BYTES}")
    if len(proof.layers) != len(network.layers):
        raise Rejected(f"expected {len(network.layers)} layer proofs, got {len(proof.layers)}")
    transcript = Transcript()
    bind_statement(transcript, network, proof.commitments, proof.output)
    point = transcript.challenges(log2_exact(network.rows) + log2_exact(network.width))
    value = evaluate(proof.output, point)
    for layer, lp in zip(reversed(network.layers), proof.layers, strict=True):
        if lp.index != layer.index or lp.kind is not layer.kind:
            raise Rejected(f"layer proof for {lp.index}/{lp.kind} where {layer.index}/"
                           f"{layer.kind.value} was expected")
        try:
            point, value = verify_layer(layer, lp, point, value, transcript,
                                        proof.commitments.get(layer.index))
        except sumcheck.SumcheckError as exc:
            raise Rejected(f"layer {layer.index} ({layer.kind.value}): {exc}") from None
    if evaluate(network.input, point) != value:
        raise Rejected("final claim does not match the public input")


def verify_layer(layer: LayerSpec, lp: LayerProof, point: list[QM31], claim: QM31,
                 transcript: Transcript, commitment: bytes | None = None
                 ) -> tuple[list[QM31], QM31]:
    """Check one layer; return the point and value of the claim on its input.

    ``commitment`` is the weight commitment the proof bound (default: the model's own).
    """
    begin_layer(transcript, layer.index, layer.kind.value)
    n_vars = log2_exact(layer.rows)
    r_row, r_col = point[:n_vars], point[n_vars:]
    kind, w = layer.kind, layer.weight
    has_weight = w is not None
    if (lp.weight_eval is not None) != has_weight:
        raise Rejected(f"layer {layer.index}: weight evaluation present/absent wrongly")
    if kind is LayerKind.ADD:
        assert w is not None and lp.weight_eval is not None
        if lp.round_polys:
            raise Rejected(f"layer {layer.index}: a linear layer has no rounds")
        if lp.input_eval + lp.weight_eval != claim:
            raise Rejected(f"layer {layer.index} (Add): input + bias != claim")
        _open(layer, commitment, r_col, lp.weight_eval)
        transcript.absorb_qm31(b"layer.evals", [lp.input_eval, lp.weight_eval])
        return list(point), lp.input_eval
    s, final = sumcheck.verify(claim, lp.round_polys, layer.rounds, layer.degree, transcript)
    x = lp.input_eval
    if kind is LayerKind.MATMUL:
        assert lp.weight_eval is not None
        expected = x * lp.weight_eval
        new_point, w_point = [*r_row, *s], [*s, *r_col]
    elif kind is LayerKind.ATTENTION:
        assert lp.weight_eval is not None
        expected = x * lp.weight_eval
        new_point, w_point = [*s, *r_col], [*r_row, *s]
    elif kind is LayerKind.MUL:
        assert lp.weight_eval is not None
        expected = eq_eval(point, s) * x * lp.weight_eval
        new_point, w_point = list(s), list(s[n_vars:])
    elif kind is LayerKind.ACTIVATION:
        expected = eq_eval(point, s) * x * x
        new_point, w_point = list(s), []
    else:
        raise Rejected(f"layer {layer.index}: unsupported kind {kind}")
    if expected != final:
        raise Rejected(f"layer {layer.index} ({kind.value}): final sumcheck claim does not "
                       "match the opened evaluations")
    if lp.weight_eval is not None:
        _open(layer, commitment, w_point, lp.weight_eval)
    evals = [x] if lp.weight_eval is None else [x, lp.weight_eval]
    transcript.absorb_qm31(b"layer.evals", evals)
    return new_point, x


def _open(layer: LayerSpec, commitment: bytes | None, point: list[QM31], value: QM31) -> None:
    assert layer.weight is not None
    # Only an absent commitment means "the model's own"; an empty or short one is a
    # commitment to nothing and must fail the opening, not fall back to the model.
    bound = commit(layer.weight) if commitment is None else commitment
    problem = open_check(layer.weight, bound, point, value)
    if problem is not None:
        raise Rejected(f"layer {layer.index} ({layer.kind.value}): {problem}")
