"""Census: which GPU backends this machine has, who each device is, what is measured.

Every backend is probed once: NVML devices are sampled once field by field, wgpu
adapters are enumerated (no device is opened). The result says, per device, which
capabilities are measured and which are gaps and why — the same gaps a run reports.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_proofscope.gpu.backend import BackendUnavailable, DeviceSample, GpuBackend
from otel_proofscope.semconv import GpuCapability

#: What the dispatch runtime measures on every backend (not a device capability).
DISPATCH_ACCOUNTING = ("gpu.dispatch.count, gpu.upload.*, gpu.readback.*, "
                       "gpu.submit.duration, gpu.alloc.*, gpu.free.size, gpu.memory.resident*, "
                       "gpu.fault/retry/recovery/residual_batch counts")


@dataclass
class CensusBackend:
    name: str
    available: bool
    reason: str | None = None
    detail: str | None = None
    devices: list[DeviceSample] = field(default_factory=list)


def take_census(*, nvml: Any = None, wgpu_module: Any = None, include_nvml: bool = True,
                include_wgpu: bool = True) -> list[CensusBackend]:
    """Probe every backend once. ``nvml`` / ``wgpu_module`` inject stand-ins (tests)."""
    from otel_proofscope.gpu.nvml import NvmlBackend
    from otel_proofscope.gpu.wgpu_backend import WgpuBackend

    out: list[CensusBackend] = []
    if include_nvml:
        out.append(_probe("nvml", lambda: NvmlBackend.open(nvml)))
    if include_wgpu:
        out.append(_probe("wgpu", lambda: WgpuBackend.open(wgpu_module)))
    return out


def _probe(name: str, opener: Any) -> CensusBackend:
    try:
        backend: GpuBackend = opener()
    except BackendUnavailable as exc:
        return CensusBackend(name, False, exc.reason.value, exc.detail)
    try:
        return CensusBackend(name, True, devices=[d.sample() for d in backend.devices()])
    finally:
        backend.close()


def _ordered(caps: Any) -> list[GpuCapability]:
    order = list(GpuCapability)
    return sorted(caps, key=order.index)


def census_dict(census: list[CensusBackend]) -> dict[str, Any]:
    """The census as plain JSON-able data (``proofscope gpu --json``)."""
    backends = []
    for b in census:
        devices = []
        for s in b.devices:
            i = s.identity
            devices.append({
                "hw_id": i.hw_id, "name": i.name, "backend": i.backend, "vendor": i.vendor,
                "driver_version": i.driver_version, "pci_vendor_id": i.pci_vendor_id,
                "pci_device_id": i.pci_device_id, "software": i.software,
                "parent_hw_id": i.parent_hw_id,
                "state": s.state.value,
                "measured": [c.value for c in _ordered(s.measured)],
                "gaps": [{"capability": c.value, "reason": s.gaps[c].reason.value,
                          "detail": s.gaps[c].detail} for c in _ordered(s.gaps)],
            })
        backends.append({"name": b.name, "available": b.available, "reason": b.reason,
                         "detail": b.detail, "devices": devices})
    return {"backends": backends, "dispatch_accounting": DISPATCH_ACCOUNTING}


def census_json(census: list[CensusBackend]) -> str:
    return json.dumps(census_dict(census), indent=2)


def render_table(census: list[CensusBackend]) -> str:
    """The census as a plain-text table."""
    lines = ["GPU backends", ""]
    rows = [("backend", "status", "detail")]
    for b in census:
        if b.available:
            rows.append((b.name, "available", f"{len(b.devices)} device(s)"))
        elif b.reason in (None, "unavailable"):  # the status already says it
            rows.append((b.name, "unavailable", b.detail or "no reason given"))
        else:
            rows.append((b.name, "unavailable", f"{b.reason}: {b.detail or '?'}"))
    lines += _table(rows)
    for b in census:
        for s in b.devices:
            i = s.identity
            pci = "pci " + ":".join("?" if v is None else f"{v:#06x}"
                                    for v in (i.pci_vendor_id, i.pci_device_id))
            lines += ["", f"{i.hw_id} — {i.name}",
                      f"  backend {i.backend} · vendor {i.vendor} · {pci} · driver "
                      f"{i.driver_version or '?'}{' · software' if i.software else ''} · "
                      f"state {s.state.value}"
                      + (f" · MIG instance of {i.parent_hw_id}" if i.parent_hw_id else "")]
            caps = [("  capability", "status", "reason", "detail")]
            caps += [(f"  {c.value}", "measured", "", "") for c in _ordered(s.measured)]
            caps += [(f"  {c.value}", "gap", s.gaps[c].reason.value, s.gaps[c].detail)
                     for c in _ordered(s.gaps)]
            lines += _table(caps)
    if not any(b.devices for b in census):
        lines += ["", "No GPU found: a proof here runs on the CPU and emits no gpu.* telemetry."]
    else:
        lines += ["", f"Dispatch accounting, measured on every backend: {DISPATCH_ACCOUNTING}."]
    return "\n".join(lines)


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]
