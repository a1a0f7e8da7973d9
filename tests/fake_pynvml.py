"""A stand-in for ``pynvml`` at exactly the boundary ``otel_proofscope.gpu.nvml`` uses.

No NVIDIA driver exists on CI machines, so the NVML backend is driven through this
object instead of the real module. It is faithful where it matters:

* the same function names and parameters as ``pynvml`` (a test checks them against the
  real module's signatures);
* the same return types: the real ctypes structures (``c_nvmlMemory_t`` with
  ``.total/.free/.used``, ``c_nvmlUtilization_t`` with ``.gpu/.memory``,
  ``nvmlPciInfo_t``, arrays of ``c_nvmlFieldValue_t`` with a per-field
  ``nvmlReturn``), ``str`` for names, plain ``int`` for scalars, in NVML's units
  (mW, mJ, °C, MHz, bytes);
* the real error classes: errors are raised as ``pynvml.NVMLError(code)``, which the
  real module maps to ``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``,
  ``NVMLError_Uninitialized``, ``NVMLError_LibraryNotFound`` …;
* NVML's lifecycle: device calls before ``nvmlInit`` raise ``Uninitialized``; a missing
  library makes ``nvmlInit`` raise ``LibraryNotFound``; init/shutdown are ref-counted.

Per-device knobs make a field NotSupported (or any error), or lose the GPU mid-run.
Constants (``NVML_*``) and error classes are the real module's.

Energy, processes and MIG follow the real library too: the energy counter is mJ since
driver load (``nvmlDeviceGetTotalEnergyConsumption``); running processes come back as
``nvmlFriendlyObject`` s built from ``c_nvmlProcessInfo_v3_t`` with ``usedGpuMemory``
None where NVML says "not available"; ``nvmlDeviceGetProcessUtilization(handle, ts)``
returns the ``c_nvmlProcessUtilizationSample_t`` newer than ``ts`` (µs) and raises
NotFound when there is none; a GPU without MIG raises NotSupported from
``nvmlDeviceGetMigMode``, an empty MIG slot NotFound from
``nvmlDeviceGetMigDeviceHandleByIndex``; a MIG instance (``FakeGpu.mig_instance``)
answers NotSupported for utilization, power, energy and the other whole-GPU readings,
as the driver does.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real


@dataclass
class FakeGpu:
    """One simulated device; mutate it between samples to change readings."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-6f1e9a52-3c1b-4f0e-9a55-2d4b7c1e0a11"
    pci_device_id: int = 0x233010DE  # device 0x2330, vendor 0x10DE
    bus_id: str = "00000000:41:00.0"
    memory_total: int = 80 * 1024**3
    memory_used: int = 12 * 1024**3
    util_gpu: int = 87  # percent
    util_memory: int = 41  # percent (memory-controller activity, not occupancy)
    power_mw: int = 412_345
    energy_mj: int = 9_876_543_210
    temperature_c: int = 63
    clock_sm_mhz: int = 1980
    clock_mem_mhz: int = 2619
    pcie_tx_bytes: int = 123_456_789
    pcie_rx_bytes: int = 987_654_321
    ecc_corrected: int = 3
    ecc_uncorrected: int = 0
    #: function name → NVML error code it returns (e.g. NVML_ERROR_NOT_SUPPORTED)
    errors: dict[str, int] = field(default_factory=dict)
    #: NVML field id → per-field return code in nvmlDeviceGetFieldValues
    field_returns: dict[int, int] = field(default_factory=dict)
    #: every call on this device raises NVML_ERROR_GPU_IS_LOST
    lost: bool = False
    #: (pid, used bytes or None for NVML_VALUE_NOT_AVAILABLE) of running compute processes
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    #: the same for graphics processes (Vulkan, e.g. wgpu, may be listed here)
    graphics_processes: list[tuple[int, int | None]] = field(default_factory=list)
    #: (pid, timeStamp µs, smUtil %, memUtil %) utilization samples NVML has buffered
    process_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: current MIG mode (NVML_DEVICE_MIG_ENABLE/DISABLE); None: the GPU has no MIG
    mig_mode: int | None = None
    max_mig_devices: int = 7
    #: MIG slots: an instance, or None for an empty slot
    mig_devices: list[FakeGpu | None] = field(default_factory=list)

    @classmethod
    def mig_instance(cls, uuid: str, name: str, memory_total: int,
                     memory_used: int = 0) -> FakeGpu:
        """A MIG instance: whole-GPU readings are NotSupported on its handle."""
        ns = _real.NVML_ERROR_NOT_SUPPORTED
        return cls(name=name, uuid=uuid, memory_total=memory_total, memory_used=memory_used,
                   errors={fn: ns for fn in (
                       "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage",
                       "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature",
                       "nvmlDeviceGetClockInfo", "nvmlDeviceGetTotalEccErrors",
                       "nvmlDeviceGetFieldValues", "nvmlDeviceGetProcessUtilization",
                       "nvmlDeviceGetMigMode")})


class FakeHandle:
    """Opaque device handle (the real one is a ctypes pointer)."""

    def __init__(self, index: int, mig: int | None = None) -> None:
        self.index = index
        self.mig = mig

    def __repr__(self) -> str:
        return f"<FakeHandle {self.index}{'' if self.mig is None else f'/mig {self.mig}'}>"


