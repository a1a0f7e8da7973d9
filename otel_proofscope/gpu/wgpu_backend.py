"""wgpu backend: Vulkan, Metal, D3D12 and GL adapters through one code path.

The backend name (``gpu.backend``) comes from the adapter info (``vulkan``, ``metal``,
``d3d12``, ``gl``), so Metal on macOS is covered by the same code. WebGPU exposes no
device telemetry: utilization, occupancy, stall counters, memory, power and the rest
are reported as gaps (reason ``unsupported``). Kernel time is measured with timestamp
queries where the adapter has the ``timestamp-query`` feature.

wgpu 0.32 facts used here: ``queue.on_submitted_work_done_sync()`` raises TypeError, so
completion is awaited with ``wgpuDevicePoll(device, wait=true)``; the timestamp tick
period comes from ``wgpuQueueGetTimestampPeriod``. Both are wgpu-native calls reached
through ``wgpu.backends.wgpu_native._ffi``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry import metrics

from otel_proofscope.gpu.backend import (
    DEVICE_CAPABILITIES,
    PROFILER_CAPABILITIES,
    BackendUnavailable,
    DeviceIdentity,
    DeviceSample,
    Gap,
    HwState,
    vendor_name,
)
from otel_proofscope.gpu.dispatch import GpuRuntime
from otel_proofscope.gpu.evidence import EvidenceDedup
from otel_proofscope.semconv import GapReason, GpuCapability

_log = logging.getLogger("otel_proofscope.gpu")

BACKEND_WGPU = "wgpu"
TIMESTAMP_FEATURE = "timestamp-query"

_BACKEND_NAMES: Mapping[str, str] = {
    "vulkan": "vulkan",
    "metal": "metal",
    "d3d12": "d3d12",
    "d3d11": "d3d11",
    "opengl": "gl",
    "opengles": "gl",
    "gl": "gl",
    "browserwebgpu": "webgpu",
}

_GAP_DETAIL: Mapping[GpuCapability, str] = {
    GpuCapability.UTILIZATION: "WebGPU exposes no device utilization counter",
    GpuCapability.OCCUPANCY: "WebGPU exposes no GPU performance counters (occupancy)",
    GpuCapability.STALL_COUNTERS: "WebGPU exposes no GPU performance counters (stalls)",
    GpuCapability.MEMORY_USAGE: "WebGPU exposes no device memory usage (dispatch "
                                "accounting reports this process's own resident bytes)",
    GpuCapability.MEMORY_LIMIT: "WebGPU exposes no device memory size, only per-buffer "
                                "limits",
    GpuCapability.PCIE_IO: "WebGPU exposes no host-link byte counters",
    GpuCapability.ERRORS: "WebGPU exposes no hardware error counters",
    GpuCapability.POWER: "WebGPU exposes no power telemetry",
    GpuCapability.ENERGY: "WebGPU exposes no energy telemetry",
    GpuCapability.TEMPERATURE: "WebGPU exposes no temperature telemetry",
    GpuCapability.CLOCKS: "WebGPU exposes no clock telemetry",
}


def load_wgpu() -> Any:
    """The ``wgpu`` module, or BackendUnavailable when it is not installed."""
    try:
        import wgpu
    except ImportError as exc:
        raise BackendUnavailable(BACKEND_WGPU, GapReason.UNAVAILABLE,
                                 f"wgpu is not installed ({exc})") from None
    return wgpu


def backend_name(backend_type: str) -> str:
    """``gpu.backend`` from the adapter's ``backend_type`` (e.g. ``Vulkan`` → ``vulkan``)."""
    key = str(backend_type).replace(" ", "").replace("_", "").lower()
    return _BACKEND_NAMES.get(key, key or "unknown")


def adapter_identity(info: Mapping[str, Any]) -> DeviceIdentity:
    """Identity from a wgpu adapter info dict."""
    backend = backend_name(str(info.get("backend_type", "")))
    vendor_id = int(info.get("vendor_id") or 0)
    device_id = int(info.get("device_id") or 0)
    driver = str(info.get("description") or "")
    return DeviceIdentity(
        backend=backend,
        # WebGPU has no device UUID; backend + PCI ids is as unique as it gets.
        hw_id=f"wgpu:{backend}:{vendor_id:04x}:{device_id:04x}",
        name=str(info.get("device") or "unknown adapter"),
        vendor=vendor_name(vendor_id or None, str(info.get("vendor") or "")),
        driver_version=driver,
        pci_vendor_id=vendor_id,
        pci_device_id=device_id,
        software=str(info.get("adapter_type", "")).lower() == "cpu",
    )


