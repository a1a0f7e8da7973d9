"""Weight commitments: a BLAKE2s Merkle root over a weight tensor's MLE evaluations.

The demo proves a network with *public* weights (the common zkML setting where the
model is published and the input or output is what matters). The commitment binds the
proof to one exact model: it is absorbed into the Fiat–Shamir transcript before any
challenge, and the verifier, who holds the committed model, opens a claim
``W̃(point) = v`` by recomputing the root and evaluating the MLE itself. That check is
exact but costs O(|W|) and hides nothing; a succinct polynomial commitment (FRI,
Ligero, …) would replace :func:`open_check` without touching the GKR layers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from otel_proofscope.demo.field import QM31, U64Array
from otel_proofscope.demo.mle import evaluate

#: Elements per Merkle leaf (1 KiB). Wide leaves keep the per-hash Python overhead off
#: the prover's critical path; an opening here reveals the whole tensor anyway.
LEAF_ELEMENTS = 256

#: Length of a commitment (one BLAKE2s digest); the proof encoding relies on it.
COMMITMENT_BYTES = 32


def commit(weights: U64Array) -> bytes:
    """32-byte commitment: BLAKE2s(shape ‖ Merkle root of the little-endian u32 limbs)."""
    flat = np.ascontiguousarray(weights, dtype=np.uint64).reshape(-1).astype("<u4")
    pad = (-flat.shape[0]) % LEAF_ELEMENTS
    if pad:
        flat = np.concatenate([flat, np.zeros(pad, dtype="<u4")])
    raw = flat.tobytes()
    step = LEAF_ELEMENTS * 4
    level = [hashlib.blake2s(b"\x00" + raw[i:i + step]).digest()
             for i in range(0, len(raw), step)]
    while len(level) > 1:
        if len(level) % 2:
            level.append(level[-1])
        level = [hashlib.blake2s(b"\x01" + level[i] + level[i + 1]).digest()
                 for i in range(0, len(level), 2)]
    shape = b"".join(int(d).to_bytes(4, "little") for d in np.shape(weights))
    return hashlib.blake2s(b"\x02" + shape + level[0]).digest()


def open_check(weights: U64Array, commitment: bytes, point: Sequence[QM31],
               value: QM31) -> str | None:
    """Verifier side of an opening: None if ``W̃(point) = value`` for the committed W."""
    if len(commitment) != COMMITMENT_BYTES:
        return f"weight commitment is {len(commitment)} bytes, not {COMMITMENT_BYTES}"
    if commit(weights) != commitment:
        return "weight commitment does not match the model"
    if evaluate(weights, point) != value:
        return "weight opening: claimed evaluation is wrong"
    return None
