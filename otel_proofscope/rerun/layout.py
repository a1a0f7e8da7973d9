"""Geometry and colours of the 3D proof walk (pure maths, no Rerun calls).

The layout is stwo-ml's Rerun view, so its users recognise it: layer ``i`` sits on a helix
(x = 3·i, y = 1.8·sin(0.9·i), z = 1.8·cos(0.9·i)) lifted by a per-kind offset, coloured
by layer kind. Concurrent proofs get parallel helices (stacked along y, one per proof) instead of
being drawn on top of each other.
"""

from __future__ import annotations

import math

import numpy as np

from otel_proofscope.semconv import LAYER_KIND_COLOURS, LayerKind, layer_kind_colour

Vec3 = tuple[float, float, float]

X_STEP = 3.0
HELIX_RADIUS = 1.8
HELIX_TURN = 0.9
#: Distance between the helices of two proofs in one recording (stacked downwards).
PROOF_SPACING = 10.0

#: Vertical offset per layer kind, so the walk shows the circuit's "height".
KIND_Y: dict[str, float] = {
    LayerKind.MATMUL.value: 0.0,
    LayerKind.ACTIVATION.value: 1.8,
    LayerKind.LAYERNORM.value: -1.2,
    LayerKind.RMSNORM.value: -1.2,
    LayerKind.ATTENTION.value: 3.0,
    LayerKind.ADD.value: 0.8,
    LayerKind.MUL.value: 1.2,
    LayerKind.EMBEDDING.value: -2.5,
    LayerKind.DEQUANTIZE.value: -1.8,
    LayerKind.QUANTIZE.value: -1.8,
}

# 0xRRGGBBAA
CURSOR = 0x00E5FF70
PROVED = 0x00E676FF
FAILED = 0xFF3B3BFF
TRAIL = 0x00E676CC
EDGE = 0x4488CCAA
BACKBONE = 0x3C3E5A78
INVALID_ROUND = 0x9E9E9EFF

#: Bars of at most this many rounds are drawn per layer (the series keep every round).
MAX_BARS = 64
_BAR_SPAN = 2.4  # bars of one layer fan out over this width around the node
_BAR_BASE = 0.35
NODE_RADIUS = 0.22


def rgba(rgb: int, alpha: int = 0xFF) -> int:
    return ((rgb & 0xFFFFFF) << 8) | (alpha & 0xFF)


_KIND_RGB: dict[str, int] = {k.value: c for k, c in LAYER_KIND_COLOURS.items()}


def kind_rgba(kind: str, alpha: int = 0xFF) -> int:
    """Display colour of a layer kind (unknown kinds get the Unknown colour)."""
    rgb = _KIND_RGB.get(kind)
    return rgba(layer_kind_colour(kind) if rgb is None else rgb, alpha)


def helix(index: int) -> Vec3:
    angle = index * HELIX_TURN
    return (index * X_STEP, math.sin(angle) * HELIX_RADIUS, math.cos(angle) * HELIX_RADIUS)


def node_position(index: int, kind: str, offset: Vec3 = (0.0, 0.0, 0.0)) -> Vec3:
    x, y, z = helix(index)
    return (x + offset[0], y + KIND_Y.get(kind, 0.0) + offset[1], z + offset[2])


def node_radius(trace_cost: int | None) -> float:
    """World-unit radius growing with the log of the layer's trace cost."""
    if not trace_cost or trace_cost <= 0:
        return NODE_RADIUS
    return NODE_RADIUS + 0.04 * math.log10(1 + trace_cost)


#: The cursor is a translucent halo this much larger than the node it marks.
CURSOR_MARGIN = 0.3
#: Once a layer is proved (or failed) a translucent shell this much larger surrounds it.
SHELL_SCALE = 1.45
PROVED_SHELL = 0x00E67660
FAILED_SHELL = 0xFF3B3B60


def proof_offset(ordinal: int) -> Vec3:
    """Translation of the ``ordinal``-th proof of a recording (0 for the first)."""
    return (0.0, -PROOF_SPACING * ordinal, 0.0)


def bar_height(seconds: float) -> float:
    """Height of a round's bar: log-scaled wall time (1 µs → ~0.2, 1 s → ~3.8)."""
    us = max(seconds, 0.0) * 1e6
    return 0.2 + 0.6 * math.log10(1.0 + us)


def remaining_colour(remaining: int, total: int) -> int:
    """Blue while many sumcheck variables remain, red as they run out."""
    frac = 1.0 - (remaining / total if total > 0 else 0.0)
    frac = min(max(frac, 0.0), 1.0)
    r = int(45 + frac * 210)
    b = int(45 + (1.0 - frac) * 210)
    return (r << 24) | (0x55 << 16) | (b << 8) | 0xFF


def round_bar(index: int, kind: str, slot: int, slots: int, height: float) -> list[Vec3]:
    """A vertical bar for round ``slot`` of ``slots``, fanned out along x over the node."""
    x, y, z = node_position(index, kind)
    spacing = min(0.16, _BAR_SPAN / max(slots, 1))
    bx = x + (slot - (slots - 1) / 2.0) * spacing
    base = y + _BAR_BASE
    return [(bx, base, z), (bx, base + height, z)]


def bar_heights(seconds: np.ndarray) -> np.ndarray:
    """Vectorised :func:`bar_height`."""
    heights: np.ndarray = 0.2 + 0.6 * np.log10(1.0 + np.maximum(seconds, 0.0) * 1e6)
    return heights


def remaining_colours(remaining: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Vectorised :func:`remaining_colour` (0xRRGGBBAA, uint32)."""
    frac = 1.0 - np.divide(remaining, total, out=np.zeros(len(total)), where=total > 0)
    frac = np.clip(frac, 0.0, 1.0)
    r = (45 + frac * 210).astype(np.uint32)
    b = (45 + (1.0 - frac) * 210).astype(np.uint32)
    rgba_: np.ndarray = (r << 24) | np.uint32(0x55 << 16) | (b << 8) | np.uint32(0xFF)
    return rgba_


def round_bars(nodes: np.ndarray, slot: np.ndarray, slots: np.ndarray,
               heights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised :func:`round_bar` as boxes: (centres, half sizes), N×3 each."""
    spacing = np.minimum(0.16, _BAR_SPAN / np.maximum(slots, 1))
    centres = nodes.astype(np.float64).copy()
    centres[:, 0] += (slot - (slots - 1) / 2.0) * spacing
    centres[:, 1] += _BAR_BASE + heights / 2.0
    half = np.empty_like(centres)
    half[:, 0] = spacing * 0.35
    half[:, 1] = heights / 2.0
    half[:, 2] = spacing * 0.35
    return centres, half
