"""Canonical string forms of field elements and shapes for span attributes.

A prime-field element is its integer in [0, p) as a decimal string; an extension-field
element (e.g. QM31 = four M31 limbs) is its limbs as ``(a,b,c,d)``. Anything else is
rejected: a float is not a field element.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
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


def canonical_checked(element: int | tuple[int, ...] | list[int]) -> str:
    """:func:`canonical` of an element already checked to be an ``int`` or a non-empty
    tuple or list of ``int`` (exact types): the same string, without the checks. For
    values checked on the prover thread and formatted later, on an export thread."""
    if type(element) is int:
        return str(element)
    return "(" + ",".join(map(str, element)) + ")"  # type: ignore[arg-type]


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
        f"got {type(element).__name__} {_show(element)}"
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


def _show(value: object) -> str:
    """``repr`` for an error message, bounded, and safe for objects whose repr raises."""
    try:
        return repr(value)[:80]
    except Exception:
        return f"<{type(value).__name__}>"


def _is_numpy_bool(value: object) -> bool:
    # numpy's bool_ (named "bool" since numpy 2) is neither a bool nor an Integral
    kind = type(value)
    return kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool")


def _is_bool(value: object) -> bool:
    return isinstance(value, bool) or _is_numpy_bool(value)


def non_negative_int(value: object, name: str) -> int:
    """An int >= 0; numpy integer scalars are accepted like Python ints."""
    if _is_bool(value) or not isinstance(value, Integral) or int(value) < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {_show(value)}")
    return int(value)


def finite_number(value: object, name: str) -> float:
    """A finite float; numpy scalars (float32, int64, …) are accepted like Python ones."""
    if _is_bool(value) or not isinstance(value, Real):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    f = float(value)
    if not math.isfinite(f):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    return f


def number_list(values: object, name: str, limit: int = 4096) -> list[float]:
    """Finite numbers from a list, tuple or 1-D array (numpy arrays accepted)."""
    if hasattr(values, "tolist") and not isinstance(values, Real):
        values = values.tolist()
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise ValueError(f"{name} must be a sequence of finite numbers, got "
                         f"{type(values).__name__}")
    if len(values) > limit:
        raise ValueError(f"{name}: {len(values)} values exceed the cap of {limit}")
    return [finite_number(v, name) for v in values]


def strict_bool(value: object, name: str) -> bool:
    """True or False (numpy's bool_ too); anything else is refused, not coerced: a
    ``verified="no"`` must not be recorded as True."""
    if isinstance(value, bool):
        return value
    if _is_numpy_bool(value):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {_show(value)}")
