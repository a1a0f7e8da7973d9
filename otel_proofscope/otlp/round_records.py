"""A sumcheck round as the prover thread records it, and what each reader makes of it.

:meth:`~otel_proofscope.instrumentation.ProofTracer.sumcheck_round` appends one tuple per
round to its layer's :class:`~otel_proofscope.otlp.deferred_events.DeferredEvents`
instead of building an SDK event (the hot path), laid out as

    ``(time_ns, round, degree, poly, claim, challenge, error, deferred)``

* ``round``: the index (``-1`` when the prover gave none that is valid), ``degree``:
  an ``int`` or ``None`` (then ``len(poly) - 1``), ``error``: an ``error.type`` or
  ``None``;
* ``deferred`` true: ``poly`` a non-empty tuple or list whose coefficients, like
  ``claim`` and ``challenge`` (or ``None``), are ``int`` or non-empty tuples of ``int``
  limbs, checked on the prover thread and formatted by whoever reads them; false: they
  are canonical strings already.

Readers: :func:`round_event` builds the event ``add_event`` would have (name and
attributes), :func:`event_body` writes that event's OTLP bytes straight from the record
(the OTLP encoder's way, registered with it below), and :func:`check` is what a process
that receives records from another runs once instead of building them.
"""

from __future__ import annotations

from typing import Any

from otel_proofscope.fields import canonical_checked
from otel_proofscope.otlp import encode
from otel_proofscope.semconv import Attr, EventName

NAME = EventName.SUMCHECK_ROUND
#: The most attributes a round event has (round, degree, poly, challenge, claim, error):
#: with a limit at least this, or none, the SDK's limits change nothing in it.
ATTRIBUTES = 6

_K_ROUND, _K_DEGREE, _K_POLY = Attr.SUMCHECK_ROUND, Attr.SUMCHECK_DEGREE, Attr.SUMCHECK_POLY
_K_CHALLENGE, _K_CLAIM, _K_ERROR = Attr.SUMCHECK_CHALLENGE, Attr.CLAIM, Attr.ERROR_TYPE


