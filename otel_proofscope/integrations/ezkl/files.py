"""Span attributes read from EZKL's own files: the settings JSON and the proof JSON.

Pure functions over a path or a parsed document, tested without EZKL. A file that is
missing, too large or not what EZKL writes yields no attributes (never a guess).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.util.types import AttributeValue

from otel_proofscope.semconv import Attr, EzklAttr

_HEX = frozenset("0123456789abcdefABCDEF")

#: Settings or proof files larger than this are not read (EZKL's are kilobytes).
MAX_FILE_BYTES = 64 * 1024 * 1024


def load_json(path: str | os.PathLike[str] | None) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when absent, oversized or not an object."""
    if path is None:
        return None
    try:
        if os.path.getsize(path) > MAX_FILE_BYTES:
            return None
        with open(path, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _visibility(value: Any) -> str | None:
    # "Public" / "Private" / "Fixed", or a tagged object such as {"Hashed": {...}}.
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and len(value) == 1:
        return str(next(iter(value)))
    return None


def _ints(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(_int(v) is not None for v in value):
        return list(value)
    return None


def settings_attributes(settings: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """Circuit facts from an EZKL settings document, under ``ezkl.*`` names."""
    out: dict[str, AttributeValue] = {}
    run_args = settings.get("run_args")
    ra: Mapping[str, Any] = run_args if isinstance(run_args, Mapping) else {}
    for key, name in ((ra.get("logrows"), EzklAttr.LOGROWS),
                      (ra.get("input_scale"), EzklAttr.INPUT_SCALE),
                      (ra.get("param_scale"), EzklAttr.PARAM_SCALE),
                      (ra.get("num_inner_cols"), EzklAttr.NUM_INNER_COLS),
                      (settings.get("num_rows"), EzklAttr.NUM_ROWS),
                      (settings.get("total_assignments"), EzklAttr.TOTAL_ASSIGNMENTS),
                      (settings.get("total_const_size"), EzklAttr.TOTAL_CONST_SIZE)):
        if (v := _int(key)) is not None:
            out[name] = v
    for key, name in (("input_visibility", EzklAttr.INPUT_VISIBILITY),
                      ("output_visibility", EzklAttr.OUTPUT_VISIBILITY),
                      ("param_visibility", EzklAttr.PARAM_VISIBILITY)):
        if (vis := _visibility(ra.get(key))) is not None:
            out[name] = vis
    for key, name in (("model_input_scales", EzklAttr.MODEL_INPUT_SCALES),
                      ("model_output_scales", EzklAttr.MODEL_OUTPUT_SCALES)):
        if (scales := _ints(settings.get(key))) is not None:
            out[name] = scales
    lookups = settings.get("required_lookups")
    if isinstance(lookups, list):
        out[EzklAttr.REQUIRED_LOOKUPS] = [json.dumps(x, separators=(",", ":"))
                                          if not isinstance(x, str) else x for x in lookups]
    checks = settings.get("required_range_checks")
    if isinstance(checks, list):
        out[EzklAttr.REQUIRED_RANGE_CHECKS] = len(checks)
    for key, name in (("check_mode", EzklAttr.CHECK_MODE), ("version", EzklAttr.VERSION)):
        if isinstance(settings.get(key), str):
            out[name] = settings[key]
    return out


def io_shapes(settings: Mapping[str, Any]) -> dict[str, AttributeValue]:
    """``proof.input.shape`` / ``proof.output.shape`` when the settings pin them down.

    EZKL lists the shapes of the public instances only; they are the model's input and
    output shapes exactly when both are public and the model has one input and one output.
    """
    run_args = settings.get("run_args")
    ra: Mapping[str, Any] = run_args if isinstance(run_args, Mapping) else {}
    shapes = settings.get("model_instance_shapes")
    n_in = len(settings.get("model_input_scales") or ())
    n_out = len(settings.get("model_output_scales") or ())
    if (_visibility(ra.get("input_visibility")) != "Public"
            or _visibility(ra.get("output_visibility")) != "Public"
            or (n_in, n_out) != (1, 1) or not isinstance(shapes, list) or len(shapes) != 2):
        return {}
    inp, outp = _ints(shapes[0]), _ints(shapes[1])
    if inp is None or outp is None:
        return {}
    return {Attr.PROOF_INPUT_SHAPE: inp, Attr.PROOF_OUTPUT_SHAPE: outp}


def proof_size(proof: Mapping[str, Any]) -> int | None:
    """Size in bytes of the proof itself (not of its JSON file)."""
    # The proof file holds a byte list (plus "hex_proof"); prove() returns a 0x-hex string.
    for raw in (proof.get("proof"), proof.get("hex_proof")):
        if isinstance(raw, str):
            digits = raw[2:] if raw.startswith("0x") else raw
            if len(digits) % 2 == 0 and all(c in _HEX for c in digits):
                return len(digits) // 2
        elif isinstance(raw, Sequence) and all(
                _int(b) is not None and 0 <= b < 256 for b in raw):
            return len(raw)
    return None


def file_size(path: str | os.PathLike[str] | None) -> int | None:
    if path is None:
        return None
    try:
        return os.path.getsize(path)
    except OSError:
        return None
