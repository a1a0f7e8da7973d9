"""Pure decoding of one proof-stream JSON line into a typed event.

No I/O, no global state: ``decode_line`` returns a :class:`Decoded` carrying either the
event or a :class:`DecodeError` that names the line, variant and field, plus the
unknown fields and enum values it skipped. Accounting (ledgers, reports) is the
caller's job (see ``stats.py``), so the decoder can be fuzzed in isolation.

The format is serde_json's externally tagged encoding of ``ProofEvent``:
``{"LayerStart":{"layer_idx":3,...}}``, one object per line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from otel_proofscope.instrumentation import MAX_ATTENTION_SIDE
from otel_proofscope.integrations.proof_stream import schema as s

#: Longest line accepted (a 64×64 attention map is ~50 KiB of JSON).
MAX_LINE_BYTES = 1 << 20

_U32_MAX = (1 << 32) - 1
_U64_MAX = (1 << 64) - 1


class Reason:
    """Why a line was rejected (the ``reason`` of a :class:`DecodeError`)."""

    NOT_UTF8 = "not_utf8"
    LINE_TOO_LONG = "line_too_long"
    MALFORMED_JSON = "malformed_json"
    NOT_AN_EVENT = "not_an_event"
    UNKNOWN_VARIANT = "unknown_variant"
    MISSING_FIELD = "missing_field"
    INVALID_VALUE = "invalid_value"


class Note:
    """Things skipped in an otherwise decoded event."""

    UNKNOWN_FIELD = "unknown_field"
    UNKNOWN_ENUM_VALUE = "unknown_enum_value"


@dataclass(frozen=True, slots=True)
class DecodeError:
    line: int
    reason: str
    detail: str
    variant: str | None = None
    field: str | None = None

    def message(self) -> str:
        where = self.variant or ""
        if self.field:
            where = f"{where}.{self.field}" if where else self.field
        return f"line {self.line}: {where + ': ' if where else ''}{self.detail}"


@dataclass(frozen=True, slots=True)
class Decoded:
    """Result of decoding one line: ``event`` xor ``error`` (both None for a blank line)."""

    line: int
    event: s.ProofEvent | None = None
    error: DecodeError | None = None
    #: (dotted path, Note.*) for each unknown field / enum value that was skipped.
    notes: tuple[tuple[str, str], ...] = ()

    @property
    def blank(self) -> bool:
        return self.event is None and self.error is None


class _FieldError(Exception):
    def __init__(self, path: str, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.path = path
        self.reason = reason
        self.detail = detail


_Notes = list[tuple[str, str]]
_Conv = Callable[[Any, str, _Notes], Any]


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number"}.get(type(value), type(value).__name__)


def _uint(maximum: int, name: str) -> _Conv:
    def conv(value: Any, path: str, notes: _Notes) -> int:
        if type(value) is not int or not 0 <= value <= maximum:
            raise _FieldError(path, Reason.INVALID_VALUE,
                              f"expected {name}, got {_kind(value)} {_preview(value)}")
        return value

    return conv


_u32 = _uint(_U32_MAX, "an unsigned 32-bit integer")
_usize = _uint(_U64_MAX, "an unsigned integer")
_u64 = _usize


def _f32(value: Any, path: str, notes: _Notes) -> float | None:
    # serde_json writes non-finite floats as null; keep "not a number" as None.
    if value is None:
        return None
    if type(value) not in (int, float):
        raise _FieldError(path, Reason.INVALID_VALUE,
                          f"expected a number, got {_kind(value)} {_preview(value)}")
    f = float(value)
    return f if math.isfinite(f) else None


def _string(value: Any, path: str, notes: _Notes) -> str:
    if type(value) is not str:
        raise _FieldError(path, Reason.INVALID_VALUE,
                          f"expected a string, got {_kind(value)} {_preview(value)}")
    return value


def _boolean(value: Any, path: str, notes: _Notes) -> bool:
    if type(value) is not bool:
        raise _FieldError(path, Reason.INVALID_VALUE,
                          f"expected a boolean, got {_kind(value)} {_preview(value)}")
    return value


def _list(item: _Conv) -> _Conv:
    def conv(value: Any, path: str, notes: _Notes) -> tuple[Any, ...]:
        if type(value) is not list:
            raise _FieldError(path, Reason.INVALID_VALUE,
                              f"expected an array, got {_kind(value)} {_preview(value)}")
        return tuple(item(v, f"{path}[{i}]", notes) for i, v in enumerate(value))

    return conv


_shape = _list(_usize)


def _enum(values: tuple[str, ...], fallback: str | None = None) -> _Conv:
    allowed = frozenset(values)

    def conv(value: Any, path: str, notes: _Notes) -> str:
        if type(value) is str and value in allowed:
            return value
        if type(value) is str and fallback is not None:
            # A newer prover's kind: keep the event, file it under the fallback.
            notes.append((f"{path}={value[:40]}", Note.UNKNOWN_ENUM_VALUE))
            return fallback
        raise _FieldError(path, Reason.INVALID_VALUE,
                          f"expected one of {', '.join(values)}; got {_preview(value)}")

    return conv


class _Opt:
    """Marks an ``Option<T>`` field: null or absent decodes to None."""

    __slots__ = ("conv",)

    def __init__(self, conv: _Conv) -> None:
        self.conv = conv


_Spec = Mapping[str, "_Conv | _Opt"]


def _struct(cls: type[Any], spec: _Spec) -> _Conv:
    def conv(value: Any, path: str, notes: _Notes) -> Any:
        if type(value) is not dict:
            raise _FieldError(path, Reason.INVALID_VALUE,
                              f"expected an object, got {_kind(value)} {_preview(value)}")
        kwargs: dict[str, Any] = {}
        for name, field_conv in spec.items():
            sub = f"{path}.{name}" if path else name
            if isinstance(field_conv, _Opt):
                raw = value.get(name)
                kwargs[name] = None if raw is None else field_conv.conv(raw, sub, notes)
                continue
            if name not in value:
                raise _FieldError(sub, Reason.MISSING_FIELD, "missing required field")
            kwargs[name] = field_conv(value[name], sub, notes)
        for key in value:
            if key not in spec:
                name = key if len(key) <= 40 else key[:37] + "..."
                notes.append((f"{path}.{name}" if path else name, Note.UNKNOWN_FIELD))
        return cls(**kwargs)

    return conv


_layer_kind = _enum(s.LAYER_KINDS, fallback="Unknown")
_qm31 = _struct(s.SecureFieldMirror, {"a": _u32, "b": _u32, "c": _u32, "d": _u32})

_STRUCTS: dict[str, _Conv] = {
    "CircuitCompiled": _struct(s.CircuitCompiled, {
        "total_layers": _usize, "input_shape": _shape, "output_shape": _shape,
        "nodes": _list(_struct(s.CircuitNodeMeta, {
            "layer_idx": _usize, "node_id": _usize, "kind": _layer_kind,
            "input_shape": _shape, "output_shape": _shape, "trace_cost": _usize,
            "input_layers": _list(_usize)})),
        "has_simd": _boolean, "simd_num_blocks": _usize}),
    "LayerActivation": _struct(s.LayerActivation, {
        "layer_idx": _usize, "node_id": _usize, "kind": _layer_kind, "output_shape": _shape,
        "output_sample": _list(_u32),
        "stats": _struct(s.ActivationStats, {
            "mean": _f32, "std_dev": _f32, "min": _f32, "max": _f32, "sparsity": _f32})}),
    "AttentionHeatmap": _struct(s.AttentionHeatmap, {
        "layer_idx": _usize, "head_idx": _usize, "num_heads": _usize, "seq_len": _usize,
        "scores": _list(_f32)}),
    "ProofStart": _struct(s.ProofStart, {
        "model_name": _Opt(_string), "backend": _string, "num_layers": _usize,
        "input_shape": _shape, "output_shape": _shape}),
    "LayerStart": _struct(s.LayerStart, {
        "layer_idx": _usize, "kind": _layer_kind, "input_shape": _shape,
        "output_shape": _shape, "trace_cost": _usize, "claim_value_approx": _f32,
        "gpu_device": _Opt(_usize)}),
    "SumcheckRound": _struct(s.SumcheckRound, {
        "layer_idx": _usize, "round": _usize, "total_rounds": _usize,
        "poly_deg2": _Opt(_struct(s.RoundPolyViz, {"c0": _qm31, "c1": _qm31, "c2": _qm31})),
        "poly_deg3": _Opt(_struct(s.RoundPolyDeg3Viz, {
            "c0": _qm31, "c1": _qm31, "c2": _qm31, "c3": _qm31})),
        "claim_value_approx": _f32, "challenge": _Opt(_qm31)}),
    "LayerEnd": _struct(s.LayerEnd, {
        "layer_idx": _usize, "kind": _enum(s.LAYER_PROOF_KINDS),
        "final_claim_value_approx": _f32, "duration_ms": _u64, "rounds_completed": _usize}),
    "ProofComplete": _struct(s.ProofComplete, {
        "duration_ms": _u64, "num_layer_proofs": _usize, "num_weight_openings": _usize,
        "weight_binding_mode": _string}),
    "WeightOpeningStart": _struct(s.WeightOpeningStart, {
        "weight_node_id": _usize, "eval_point_len": _usize}),
    "WeightOpeningEnd": _struct(s.WeightOpeningEnd, {
        "weight_node_id": _usize, "duration_ms": _u64, "commitment_hex": _string}),
    "AggregatedBindingStart": _struct(s.AggregatedBindingStart, {
        "num_claims": _usize, "num_matrices": _usize}),
    "AggregatedBindingEnd": _struct(s.AggregatedBindingEnd, {
        "duration_ms": _u64, "estimated_calldata_felts": _usize}),
    "GpuStatus": _struct(s.GpuStatus, {
        "devices": _list(_struct(s.GpuSnapshot, {
            "device_id": _usize, "device_name": _string, "utilization": _f32,
            "free_memory_bytes": _Opt(_usize)})),
        "matmul_done": _usize, "matmul_total": _usize, "layers_done": _usize,
        "layers_total": _usize}),
    "StarkProofStart": _struct(s.StarkProofStart, {
        "num_activation_layers": _usize, "num_add_layers": _usize,
        "num_layernorm_layers": _usize}),
    "StarkProofEnd": _struct(s.StarkProofEnd, {"duration_ms": _u64}),
    "Log": _struct(s.Log, {"level": _enum(s.LOG_LEVELS), "message": _string}),
}
assert set(_STRUCTS) == set(s.VARIANTS), "decoder and schema disagree on the variants"


def _check_heatmap(ev: s.AttentionHeatmap) -> None:
    # The producer sends at most a 64×64 corner of the scores, row-major. A line that
    # does not is malformed whether or not witness data is recorded here, so it is
    # rejected at decoding (line number, one warning), never silently skipped later.
    side = min(ev.seq_len, MAX_ATTENTION_SIDE)
    if side == 0 or len(ev.scores) != side * side:
        raise _FieldError("scores", Reason.INVALID_VALUE,
                          f"expected min(seq_len, {MAX_ATTENTION_SIDE})² = {side * side} "
                          f"scores for seq_len {ev.seq_len}, got {len(ev.scores)}")


#: Checks across fields of a decoded event (the per-field converters cannot see them).
_CHECKS: dict[str, Callable[[Any], None]] = {"AttentionHeatmap": _check_heatmap}


def decode_line(raw: str | bytes, line: int) -> Decoded:
    """Decode one line (1-based ``line`` number for messages). Never raises."""
    if len(raw) > MAX_LINE_BYTES:
        return Decoded(line, error=DecodeError(
            line, Reason.LINE_TOO_LONG, f"line of {len(raw)} bytes exceeds the "
            f"{MAX_LINE_BYTES}-byte cap"))
    if isinstance(raw, bytes | bytearray):
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            return Decoded(line, error=DecodeError(
                line, Reason.NOT_UTF8, f"not UTF-8 ({exc.reason} at byte {exc.start})"))
    else:
        text = raw
    text = text.strip()
    if not text:
        return Decoded(line)
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        detail = str(exc) if isinstance(exc, ValueError) else "nesting too deep"
        return Decoded(line, error=DecodeError(line, Reason.MALFORMED_JSON,
                                               f"malformed JSON: {detail[:120]}"))
    return decode_object(obj, line)


def decode_object(obj: Any, line: int) -> Decoded:
    """Decode an already parsed JSON value (e.g. from a WebSocket text frame)."""
    if type(obj) is not dict or len(obj) != 1:
        return Decoded(line, error=DecodeError(
            line, Reason.NOT_AN_EVENT,
            "expected an externally tagged event {\"Variant\": {...}}, got "
            f"{_kind(obj)}" + (f" with {len(obj)} keys" if type(obj) is dict else "")))
    ((variant, payload),) = obj.items()
    conv = _STRUCTS.get(variant)
    if conv is None:
        name = variant if len(variant) <= 64 else variant[:61] + "..."
        return Decoded(line, error=DecodeError(
            line, Reason.UNKNOWN_VARIANT, f"unknown event variant {name!r}", variant=name))
    notes: _Notes = []
    try:
        event = conv(payload, "", notes)
        check = _CHECKS.get(variant)
        if check is not None:
            check(event)
    except _FieldError as exc:
        return Decoded(line, error=DecodeError(line, exc.reason, exc.detail, variant=variant,
                                               field=exc.path or None))
    except RecursionError:
        return Decoded(line, error=DecodeError(line, Reason.INVALID_VALUE, "nesting too deep",
                                               variant=variant))
    return Decoded(line, event=event, notes=tuple((f"{variant}.{p}", n) for p, n in notes))
