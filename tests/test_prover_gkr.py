"""Completeness and soundness of the reference GKR prover, layer kind by layer kind."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
from opentelemetry import metrics, trace

from otel_proofscope.demo.circuit import Network, build_network
from otel_proofscope.demo.commitment import commit
from otel_proofscope.demo.field import ONE, QM31, P, m31_matmul
from otel_proofscope.demo.proof import LayerProof, Proof
from otel_proofscope.demo.prover import prove, prove_witness
from otel_proofscope.demo.verifier import verify
from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.semconv import LayerKind

ALL_KINDS = (LayerKind.MATMUL, LayerKind.ADD, LayerKind.ACTIVATION, LayerKind.MUL,
             LayerKind.ATTENTION)
SUMCHECK_KINDS = tuple(k for k in ALL_KINDS if k is not LayerKind.ADD)
WEIGHTED_KINDS = tuple(k for k in ALL_KINDS if k is not LayerKind.ACTIVATION)

OFF = ProofTracer(trace.NoOpTracerProvider(), metrics.NoOpMeterProvider())


@pytest.fixture(scope="module")
def honest() -> tuple[Network, Proof]:
    net = build_network(width=8, rows=4, seed=7, kinds=ALL_KINDS)
    result = prove(net, tracer=OFF)
    assert result.verified, result.verify.reason
    return net, result.proof


def _layer(proof: Proof, kind: LayerKind) -> LayerProof:
    return next(lp for lp in proof.layers if lp.kind is kind)


def _tampered(proof: Proof, edit: Callable[[Proof], None]) -> Proof:
    bad = copy.deepcopy(proof)
    edit(bad)
    return bad


def _bump(q: QM31) -> QM31:
    return q + ONE


def test_honest_proof_verifies_for_every_pattern() -> None:
    for layers, width, seed in [(1, 2, 0), (5, 4, 1), (8, 16, 2), (11, 8, 3)]:
        net = build_network(layers=layers, width=width, seed=seed)
        result = prove(net, tracer=OFF)
        assert result.verified, result.verify.reason
        assert result.size == len(result.proof.to_bytes())


def test_default_network_meets_the_soundness_target() -> None:
    net = build_network()  # the demo's default: 8 layers, width 32
    assert net.soundness_bits() >= 100
    # One proof cannot be sound beyond the field size (p^4 ≈ 2^124).
    assert net.soundness_bits() < 4 * 31


@pytest.mark.parametrize("kind", SUMCHECK_KINDS, ids=lambda k: k.value)
def test_flipped_round_polynomial_is_rejected(honest: tuple[Network, Proof],
                                              kind: LayerKind) -> None:
    net, proof = honest

    def flip_first(p: Proof) -> None:
        lp = _layer(p, kind)
        lp.round_polys[0][0] = _bump(lp.round_polys[0][0])

    result = verify(net, _tampered(proof, flip_first))
    assert not result.ok and "round 0: g(0) + g(1) != claim" in result.reason

    def flip_last_high_coefficient(p: Proof) -> None:
        # g(0) + g(1) still holds; only the evaluation at the challenge changes.
        lp = _layer(p, kind)
        lp.round_polys[-1][2] = _bump(lp.round_polys[-1][2])

    assert not verify(net, _tampered(proof, flip_last_high_coefficient)).ok

    def shift_mass(p: Proof) -> None:
        # Moves one unit from g(1) to g(0): the round check passes, a later one fails.
        lp = _layer(p, kind)
        g = lp.round_polys[0]
        g[0], g[1] = g[0] + ONE, g[1] - ONE

    assert not verify(net, _tampered(proof, shift_mass)).ok


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_wrong_input_claim_is_rejected(honest: tuple[Network, Proof], kind: LayerKind) -> None:
    net, proof = honest

    def edit(p: Proof) -> None:
        lp = _layer(p, kind)
        lp.input_eval = _bump(lp.input_eval)

    assert not verify(net, _tampered(proof, edit)).ok


@pytest.mark.parametrize("kind", WEIGHTED_KINDS, ids=lambda k: k.value)
def test_wrong_weight_opening_is_rejected(honest: tuple[Network, Proof],
                                          kind: LayerKind) -> None:
    net, proof = honest

    def edit(p: Proof) -> None:
        lp = _layer(p, kind)
        assert lp.weight_eval is not None
        lp.weight_eval = _bump(lp.weight_eval)
        if kind is LayerKind.ADD:  # keep input + bias = claim: only the opening can catch it
            lp.input_eval = lp.input_eval - ONE

    result = verify(net, _tampered(proof, edit))
    assert not result.ok


def test_wrong_output_is_rejected(honest: tuple[Network, Proof]) -> None:
    net, proof = honest

    def edit(p: Proof) -> None:
        p.output = p.output.copy()
        p.output[0, 0] = (p.output[0, 0] + 1) % P

    result = verify(net, _tampered(proof, edit))
    assert not result.ok and "g(0) + g(1) != claim" in result.reason


def test_other_model_is_rejected(honest: tuple[Network, Proof]) -> None:
    net, proof = honest
    other = copy.deepcopy(net)
    w = other.layers[0].weight
    assert w is not None
    w[0, 0] = (w[0, 0] + 1) % P
    assert not verify(other, proof).ok


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_cheating_witness_is_rejected(kind: LayerKind) -> None:
    """A prover whose layer output is wrong in one entry, with everything after it
    recomputed consistently, cannot make the verifier accept."""
    net = build_network(width=8, rows=4, seed=11, kinds=ALL_KINDS)
    acts = net.forward()
    bad = next(layer for layer in net.layers if layer.kind is kind)
    acts[bad.index + 1] = acts[bad.index + 1].copy()
    acts[bad.index + 1][1, 2] = (acts[bad.index + 1][1, 2] + 1) % P
    for layer in net.layers[bad.index + 1:]:
        acts[layer.index + 1] = layer.forward(acts[layer.index], m31_matmul)
    commitments = {layer.index: commit(layer.weight) for layer in net.layers
                   if layer.weight is not None}
    proof = prove_witness(net, acts, commitments, tracer=OFF)
    result = verify(net, proof)
    assert not result.ok, "verifier accepted a wrong witness"
    # The broken relation is caught at the bad layer or, for a linear layer, by the
    # next sumcheck below it (or the input check).
    assert "layer" in result.reason or "input" in result.reason


def test_encoding_round_trips_and_rejects_garbage(honest: tuple[Network, Proof]) -> None:
    net, proof = honest
    data = proof.to_bytes()
    again = Proof.from_bytes(data)
    assert again.to_bytes() == data
    assert verify(net, again).ok
    with pytest.raises(ValueError):
        Proof.from_bytes(data[:-1])
    with pytest.raises(ValueError):
        Proof.from_bytes(data + b"\x00")
    # Flip one byte inside the first round polynomial of the first layer proof.
    offset = data.index(proof.layers[0].round_polys[0][0].to_bytes())
    corrupt = bytearray(data)
    corrupt[offset] ^= 0x01
    try:
        decoded = Proof.from_bytes(bytes(corrupt))
    except ValueError:
        return
    assert not verify(net, decoded).ok


def test_truncated_layer_list_is_rejected(honest: tuple[Network, Proof]) -> None:
    net, proof = honest
    assert not verify(net, _tampered(proof, lambda p: p.layers.pop())).ok
    assert not verify(net, _tampered(proof, lambda p: p.layers[0].round_polys.pop())).ok


@pytest.mark.parametrize("bad", [b"", b"\x00" * 31, b"\x00" * 33], ids=len)
def test_commitment_of_wrong_length_is_rejected(honest: tuple[Network, Proof],
                                                bad: bytes) -> None:
    """An empty commitment once fell back to the model's own and verified, and its
    encoding could not be decoded."""
    net, proof = honest
    idx = min(proof.commitments)
    forged = _tampered(proof, lambda p: p.commitments.__setitem__(idx, bad))
    result = verify(net, forged)
    assert not result.ok
    assert f"commitment for layer {idx} is {len(bad)} bytes" in result.reason
    with pytest.raises(ValueError, match=f"{len(bad)} bytes"):
        forged.to_bytes()


def test_decoding_checks_declared_lengths(honest: tuple[Network, Proof]) -> None:
    _, proof = honest
    data = proof.to_bytes()
    # A header claiming a huge output is refused before anything is read.
    huge = bytearray(data)
    huge[6:14] = (1 << 16).to_bytes(4, "little") * 2
    with pytest.raises(ValueError, match="65536×65536 output need"):
        Proof.from_bytes(bytes(huge))
    # The same commitment index twice.
    one = min(proof.commitments)
    twice = _tampered(proof, lambda p: None)
    raw = bytearray(twice.to_bytes())
    at = raw.index(proof.commitments[one]) - 4
    nxt = at + 4 + 32
    raw[nxt:nxt + 4] = raw[at:at + 4]
    with pytest.raises(ValueError, match=f"two commitments for layer {one}"):
        Proof.from_bytes(bytes(raw))
    # A has-weight byte that is neither 0 nor 1.
    last = proof.layers[-1]
    tail = last.input_eval.to_bytes()
    pos = data.rindex(tail) + len(tail)
    flagged = bytearray(data)
    flagged[pos] = 7
    with pytest.raises(ValueError, match="has-weight byte 7"):
        Proof.from_bytes(bytes(flagged))


def test_fiat_shamir_bound_from_its_hash_budget() -> None:
    """The non-interactive figure, written out here: T·max(m_out, d)/p^4 + T²/2^256."""
    import math

    net = build_network()  # 32 rows × 32 columns: m_out = 10 > every degree (≤ 3)
    for log_t in (0, 20, 40, 64):
        t = 2.0 ** log_t
        expected = -math.log2(t * 10 / float(P) ** 4 + t * t / 2.0 ** 256)
        assert net.fiat_shamir_bits(log_t) == pytest.approx(expected, abs=1e-9)
    # The demo's budget costs ~36 bits against the interactive bound.
    assert net.fiat_shamir_bits(40) < net.soundness_bits() - 30
