"""NVML backend (``nvidia-ml-py``, module ``pynvml``): NVIDIA device telemetry.

Every field is read on its own, so one ``NotSupported`` field becomes a gap with a
reason while the others are still measured (OpenLIT's SDK returns 0 on any NVML
error; here a missing value is never a zero). ``GPU_IS_LOST`` marks the device failed:
its sample says so once with ``fault="gpu_is_lost"``, later samples report only the
failed state and driver-error gaps, and other devices are unaffected.

The module object is injected (default: the real ``pynvml``), which is how the tests
drive a faithful stand-in at exactly this boundary.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from otel_proofscope.extras import missing
from otel_proofscope.gpu.backend import (
    BACKEND_NVML,
    DEVICE_CAPABILITIES,
    BackendUnavailable,
    DeviceIdentity,
    DeviceSample,
    Gap,
    HwState,
    ProcessUsage,
    vendor_name,
)
from otel_proofscope.gpu.processes import ProcessWatch
from otel_proofscope.semconv import GapReason, GpuCapability

_log = logging.getLogger("otel_proofscope.gpu")

T = TypeVar("T")

#: ``error.type`` values of ``hw.errors``.
ECC_CORRECTED = "ecc_corrected"
ECC_UNCORRECTED = "ecc_uncorrected"

PROFILER_GAP_DETAIL = ("NVML exposes no SM occupancy or stall counters; they need a "
                       "profiler (CUPTI / DCGM profiling metrics)")


def load_pynvml() -> Any:
    """The real ``pynvml`` module, or BackendUnavailable when it is not installed."""
    try:
        import pynvml
    except ImportError as exc:
        raise BackendUnavailable(BACKEND_NVML, GapReason.UNAVAILABLE,
                                 missing("nvidia-ml-py", "nvml", exc)) from None
    return pynvml


def error_name(exc: BaseException) -> str:
    """``LibraryNotFound`` for ``NVMLError_LibraryNotFound`` and so on."""
    return type(exc).__name__.removeprefix("NVMLError_")


def gap_reason(nvml: Any, code: int) -> GapReason:
    """The gap reason for an NVML return code."""
    if code in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
        return GapReason.UNSUPPORTED
    if code == nvml.NVML_ERROR_NO_PERMISSION:
        return GapReason.PERMISSION_DENIED
    if code == nvml.NVML_ERROR_UNINITIALIZED:
        return GapReason.NOT_INITIALIZED
    if code in (nvml.NVML_ERROR_LIBRARY_NOT_FOUND, nvml.NVML_ERROR_DRIVER_NOT_LOADED):
        return GapReason.UNAVAILABLE
    return GapReason.DRIVER_ERROR


class _Lost(Exception):
    pass


class NvmlBackend:
    """All NVIDIA devices NVML can see."""

    name = BACKEND_NVML

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self._devices: list[NvmlDevice] | None = None
        self._closed = False

    @classmethod
    def open(cls, nvml: Any = None) -> NvmlBackend:
        """Initialise NVML; raises BackendUnavailable (reason + NVML error name)."""
        mod = nvml if nvml is not None else load_pynvml()
        try:
            mod.nvmlInit()
        except mod.NVMLError as exc:
            raise BackendUnavailable(BACKEND_NVML, gap_reason(mod, exc.value),
                                     error_name(exc)) from None
        return cls(mod)

    def driver_version(self) -> str:
        try:
            return str(self.nvml.nvmlSystemGetDriverVersion())
        except self.nvml.NVMLError:
            return ""

    def devices(self) -> Sequence[NvmlDevice]:
        if self._devices is None:
            nvml = self.nvml
            try:
                count = int(nvml.nvmlDeviceGetCount())
            except nvml.NVMLError as exc:
                _log.warning("NVML device count failed: %s", error_name(exc))
                count = 0
            driver = self.driver_version()
            devs: list[NvmlDevice] = []
            for i in range(count):
                try:
                    handle = nvml.nvmlDeviceGetHandleByIndex(i)
                except nvml.NVMLError as exc:
                    _log.warning("NVML device %d unavailable: %s", i, error_name(exc))
                    continue
                dev = NvmlDevice(nvml, i, handle, driver)
                devs.append(dev)
                devs += self._mig_instances(dev, driver)
            self._devices = devs
        return self._devices

    def _mig_instances(self, parent: NvmlDevice, driver: str) -> list[NvmlDevice]:
        """The MIG instances of ``parent``, each its own device with ``hw.parent``.

        A GPU without MIG raises NotSupported from ``nvmlDeviceGetMigMode``; an empty
        slot raises NotFound from ``nvmlDeviceGetMigDeviceHandleByIndex``.
        """
        nvml, h = self.nvml, parent.handle
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(h)
        except nvml.NVMLError:
            return []
        if int(current) != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        try:
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))
        except nvml.NVMLError as exc:
            _log.warning("NVML: MIG is on for %s but its instances cannot be counted: %s",
                         parent.identity.hw_id, error_name(exc))
            return []
        out: list[NvmlDevice] = []
        for j in range(slots):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except nvml.NVMLError as exc:
                if exc.value != nvml.NVML_ERROR_NOT_FOUND:
                    _log.warning("NVML: MIG instance %d of %s unavailable: %s", j,
                                 parent.identity.hw_id, error_name(exc))
                continue
            out.append(NvmlDevice(nvml, parent.index, mig, driver, parent=parent.identity,
                                  mig_index=j))
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            _log.debug("nvmlShutdown: %s", error_name(exc))


class NvmlDevice:
    """One NVIDIA device; ``sample()`` reads every field once."""

    def __init__(self, nvml: Any, index: int, handle: Any, driver_version: str, *,
                 parent: DeviceIdentity | None = None, mig_index: int | None = None) -> None:
        self.nvml = nvml
        self.index = index
        self.handle = handle
        self.parent = parent
        self.mig_index = mig_index
        self._lost = False
        self._lost_reported = False
        #: NVML timestamp (µs) of the last process-utilization sample seen.
        self._util_seen_us = 0
        self._identity = self._read_identity(driver_version)

    @property
    def identity(self) -> DeviceIdentity:
        return self._identity

    @property
    def lost(self) -> bool:
        return self._lost

    def _read_identity(self, driver_version: str) -> DeviceIdentity:
        nvml, h = self.nvml, self.handle

        def get(fn: Callable[[], T], default: T) -> T:
            try:
                return fn()
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                    self._lost = True
                return default

        label = (f"NVIDIA GPU {self.index}" if self.mig_index is None
                 else f"NVIDIA GPU {self.index} MIG {self.mig_index}")
        name = str(get(lambda: nvml.nvmlDeviceGetName(h), label))
        uuid = str(get(lambda: nvml.nvmlDeviceGetUUID(h), ""))
        fallback_id = (f"nvml-index-{self.index}" if self.mig_index is None
                       else f"nvml-index-{self.index}-mig-{self.mig_index}")
        pci = get(lambda: nvml.nvmlDeviceGetPciInfo(h), None)
        vendor_id = device_id = None
        if pci is not None:
            # pciDeviceId packs the device id in the high 16 bits, the vendor in the low.
            vendor_id = int(pci.pciDeviceId) & 0xFFFF
            device_id = (int(pci.pciDeviceId) >> 16) & 0xFFFF
        return DeviceIdentity(
            backend=BACKEND_NVML,
            hw_id=uuid or fallback_id,
            name=name,
            vendor=vendor_name(vendor_id, "NVIDIA"),
            driver_version=driver_version,
            pci_vendor_id=vendor_id,
            pci_device_id=device_id,
            parent_hw_id=self.parent.hw_id if self.parent is not None else None,
        )

    def sample(self) -> DeviceSample:
        if self._lost:
            return self._lost_sample()
        r = _Reader(self.nvml)
        h, nvml = self.handle, self.nvml
        try:
            util = r.read(GpuCapability.UTILIZATION,
                          lambda: nvml.nvmlDeviceGetUtilizationRates(h))
            mem = r.read((GpuCapability.MEMORY_USAGE, GpuCapability.MEMORY_LIMIT),
                         lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            io = r.read(GpuCapability.PCIE_IO, lambda: self._pcie_counters(r))
            ecc = r.read(GpuCapability.ERRORS, lambda: self._ecc())
            power = r.read(GpuCapability.POWER, lambda: nvml.nvmlDeviceGetPowerUsage(h))
            energy = r.read(GpuCapability.ENERGY,
                            lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            temp = r.read(GpuCapability.TEMPERATURE,
                          lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
            clocks = r.read(GpuCapability.CLOCKS, lambda: (
                nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)))
        except _Lost:
            self._lost = True
            return self._lost_sample()
        state = HwState.DEGRADED if ecc and ecc[ECC_UNCORRECTED] > 0 else HwState.OK
        for cap in (GpuCapability.OCCUPANCY, GpuCapability.STALL_COUNTERS):
            r.gaps[cap] = Gap(cap, GapReason.UNSUPPORTED, PROFILER_GAP_DETAIL)
        return DeviceSample(
            identity=self._identity,
            state=state,
            utilization=None if util is None else int(util.gpu) / 100.0,
            memory_used=None if mem is None else int(mem.used),
            memory_limit=None if mem is None else int(mem.total),
            io_transmit=None if io is None else io[0],
            io_receive=None if io is None else io[1],
            errors=ecc or {},
            power_w=None if power is None else int(power) / 1000.0,
            energy_j=None if energy is None else int(energy) / 1000.0,
            temperature_c=None if temp is None else float(temp),
            clock_sm_hz=None if clocks is None else int(clocks[0]) * 1e6,
            clock_memory_hz=None if clocks is None else int(clocks[1]) * 1e6,
            measured=frozenset(r.measured),
            gaps=dict(r.gaps),
        )

    def sample_processes(self, watch: ProcessWatch
                         ) -> tuple[tuple[ProcessUsage, ...], dict[GpuCapability, Gap]]:
        """The watched processes' memory and SM utilization on this device.

        Memory from ``nvmlDeviceGetComputeRunningProcesses`` and
        ``nvmlDeviceGetGraphicsRunningProcesses`` (a Vulkan / wgpu prover may be listed as
        a graphics process; ``usedGpuMemory`` is None where the driver cannot tell, e.g.
        Windows WDDM); utilization from
        ``nvmlDeviceGetProcessUtilization`` since the last call, averaged per process
        (NotFound there means no sample in the interval: no value, not a zero).
        A failed query is a gap (e.g. NoPermission in a restricted container).
        """
        if self._lost:
            return (), {}
        r = _Reader(self.nvml)
        h = self.handle
        try:
            procs = r.read(GpuCapability.PROCESS_MEMORY, lambda: self._running_processes(h))
            samples = self._process_samples(r)
        except _Lost:
            self._lost = True
            return (), {}
        memory: dict[int, int | None] = {}
        for p in procs or ():
            used = getattr(p, "usedGpuMemory", None)
            memory[int(p.pid)] = None if used is None else int(used)
        util: dict[int, list[int]] = {}
        for smp in samples or ():
            util.setdefault(int(smp.pid), []).append(int(smp.smUtil))
        mine = watch.watched(set(memory) | set(util))
        out = tuple(ProcessUsage(
            pid, memory.get(pid),
            (sum(util[pid]) / len(util[pid]) / 100.0) if util.get(pid) else None)
            for pid in sorted(mine))
        return out, dict(r.gaps)

    def _running_processes(self, h: Any) -> list[Any]:
        """Compute and graphics processes, one entry per pid (a process using both is
        listed twice by NVML, with the same memory figure)."""
        nvml = self.nvml
        procs = list(nvml.nvmlDeviceGetComputeRunningProcesses(h))
        try:
            graphics = list(nvml.nvmlDeviceGetGraphicsRunningProcesses(h))
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            graphics = []  # compute alone still answers the question
        seen = {int(p.pid) for p in procs}
        return procs + [p for p in graphics if int(p.pid) not in seen]

    def _process_samples(self, r: _Reader) -> list[Any] | None:
        nvml = self.nvml

        def query() -> list[Any]:
            try:
                got = list(nvml.nvmlDeviceGetProcessUtilization(self.handle,
                                                                 self._util_seen_us))
            except nvml.NVMLError as exc:
                if exc.value == nvml.NVML_ERROR_NOT_FOUND:
                    return []  # no sample newer than the last one
                raise
            if got:
                self._util_seen_us = max(int(s.timeStamp) for s in got)
            return got

        return r.read(GpuCapability.PROCESS_UTILIZATION, query)

    def _pcie_counters(self, r: _Reader) -> tuple[int, int]:
        """Cumulative PCIe bytes. Only NVML's cumulative counters are used: the rate from
        nvmlDeviceGetPcieThroughput covers a 20 ms window and cannot be integrated."""
        nvml = self.nvml
        values = nvml.nvmlDeviceGetFieldValues(
            self.handle, [nvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                          nvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES])
        out: list[int] = []
        for v in values:
            code = int(v.nvmlReturn)
            if code != nvml.NVML_SUCCESS:
                raise nvml.NVMLError(code)
            out.append(int(v.value.ullVal))
        return out[0], out[1]

    def _ecc(self) -> dict[str, int]:
        nvml, h = self.nvml, self.handle
        return {
            ECC_CORRECTED: int(nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, nvml.NVML_VOLATILE_ECC)),
            ECC_UNCORRECTED: int(nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC)),
        }

    def _lost_sample(self) -> DeviceSample:
        first = not self._lost_reported
        self._lost_reported = True
        gaps = {cap: Gap(cap, GapReason.DRIVER_ERROR, "GPU is lost (NVML_ERROR_GPU_IS_LOST)")
                for cap in DEVICE_CAPABILITIES}
        return DeviceSample(identity=self._identity, state=HwState.FAILED, gaps=gaps,
                            fault="gpu_is_lost" if first else None)


class _Reader:
    """Reads one field, turning an NVML error into a gap (or _Lost for GPU_IS_LOST)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.measured: set[GpuCapability] = set()
        self.gaps: dict[GpuCapability, Gap] = {}

    def read(self, caps: GpuCapability | tuple[GpuCapability, ...],
             fn: Callable[[], T]) -> T | None:
        caps_t = caps if isinstance(caps, tuple) else (caps,)
        nvml = self.nvml
        try:
            value = fn()
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_GPU_IS_LOST:
                raise _Lost from None
            reason = gap_reason(nvml, exc.value)
            for cap in caps_t:
                self.gaps[cap] = Gap(cap, reason, f"NVML: {error_name(exc)}")
            return None
        self.measured.update(caps_t)
        return value
