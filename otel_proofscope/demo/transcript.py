"""Fiat–Shamir transcript over BLAKE2s-256.

The state is a 32-byte digest. ``absorb`` hashes the previous state, a domain label and
the length-prefixed data; ``challenge`` squeezes by hashing the state with a counter and
reads 31-bit little-endian words, rejecting the single value 2^31 − 1 (= p) so every
M31 limb is exactly uniform in [0, p). A QM31 challenge takes four such limbs; the
squeezed output is absorbed back so later challenges depend on earlier ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from otel_proofscope.demo.field import QM31, P, U64Array

_DOMAIN = b"otel_proofscope/gkr-demo/v1"


class Transcript:
    def __init__(self, domain: bytes = _DOMAIN) -> None:
        self._state = hashlib.blake2s(domain).digest()

    @property
    def state(self) -> bytes:
        return self._state

    def absorb(self, label: bytes, data: bytes) -> None:
        h = hashlib.blake2s(self._state)
        h.update(len(label).to_bytes(2, "little"))
        h.update(label)
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
        self._state = h.digest()

    def absorb_int(self, label: bytes, value: int) -> None:
        self.absorb(label, int(value).to_bytes(8, "little", signed=True))

    def absorb_qm31(self, label: bytes, values: Iterable[QM31]) -> None:
        self.absorb(label, b"".join(v.to_bytes() for v in values))

    def absorb_m31_array(self, label: bytes, values: U64Array) -> None:
        arr = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
        self.absorb(label, arr.astype("<u4").tobytes())

    def _limbs(self, count: int) -> list[int]:
        out: list[int] = []
        counter = 0
        while len(out) < count:
            block = hashlib.blake2s(self._state + b"squeeze" + counter.to_bytes(4, "little"))
            digest = block.digest()
            counter += 1
            for j in range(0, 32, 4):
                v = int.from_bytes(digest[j:j + 4], "little") & P
                if v != P and len(out) < count:  # reject p itself: uniform in [0, p)
                    out.append(v)
        self.absorb(b"squeezed", b"".join(v.to_bytes(4, "little") for v in out))
        return out

    def challenge(self) -> QM31:
        a, b, c, d = self._limbs(4)
        return QM31(a, b, c, d)

    def challenges(self, n: int) -> list[QM31]:
        limbs = self._limbs(4 * n)
        return [QM31(*limbs[4 * i:4 * i + 4]) for i in range(n)]
