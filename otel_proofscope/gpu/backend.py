"""The one interface every GPU backend fits: identity, capability gaps, device samples.

A backend (NVML, wgpu) turns its own vocabulary into these types, so everything
downstream (the sampler's instruments, dispatch accounting, evidence events, the
census) is written once. A value a backend cannot give is a :class:`Gap` with a
reason, never a zero.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from opentelemetry.util.types import AttributeValue

from otel_proofscope.semconv import Attr, GapReason, GpuCapability

#: ``gpu.backend`` of devices sampled through NVML.
BACKEND_NVML = "nvml"
#: ``gpu.backend`` of a CUDA dispatch runtime (a user's own CUDA code).
BACKEND_CUDA = "cuda"

#: Capabilities a device sampler may measure (the ``hw.*`` instruments).
DEVICE_CAPABILITIES: tuple[GpuCapability, ...] = (
    GpuCapability.UTILIZATION,
    GpuCapability.MEMORY_USAGE,
    GpuCapability.MEMORY_LIMIT,
    GpuCapability.PCIE_IO,
    GpuCapability.ERRORS,
    GpuCapability.POWER,
    GpuCapability.ENERGY,
    GpuCapability.TEMPERATURE,
    GpuCapability.CLOCKS,
)

#: Profiling counters that need a vendor profiler (CUPTI, Metal counters, …); neither
#: NVML nor wgpu exposes them.
PROFILER_CAPABILITIES: tuple[GpuCapability, ...] = (
    GpuCapability.OCCUPANCY,
    GpuCapability.STALL_COUNTERS,
)

#: Well-known PCI vendor ids → ``hw.vendor``.
PCI_VENDORS: Mapping[int, str] = {
    0x10DE: "NVIDIA",
    0x1002: "AMD",
    0x1022: "AMD",
    0x8086: "Intel",
    0x106B: "Apple",
    0x13B5: "ARM",
    0x5143: "Qualcomm",
    0x1010: "Imagination",
    0x10005: "Mesa",  # Khronos-registered id Mesa's software drivers report
}


class HwState(StrEnum):
    """``hw.state`` values this package emits (OTel hardware semconv)."""

    OK = "ok"
    DEGRADED = "degraded"
    FAILED = "failed"


class BackendUnavailable(Exception):
    """A backend cannot be opened at all (no library, no driver, no adapter)."""

    def __init__(self, backend: str, reason: GapReason, detail: str) -> None:
        super().__init__(f"{backend} unavailable: {detail}")
        self.backend = backend
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class DeviceIdentity:
    """Who a device is. ``hw_id`` is stable for the device across samples."""

    backend: str
    hw_id: str
    name: str
    vendor: str
    driver_version: str
    pci_vendor_id: int | None = None
    pci_device_id: int | None = None
    software: bool = False
    #: ``hw.id`` of the physical device this one is a slice of (a MIG instance).
    parent_hw_id: str | None = None

    def hw_attributes(self) -> dict[str, AttributeValue]:
        """Attributes of every ``hw.*`` data point of this device."""
        attrs: dict[str, AttributeValue] = {
            Attr.HW_ID: self.hw_id,
            Attr.HW_TYPE: "gpu",
            Attr.HW_NAME: self.name,
            Attr.HW_VENDOR: self.vendor,
            Attr.HW_DRIVER_VERSION: self.driver_version,
        }
        if self.parent_hw_id is not None:
            attrs[Attr.HW_PARENT] = self.parent_hw_id
        return attrs

    def dispatch_attributes(self) -> dict[str, AttributeValue]:
        """Attributes of every dispatch-accounting data point."""
        return {Attr.GPU_BACKEND: self.backend, Attr.HW_ID: self.hw_id}

    def event_attributes(self) -> dict[str, AttributeValue]:
        """Attributes of the ``gpu.adapter.acquired`` event."""
        attrs: dict[str, AttributeValue] = {Attr.GPU_BACKEND: self.backend,
                                            **self.hw_attributes()}
        if self.pci_vendor_id is not None:
            attrs[Attr.GPU_PCI_VENDOR_ID] = self.pci_vendor_id
        if self.pci_device_id is not None:
            attrs[Attr.GPU_PCI_DEVICE_ID] = self.pci_device_id
        return attrs


@dataclass(frozen=True)
class Gap:
    """A capability a backend cannot give for a device, and why."""

    capability: GpuCapability
    reason: GapReason
    detail: str = ""


@dataclass(frozen=True)
class ProcessUsage:
    """One watched process on one device. ``None``: not reported for this interval."""

    pid: int
    memory_used: int | None = None
    sm_utilization: float | None = None  # 0…1, mean over the interval's samples


@dataclass(frozen=True)
class DeviceSample:
    """One reading of one device. ``None`` means not measured (see ``gaps``)."""

    identity: DeviceIdentity
    state: HwState = HwState.OK
    utilization: float | None = None
    memory_used: int | None = None
    memory_limit: int | None = None
    io_transmit: int | None = None
    io_receive: int | None = None
    errors: Mapping[str, int] = field(default_factory=dict)
    power_w: float | None = None
    energy_j: float | None = None
    temperature_c: float | None = None
    clock_sm_hz: float | None = None
    clock_memory_hz: float | None = None
    measured: frozenset[GpuCapability] = frozenset()
    gaps: Mapping[GpuCapability, Gap] = field(default_factory=dict)
    #: The watched processes' usage of this device (NVML per-process queries).
    processes: tuple[ProcessUsage, ...] = ()
    #: Fault kind when this reading found the device faulted (e.g. ``gpu_is_lost``).
    fault: str | None = None
    taken_at: float = field(default_factory=time.time)


class DeviceSource(Protocol):
    """One device a sampler can read."""

    @property
    def identity(self) -> DeviceIdentity: ...

    def sample(self) -> DeviceSample:
        """Read every field once. Never raises for a per-field failure (that is a gap)."""
        ...


class GpuBackend(Protocol):
    """A source of devices (NVML, wgpu adapters)."""

    name: str

    def devices(self) -> Sequence[DeviceSource]: ...

    def close(self) -> None: ...


def vendor_name(pci_vendor_id: int | None, fallback: str = "") -> str:
    """``hw.vendor`` from a PCI vendor id, else the backend's own vendor string."""
    if pci_vendor_id is not None and pci_vendor_id in PCI_VENDORS:
        return PCI_VENDORS[pci_vendor_id]
    return fallback or (f"0x{pci_vendor_id:04x}" if pci_vendor_id else "unknown")
