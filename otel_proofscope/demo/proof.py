"""The proof object and its canonical byte encoding (``proof.size`` is its length).

Layout (all integers little-endian):

    b"PSGKR1"
    u32 rows, u32 width, rows·width × u32           public output
    u32 k, k × (u32 layer index, 32-byte commitment)
    u32 L, L × layer proof (walk order: output → input):
        u32 index, u8 kind code, u8 evaluations per round (d + 1), u32 rounds,
        rounds·(d + 1) × QM31 (16 bytes: four u32 limbs),
        QM31 input evaluation, u8 has-weight, [QM31 weight evaluation]
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from otel_proofscope.demo.commitment import COMMITMENT_BYTES
from otel_proofscope.demo.field import QM31, P, U64Array
from otel_proofscope.semconv import LayerKind

MAGIC = b"PSGKR1"
QM31_BYTES = 16

_KIND_CODES: dict[LayerKind, int] = {
    LayerKind.MATMUL: 1, LayerKind.ADD: 2, LayerKind.ACTIVATION: 3, LayerKind.MUL: 4,
    LayerKind.ATTENTION: 5,
}
_CODE_KINDS = {v: k for k, v in _KIND_CODES.items()}


@dataclass
class LayerProof:
    index: int
    kind: LayerKind
    round_polys: list[list[QM31]]
    input_eval: QM31  # the claim on the layer's input MLE at the new point
    weight_eval: QM31 | None = None  # the opened weight MLE value, if the layer has weights


@dataclass
class Proof:
    output: U64Array
    commitments: dict[int, bytes] = field(default_factory=dict)
    layers: list[LayerProof] = field(default_factory=list)

    @property
    def weight_openings(self) -> int:
        return sum(1 for lp in self.layers if lp.weight_eval is not None)

    def to_bytes(self) -> bytes:
        out = bytearray(MAGIC)
        rows, width = self.output.shape
        out += struct.pack("<II", rows, width)
        out += np.ascontiguousarray(self.output, dtype=np.uint64).astype("<u4").tobytes()
        out += struct.pack("<I", len(self.commitments))
        for idx in sorted(self.commitments):
            c = self.commitments[idx]
            if len(c) != COMMITMENT_BYTES:  # the layout has no length field for it
                raise ValueError(f"commitment for layer {idx} is {len(c)} bytes, "
                                 f"not {COMMITMENT_BYTES}")
            out += struct.pack("<I", idx) + c
        out += struct.pack("<I", len(self.layers))
        for lp in self.layers:
            per_round = len(lp.round_polys[0]) if lp.round_polys else 0
            out += struct.pack("<IBBI", lp.index, _KIND_CODES[lp.kind], per_round,
                               len(lp.round_polys))
            for evals in lp.round_polys:
                if len(evals) != per_round:
                    raise ValueError(f"layer {lp.index}: ragged round polynomials")
                out += b"".join(e.to_bytes() for e in evals)
            out += lp.input_eval.to_bytes()
            if lp.weight_eval is None:
                out += b"\x00"
            else:
                out += b"\x01" + lp.weight_eval.to_bytes()
        return bytes(out)

    @staticmethod
    def from_bytes(data: bytes) -> Proof:
        r = _Reader(data)
        if r.take(len(MAGIC)) != MAGIC:
            raise ValueError("not a PSGKR1 proof")
        rows, width = r.unpack("<II")
        count = rows * width
        r.need(4 * count, f"a {rows}×{width} output")
        output = np.frombuffer(r.take(4 * count), dtype="<u4").astype(np.uint64)
        if (output >= P).any():
            raise ValueError("output element out of range")
        commitments: dict[int, bytes] = {}
        for _ in range(r.unpack("<I")[0]):
            idx = r.unpack("<I")[0]
            if idx in commitments:
                raise ValueError(f"two commitments for layer {idx}")
            commitments[idx] = r.take(COMMITMENT_BYTES)
        layers: list[LayerProof] = []
        for _ in range(r.unpack("<I")[0]):
            index, code, per_round, rounds = r.unpack("<IBBI")
            if code not in _CODE_KINDS:
                raise ValueError(f"unknown layer kind code {code}")
            r.need(rounds * per_round * QM31_BYTES, f"layer {index}: {rounds} rounds")
            polys = [[r.qm31() for _ in range(per_round)] for _ in range(rounds)]
            input_eval = r.qm31()
            flag = r.take(1)
            if flag not in (b"\x00", b"\x01"):
                raise ValueError(f"layer {index}: has-weight byte {flag[0]} is not 0 or 1")
            weight_eval = r.qm31() if flag == b"\x01" else None
            layers.append(LayerProof(index, _CODE_KINDS[code], polys, input_eval, weight_eval))
        if r.remaining():
            raise ValueError(f"{r.remaining()} trailing bytes")
        return Proof(output.reshape(rows, width), commitments, layers)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def take(self, n: int) -> bytes:
        if self._pos + n > len(self._data):
            raise ValueError("truncated proof")
        chunk = self._data[self._pos:self._pos + n]
        self._pos += n
        return chunk

    def need(self, n: int, what: str) -> None:
        """Refuse a declared length longer than what is left, before reading it."""
        if n > self.remaining():
            raise ValueError(f"truncated proof: {what} need {n} bytes, "
                             f"{self.remaining()} left")

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def qm31(self) -> QM31:
        limbs = struct.unpack("<IIII", self.take(16))
        if any(v >= P for v in limbs):
            raise ValueError("QM31 limb out of range")
        return QM31(*limbs)

    def remaining(self) -> int:
        return len(self._data) - self._pos