def adapter_gaps(features: Iterable[str]) -> list[Gap]:
    """What a wgpu device cannot measure, given its enabled features."""
    gaps = [Gap(cap, GapReason.UNSUPPORTED, _GAP_DETAIL[cap])
            for cap in (*PROFILER_CAPABILITIES, *DEVICE_CAPABILITIES)]
    if TIMESTAMP_FEATURE not in set(features):
        gaps.insert(0, Gap(GpuCapability.KERNEL_TIMESTAMPS, GapReason.UNSUPPORTED,
                           f"adapter lacks the '{TIMESTAMP_FEATURE}' feature"))
    return gaps


class WgpuAdapterSource:
    """A wgpu adapter as a census entry: identity plus measured/gap capabilities."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self._identity = adapter_identity(adapter.info)
        self.features = frozenset(str(f) for f in adapter.features)

    @property
    def identity(self) -> DeviceIdentity:
        return self._identity

    def sample(self) -> DeviceSample:
        gaps = {g.capability: g for g in adapter_gaps(self.features)}
        measured = frozenset({GpuCapability.KERNEL_TIMESTAMPS}) - set(gaps)
        return DeviceSample(identity=self._identity, state=HwState.OK, measured=measured,
                            gaps=gaps)


class WgpuBackend:
    """Every adapter wgpu can enumerate."""

    name = BACKEND_WGPU

    def __init__(self, adapters: Sequence[Any]) -> None:
        self._sources = [WgpuAdapterSource(a) for a in adapters]

    @classmethod
    def open(cls, wgpu_module: Any = None) -> WgpuBackend:
        mod = wgpu_module if wgpu_module is not None else load_wgpu()
        try:
            adapters = list(mod.gpu.enumerate_adapters_sync())
        except Exception as exc:  # the native library can fail in many ways here
            raise BackendUnavailable(BACKEND_WGPU, GapReason.DRIVER_ERROR,
                                     f"adapter enumeration failed: {exc}") from None
        if not adapters:
            raise BackendUnavailable(BACKEND_WGPU, GapReason.UNAVAILABLE, "no adapter")
        return cls(adapters)

    def devices(self) -> Sequence[WgpuAdapterSource]:
        return self._sources

    def close(self) -> None:
        """Adapters need no explicit release."""


class WgpuDevice:
    """A wgpu device opened for compute, with the GpuRuntime that accounts for it."""

    def __init__(self, adapter: Any = None, *,
                 meter_provider: metrics.MeterProvider | None = None,
                 power_preference: str = "high-performance",
                 claims: EvidenceDedup | None = None, timestamps: bool = True) -> None:
        """``timestamps=False`` opens the device without ``timestamp-query`` even where
        the adapter has it (kernel time then becomes a gap)."""
        wgpu = load_wgpu()
        if adapter is None:
            try:
                adapter = wgpu.gpu.request_adapter_sync(power_preference=power_preference)
            except RuntimeError as exc:  # "Request adapter failed …"
                raise BackendUnavailable(BACKEND_WGPU, GapReason.UNAVAILABLE,
                                         str(exc)) from None
        self.adapter = adapter
        features = ([TIMESTAMP_FEATURE]
                    if timestamps and TIMESTAMP_FEATURE in adapter.features else [])
        self.device = adapter.request_device_sync(required_features=features)
        self.queue = self.device.queue
        self.timestamps = TIMESTAMP_FEATURE in self.device.features
        self.identity = adapter_identity(adapter.info)
        self.runtime = GpuRuntime(self.identity, gaps=adapter_gaps(self.device.features),
                                  meter_provider=meter_provider, claims=claims)
        from wgpu.backends.wgpu_native import _ffi

        self._ffi = _ffi

    def wait_idle(self) -> None:
        """Block until all submitted work on this device has completed."""
        self._ffi.lib.wgpuDevicePoll(self.device._internal, True, self._ffi.ffi.NULL)

    def timestamp_period_ns(self) -> float:
        """Nanoseconds per timestamp tick."""
        return float(self._ffi.lib.wgpuQueueGetTimestampPeriod(self.queue._internal))

    def destroy(self) -> None:
        """Release the device (any later use of it is a device-lost fault)."""
        self.device.destroy()