class FakeNvml:
    """Module-like object exposing the pynvml API over simulated devices."""

    NVMLError = _real.NVMLError

    def __init__(self, gpus: list[FakeGpu] | None = None, *, library_found: bool = True,
                 driver_version: str = "550.54.15") -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.library_found = library_found
        self.driver_version = driver_version
        self.refcount = 0
        self.calls: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        # Constants and error classes come from the real module.
        if name.startswith(("NVML_", "NVMLError")):
            return getattr(_real, name)
        raise AttributeError(name)

    # ── lifecycle ────────────────────────────────────────────────────────────────────

    def nvmlInit(self) -> None:
        self.calls["nvmlInit"] += 1
        if not self.library_found:
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.refcount += 1

    def nvmlShutdown(self) -> None:
        self.calls["nvmlShutdown"] += 1
        self._check_init()
        self.refcount -= 1

    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle: FakeHandle, fn: str) -> FakeGpu:
        self.calls[fn] += 1
        self._check_init()
        gpu = self.gpus[handle.index]
        if gpu.lost:  # a lost GPU takes its MIG instances with it
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        if handle.mig is not None:
            mig = gpu.mig_devices[handle.mig]
            assert mig is not None, "handle of an empty MIG slot"
            gpu = mig
        if fn in gpu.errors:
            raise _real.NVMLError(gpu.errors[fn])
        return gpu

    # ── system and enumeration ───────────────────────────────────────────────────────

    def nvmlSystemGetDriverVersion(self) -> str:
        self.calls["nvmlSystemGetDriverVersion"] += 1
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self.calls["nvmlDeviceGetCount"] += 1
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self.calls["nvmlDeviceGetHandleByIndex"] += 1
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # ── identity ─────────────────────────────────────────────────────────────────────

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        info = _real.nvmlPciInfo_t()
        info.busId = gpu.bus_id.encode()
        info.busIdLegacy = gpu.bus_id.encode()[:15]
        info.pciDeviceId = gpu.pci_device_id
        return info

    # ── readings ─────────────────────────────────────────────────────────────────────

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        util = _real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu, gpu.util_memory
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: Any = None) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        mem = _real.c_nvmlMemory_t()
        mem.total, mem.used = gpu.memory_total, gpu.memory_used
        mem.free = gpu.memory_total - gpu.memory_used
        return mem

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: list[int]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (_real.c_nvmlFieldValue_t * len(fieldIds))()
        known = {
            _real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: gpu.pcie_tx_bytes,
            _real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: gpu.pcie_rx_bytes,
        }
        for i, fid in enumerate(fieldIds):
            values[i].fieldId = fid
            code = gpu.field_returns.get(
                fid, _real.NVML_SUCCESS if fid in known else _real.NVML_ERROR_NOT_SUPPORTED)
            values[i].nvmlReturn = code
            if code == _real.NVML_SUCCESS:
                values[i].valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                values[i].value.ullVal = known[fid]
        return values

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, errorType: int,
                                    counterType: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTotalEccErrors")
        if errorType == _real.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_corrected
        if errorType == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return gpu.ecc_uncorrected
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        return self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature_c

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type == _real.NVML_CLOCK_SM:
            return gpu.clock_sm_mhz
        if type == _real.NVML_CLOCK_MEM:
            return gpu.clock_mem_mhz
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    # ── processes ────────────────────────────────────────────────────────────────────

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetComputeRunningProcesses")
        return _process_infos(gpu.processes)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return _process_infos(gpu.graphics_processes)

    def nvmlDeviceGetProcessUtilization(self, handle: FakeHandle, timeStamp: int) -> list[Any]:
        gpu = self._gpu(handle, "nvmlDeviceGetProcessUtilization")
        newer = [s for s in gpu.process_samples if s[1] > timeStamp]
        if not newer:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        samples = (_real.c_nvmlProcessUtilizationSample_t * len(newer))()
        for i, (pid, ts, sm, mem) in enumerate(newer):
            samples[i].pid, samples[i].timeStamp = pid, ts
            samples[i].smUtil, samples[i].memUtil = sm, mem
        return samples[0:len(newer)]

    # ── MIG ──────────────────────────────────────────────────────────────────────────

    def nvmlDeviceGetMigMode(self, device: FakeHandle) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        if gpu.mig_mode is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return [gpu.mig_mode, gpu.mig_mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: FakeHandle) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        if gpu.mig_mode is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: FakeHandle, index: int) -> FakeHandle:
        gpu = self._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if device.mig is not None or not 0 <= index < gpu.max_mig_devices:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.mig_mode is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if (gpu.mig_mode != _real.NVML_DEVICE_MIG_ENABLE or index >= len(gpu.mig_devices)
                or gpu.mig_devices[index] is None):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return FakeHandle(device.index, index)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, migDevice: FakeHandle) -> FakeHandle:
        self._gpu(migDevice, "nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if migDevice.mig is None:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(migDevice.index)


def _process_infos(entries: list[tuple[int, int | None]]) -> list[Any]:
    """What the real wrapper returns: friendly objects from ``c_nvmlProcessInfo_v3_t``,
    ``usedGpuMemory`` None where NVML says the value is not available."""
    out = []
    for pid, used in entries:
        info = _real.c_nvmlProcessInfo_v3_t()
        info.pid = pid
        info.usedGpuMemory = (_real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
                              if used is None else used)
        obj = _real.nvmlStructToFriendlyObject(info)
        if obj.usedGpuMemory == _real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value:
            obj.usedGpuMemory = None
        out.append(obj)
    return out


#: The pynvml functions this stand-in implements (checked against the real module).
IMPLEMENTED = tuple(n for n in vars(FakeNvml) if n.startswith("nvml"))
