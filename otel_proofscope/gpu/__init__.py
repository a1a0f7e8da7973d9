"""GPU telemetry: NVML and wgpu backends, one normalized instrument set, capability gaps.

Entry points:

* :func:`start_sampler` — sample every NVIDIA device (NVML) on a background thread into
  the ``hw.gpu.*`` / ``hw.*`` observable instruments; None when there is no device.
* :class:`GpuRuntime` — dispatch accounting for code that runs kernels
  (``with runtime.dispatch() as d: …``); emits adapter identity and capability gaps on
  the active span at its first dispatch.
* :func:`take_census` — which backends and devices exist, what is measured, what is a gap.

Importing this package imports neither ``pynvml`` nor ``wgpu``.
"""

from otel_proofscope.gpu.backend import (
    BackendUnavailable,
    DeviceIdentity,
    DeviceSample,
    Gap,
    HwState,
)
from otel_proofscope.gpu.census import take_census
from otel_proofscope.gpu.dispatch import Dispatch, GpuRuntime
from otel_proofscope.gpu.evidence import EVIDENCE_DEDUP, EvidenceDedup
from otel_proofscope.gpu.sampler import Sampler, start_sampler

__all__ = [
    "EVIDENCE_DEDUP",
    "BackendUnavailable",
    "DeviceIdentity",
    "DeviceSample",
    "Dispatch",
    "EvidenceDedup",
    "Gap",
    "GpuRuntime",
    "HwState",
    "Sampler",
    "start_sampler",
    "take_census",
]