def round_event(record: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    """The ``sumcheck.round`` event of one record, built on whichever thread reads it.
    Its values are what the SDK's cleaning keeps as they are (the polynomial a tuple), in
    the order ``add_event`` always got them: the wire bytes must not depend on the path."""
    _, round, degree, poly, claim, chal, error, deferred = record
    if deferred:
        poly = tuple(map(canonical_checked, poly))
        if claim is not None:
            claim = canonical_checked(claim)
        if chal is not None:
            chal = canonical_checked(chal)
    else:
        poly = tuple(poly)
    attrs: dict[str, Any] = {
        _K_ROUND: round,
        _K_DEGREE: degree if degree is not None else len(poly) - 1,
        _K_POLY: poly,
    }
    if chal is not None:
        attrs[_K_CHALLENGE] = chal
    if claim is not None:
        attrs[_K_CLAIM] = claim
    if error is not None:
        attrs[_K_ERROR] = error
    return NAME, attrs


# Each attribute's KeyValue up to its value's length: the key field and the value's tag.
_VT = encode.VARINTS
_TABLE = len(_VT)
_HEAD_ROUND = encode.key_field(_K_ROUND) + b"\x12"
_HEAD_DEGREE = encode.key_field(_K_DEGREE) + b"\x12"
_HEAD_POLY = encode.key_field(_K_POLY) + b"\x12"
_HEAD_CHALLENGE = encode.key_field(_K_CHALLENGE) + b"\x12"
_HEAD_CLAIM = encode.key_field(_K_CLAIM) + b"\x12"
_HEAD_ERROR = encode.key_field(_K_ERROR) + b"\x12"
_ld = encode.length_delimited
_varint = encode.varint
_int_value = encode.int_value
_str_value = encode.str_value
_name_field = encode.event_name_field(NAME)
_pack_time = encode.pack_timestamp


def _attribute(head: bytes, any_value: bytes) -> bytes:
    """An event's ``attributes`` field: tag, length, then the KeyValue ``head`` begins."""
    n = len(any_value)
    body = head + (_VT[n] if n < _TABLE else _varint(n)) + any_value
    n = len(body)
    return b"\x1a" + (_VT[n] if n < _TABLE else _varint(n)) + body


def event_body(record: tuple[Any, ...]) -> bytes:
    """The OTLP ``Span.Event`` body of :func:`round_event`'s event for ``record``: the
    same bytes, in the same attribute order, as the encoder writes for the built event
    (``tests/test_round_records.py`` compares them), without the attribute dict and the
    cache lookups for values that never repeat. Raises where the built event's encoding
    would skip a value (an int outside int64): the encoder then encodes the built one."""
    ts, round, degree, poly, claim, chal, error, deferred = record
    coefficients: list[bytes] = []
    append = coefficients.append
    for c in poly:
        if deferred:
            c = str(c) if type(c) is int else "(" + ",".join(map(str, c)) + ")"
        elif type(c) is not str:
            raise TypeError("a formatted coefficient is not a str")
        b = c.encode()
        n = len(b)
        if n < 126:  # both lengths are one byte
            append(b"\x0a" + _VT[n + 2] + b"\x0a" + _VT[n] + b)
        else:
            append(b"\x0a" + _ld(b"\x0a" + _ld(b)))
    array = b"".join(coefficients)
    parts = [_pack_time(ts) + _name_field if ts else _name_field,
             _attribute(_HEAD_ROUND, _int_value(round)),
             _attribute(_HEAD_DEGREE, _int_value(len(poly) - 1 if degree is None else degree)),
             _attribute(_HEAD_POLY, b"\x2a" + _ld(array))]
    if chal is not None:
        parts.append(_attribute(_HEAD_CHALLENGE, _str_value(
            canonical_checked(chal) if deferred else chal)))
    if claim is not None:
        parts.append(_attribute(_HEAD_CLAIM, _str_value(
            canonical_checked(claim) if deferred else claim)))
    if error is not None:
        parts.append(_attribute(_HEAD_ERROR, _str_value(error)))
    return b"".join(parts)


def check(record: Any) -> None:
    """Raise ValueError unless ``record`` has the layout above with the types the prover
    thread checked: a process that receives records from another checks each once (~1 µs)
    instead of building every event to find a bad one (~4 µs)."""
    if type(record) is not tuple or len(record) != 8:
        raise ValueError("a round record is not an 8-tuple")
    ts, round, degree, poly, claim, chal, error, deferred = record
    if type(ts) is not int or type(round) is not int \
            or (degree is not None and type(degree) is not int) \
            or (error is not None and type(error) is not str) or type(deferred) is not bool \
            or type(poly) not in (tuple, list) or not poly:
        raise ValueError("a round record's time, round, degree, poly or error has the "
                         "wrong type")
    if deferred:
        # Ints first, one test each: the common case (a prime field's coefficients).
        for value in poly:
            if type(value) is not int and not _limbs(value):
                raise ValueError("a round record's coefficient is not an int or limbs")
        if (claim is not None and type(claim) is not int and not _limbs(claim)) or \
                (chal is not None and type(chal) is not int and not _limbs(chal)):
            raise ValueError("a round record's claim or challenge is not an int or limbs")
    elif not all(type(v) is str for v in poly) \
            or (claim is not None and type(claim) is not str) \
            or (chal is not None and type(chal) is not str):
        raise ValueError("a round record's formatted values are not strings")


def _limbs(value: Any) -> bool:
    """Whether ``value`` is a non-empty tuple or list of ``int`` (an extension element)."""
    return type(value) in (tuple, list) and bool(value) \
        and all(type(limb) is int for limb in value)


encode.register_record_encoder(round_event, event_body, max_attributes=ATTRIBUTES)
