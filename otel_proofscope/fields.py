"""Canonical string forms of field elements and shapes for span attributes.

A prime-field element is its integer in [0, p) as a decimal string; an extension-field
element (e.g. QM31 = four M31 limbs) is its limbs as ``(a,b,c,d)``. Anything else is
rejected: a float is not a field element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral
from typing import Protocol, runtime_checkable


@runtime_checkable
class CanonicalField(Protocol):
    """Implement this to give a custom field type its canonical form."""

    def __proofscope_field__(self) -> str: ...


FieldLike = int | Sequence[int] | CanonicalField

#: The Mersenne prime 2³¹ − 1 of the M31 field (a QM31 element is four M31 limbs): the
#: reference prover's field, the proof-stream schema's and the Rerun claim fingerprint's.
M31 = (1 << 31) - 1


def canonical(element: object) -> str:
    """Canonical string of a field element; raises ValueError for non-elements."""
    # Fast path first: this runs once per coefficient per sumcheck round.
    kind = type(element)
    if kind is int:
        return str(element)
    if (kind is tuple or kind is list) and element and all(
        type(x) is int for x in element  # type: ignore[attr-defined]
    ):
        return "(" + ",".join(map(str, element)) + ")"  # type: ignore[call-overload]
    return _canonical_slow(element)


def _canonical_slow(element: object) -> str:
    if isinstance(element, bool):
        raise ValueError(f"field element must be an integer or limb tuple, got bool {element!r}")
    if isinstance(element, Integral):
        return str(int(element))
    if isinstance(element, CanonicalField):
        return element.__proofscope_field__()
    if isinstance(element, str):
        raise ValueError(f"field element must be an integer or limb tuple, got str {element!r}")
    limbs: object = None
    if hasattr(element, "tolist"):
        limbs = element.tolist()
    elif isinstance(element, Sequence):
        limbs = list(element)
    if isinstance(limbs, list) and limbs and all(
        isinstance(x, Integral) and not isinstance(x, bool) for x in limbs
    ):
        return "(" + ",".join(str(int(x)) for x in limbs) + ")"
    raise ValueError(
        f"field element must be an integer or a non-empty tuple of integer limbs, "
        f"got {type(element).__name__} {element!r:.80}"
    )


def parse_canonical(text: str) -> int | tuple[int, ...]:
    """Inverse of :func:`canonical` (used by readers of exported telemetry)."""
    text = text.strip()
    if text.startswith("(") and text.endswith(")"):
        return tuple(int(x) for x in text[1:-1].split(","))
    return int(text)


def shape(value: Sequence[int] | None, name: str) -> list[int]:
    """A validated shape (non-negative ints) as a list for an int-array attribute."""
    if value is None:
        return []
    out: list[int] = []
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, Integral) or int(dim) < 0:
            raise ValueError(f"{name}: shape dimensions must be non-negative integers, "
                             f"got {list(value)!r}")
        out.append(int(dim))
    return out


def non_negative_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or int(value) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def finite_number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | Integral):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    f = float(value)  # type: ignore[arg-type]
    if not math.isfinite(f):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return f
