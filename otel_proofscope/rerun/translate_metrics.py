"""OTel metric points → Rerun scalar rows (no I/O).

GPU instruments become per-device series ``gpu/device_{hw.id}/{series}`` in display
units (fractions, GiB, ms, GB/s); proof instruments become ``proof/{name}/{attributes}``
and anything else ``metrics/{name}/{attributes}``. Every row sits on ``proof_time`` at
the data point's timestamp.

Histograms are plotted as the mean over each export interval (Δsum / Δcount) and
counters as rates or running totals, whichever temporality the reader delivers
(cumulative, the SDK default, is differenced here). Upload / readback bandwidth is the
bytes moved in the interval over the transfer time spent in it — a real effective
bandwidth, not bytes over wall time. ``gpu.capability.unsupported`` points feed the
capability-gap table (``gpu/capability_gaps``) and a warning on ``logs/gpu``. The
per-phase GPU cost counters (``gpu.phase.*``) are not drawn: the span translation plots
the same figures per phase, exactly, from the spans (``gpu/phase/…``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import rerun as rr
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    ExponentialHistogram,
    Gauge,
    Histogram,
    MetricsData,
    Sum,
)

from otel_proofscope.rerun.columns import Frame
from otel_proofscope.rerun.model import Gap, GapTable
from otel_proofscope.semconv import Attr, Metric

GIB = float(1 << 30)

#: Instantaneous values (gauges, up-down counters) and running totals: (series, scale).
_VALUES: dict[str, tuple[str, float, str]] = {
    Metric.HW_GPU_UTILIZATION.name: ("util", 1.0, "utilization (fraction)"),
    Metric.HW_GPU_MEMORY_UTILIZATION.name: ("memory_util", 1.0, "memory in use (fraction)"),
    Metric.HW_GPU_MEMORY_USAGE.name: ("memory_used_gib", 1 / GIB, "memory used (GiB)"),
    Metric.HW_GPU_MEMORY_LIMIT.name: ("memory_limit_gib", 1 / GIB, "memory size (GiB)"),
    Metric.HW_POWER.name: ("power_w", 1.0, "power (W)"),
    Metric.HW_ENERGY.name: ("energy_j", 1.0, "energy since driver load (J)"),
    Metric.HW_GPU_TEMPERATURE.name: ("temperature_c", 1.0, "temperature (°C)"),
    Metric.HW_GPU_CLOCK_SM.name: ("clock_sm_mhz", 1e-6, "SM clock (MHz)"),
    Metric.HW_GPU_CLOCK_MEMORY.name: ("clock_memory_mhz", 1e-6, "memory clock (MHz)"),
    Metric.HW_ERRORS.name: ("errors", 1.0, "hardware errors (total)"),
    Metric.HW_STATUS.name: ("status", 1.0, "status"),
    Metric.GPU_MEMORY_RESIDENT.name: ("resident_gib", 1 / GIB, "resident (GiB)"),
    Metric.GPU_MEMORY_RESIDENT_PEAK.name: ("resident_peak_gib", 1 / GIB, "resident peak (GiB)"),
    Metric.GPU_ALLOC_COUNT.name: ("allocations", 1.0, "allocations (total)"),
    Metric.GPU_ALLOC_SIZE.name: ("allocated_gib", 1 / GIB, "allocated (GiB, total)"),
    Metric.GPU_FREE_SIZE.name: ("freed_gib", 1 / GIB, "freed (GiB, total)"),
    Metric.GPU_FAULT_COUNT.name: ("faults", 1.0, "faults (total)"),
    Metric.GPU_RETRY_COUNT.name: ("retries", 1.0, "retries (total)"),
    Metric.GPU_RECOVERY_COUNT.name: ("recoveries", 1.0, "recoveries (total)"),
    Metric.GPU_RESIDUAL_BATCH_COUNT.name: ("residual_batches", 1.0, "batches redone on CPU"),
}
#: Histograms plotted as their mean per interval.
_MEANS: dict[str, tuple[str, float, str]] = {
    Metric.GPU_KERNEL_DURATION.name: ("kernel_ms", 1e3, "kernel time, mean (ms)"),
    Metric.GPU_QUEUE_WAIT_DURATION.name: ("queue_wait_ms", 1e3, "queue wait, mean (ms)"),
    Metric.GPU_SUBMIT_DURATION.name: ("submit_ms", 1e3, "submit→complete, mean (ms)"),
}
#: Counters plotted as a rate per second over the interval.
_RATES: dict[str, tuple[str, float, str]] = {
    Metric.GPU_DISPATCH_COUNT.name: ("dispatches_per_s", 1.0, "dispatches per second"),
    Metric.HW_GPU_IO.name: ("io_gb_per_s", 1e-9, "host link (GB/s)"),
}
#: Byte counter → (series prefix, its duration histogram).
_BANDWIDTH: dict[str, tuple[str, str]] = {
    Metric.GPU_UPLOAD_SIZE.name: ("upload", Metric.GPU_UPLOAD_DURATION.name),
    Metric.GPU_READBACK_SIZE.name: ("readback", Metric.GPU_READBACK_DURATION.name),
}
_BANDWIDTH_DURATIONS = {d: prefix for prefix, d in _BANDWIDTH.values()}

#: Counters whose figures the span translation already draws per phase (gpu/phase/…).
_FROM_SPANS = frozenset({Metric.GPU_PHASE_KERNEL_TIME.name, Metric.GPU_PHASE_ENERGY.name,
                         Metric.GPU_PHASE_TRANSFER_SIZE.name})

#: Attributes that identify the device rather than the series.
_IDENTITY = frozenset({Attr.HW_ID, Attr.HW_TYPE, Attr.HW_NAME, Attr.HW_VENDOR,
                       Attr.HW_DRIVER_VERSION, Attr.HW_PARENT, Attr.GPU_BACKEND})

#: Series whose previous point is remembered (for deltas); beyond this, counted.
MAX_SERIES = 4096


@dataclass
class MetricIssues:
    points: int = 0
    skipped: int = 0  # unsupported point types or values
    capped: dict[str, int] = field(default_factory=dict)


@dataclass
class _Prev:
    start: int
    time: int
    value: float
    count: float
    total: float


@dataclass
class _Step:
    """One point after differencing: the interval it covers and what happened in it."""

    time: int
    seconds: float  # interval length
    delta: float  # value / sum moved in the interval
    count: float  # histogram count in the interval
    total: float  # running total (sums)


def _key(attrs: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, str(v)) for k, v in attrs.items()))


def _suffix(attrs: Mapping[str, Any]) -> str:
    parts = [str(v) for k, v in sorted(attrs.items()) if k not in _IDENTITY]
    return "_".join(parts)


def _device(attrs: Mapping[str, Any]) -> str:
    return "device_" + rr.escape_entity_path_part(str(attrs.get(Attr.HW_ID, "unknown")))


class MetricTranslator:
    """Differencing state + routing of metric points to entity paths."""

    def __init__(self, gaps: GapTable | None = None, max_series: int = MAX_SERIES) -> None:
        self.gaps = gaps if gaps is not None else GapTable()
        self._prev: dict[tuple[str, tuple[tuple[str, str], ...]], _Prev] = {}
        self._max_series = max_series
        self._styled: set[str] = set()

    def translate(self, data: MetricsData, frame: Frame) -> MetricIssues:
        issues = MetricIssues()
        # Bandwidth pairs: (prefix, device path, suffix) → [bytes, seconds, time]
        transfers: dict[tuple[str, str, str], list[float]] = {}
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    self._metric(metric, frame, issues, transfers)
        for (prefix, device, suffix), (nbytes, secs, t) in transfers.items():
            if secs > 0 and nbytes >= 0:
                path = f"gpu/{device}/{prefix}_gb_per_s" + (f"_{suffix}" if suffix else "")
                self._style(frame, path, f"{device} {prefix} bandwidth (GB/s)")
                frame.scalar(path, int(t), nbytes / secs / 1e9)
        return issues

    def _metric(self, metric: Any, frame: Frame, issues: MetricIssues,
                transfers: dict[tuple[str, str, str], list[float]]) -> None:
        name = str(metric.name)
        if name in _FROM_SPANS:
            return
        data = metric.data
        for point in data.data_points:
            issues.points += 1
            attrs = point.attributes or {}
            step = self._step(name, data, point, issues)
            if step is None:
                continue
            if name == Metric.GPU_CAPABILITY_UNSUPPORTED.name:
                self._gap(attrs, step.time, frame)
                continue

            if name in _BANDWIDTH or name in _BANDWIDTH_DURATIONS:
                prefix = _BANDWIDTH[name][0] if name in _BANDWIDTH else _BANDWIDTH_DURATIONS[name]
                slot = transfers.setdefault((prefix, _device(attrs), _suffix(attrs)),
                                            [0.0, 0.0, 0.0])
                slot[0 if name in _BANDWIDTH else 1] += step.delta
                slot[2] = max(slot[2], step.time)
                if name in _BANDWIDTH:
                    continue
            if name.startswith(("hw.", "gpu.")):
                self._gpu(name, data, attrs, step, frame)
            else:
                self._generic(name, data, attrs, step, frame)

    def _step(self, name: str, data: Any, point: Any, issues: MetricIssues) -> _Step | None:
        time = int(point.time_unix_nano)
        start = int(point.start_time_unix_nano or time)
        if isinstance(data, Histogram | ExponentialHistogram):
            value, count = float(point.sum), float(point.count)
            temporality = data.aggregation_temporality
        elif isinstance(data, Sum):
            value, count = float(point.value), 0.0
            temporality = data.aggregation_temporality
        elif isinstance(data, Gauge):
            return _Step(time, 0.0, float(point.value), 0.0, float(point.value))
        else:
            issues.skipped += 1
            return None
        key = (name, _key(point.attributes or {}))
        prev = self._prev.get(key)
        if temporality == AggregationTemporality.DELTA:
            total = (prev.total if prev else 0.0) + value
            step = _Step(time, (time - start) / 1e9, value, count, total)
        elif prev is not None and prev.start == start and value >= prev.value \
                and count >= prev.count:
            step = _Step(time, (time - prev.time) / 1e9, value - prev.value,
                         count - prev.count, value)
        else:  # first point of the series, or it was reset
            step = _Step(time, (time - start) / 1e9, value, count, value)
        if prev is not None or len(self._prev) < self._max_series:
            self._prev[key] = _Prev(start, time, value, count, step.total)
        else:
            issues.capped["metric_series"] = issues.capped.get("metric_series", 0) + 1
        return step

    def _gpu(self, name: str, data: Any, attrs: Mapping[str, Any], step: _Step,
             frame: Frame) -> None:
        device = _device(attrs)
        suffix = _suffix(attrs)
        tail = f"_{rr.escape_entity_path_part(suffix)}" if suffix else ""
        if name in _VALUES:
            series, scale, label = _VALUES[name]
            value = step.total if isinstance(data, Sum) else step.delta
        elif name in _MEANS:
            series, scale, label = _MEANS[name]
            if step.count <= 0:
                return
            value = step.delta / step.count
        elif name in _RATES:
            series, scale, label = _RATES[name]
            if step.seconds <= 0:
                return
            value = step.delta / step.seconds
        else:
            self._generic(name, data, attrs, step, frame, root=f"gpu/{device}")
            return
        path = f"gpu/{device}/{series}{tail}"
        self._style(frame, path, f"{device} {label}" + (f" {suffix}" if suffix else ""))
        frame.scalar(path, step.time, value * scale)

    def _generic(self, name: str, data: Any, attrs: Mapping[str, Any], step: _Step,
                 frame: Frame, root: str | None = None) -> None:
        if root is None:
            root = ("proof/" + name[len("proof."):].replace(".", "_")
                    if name.startswith("proof.") else "metrics/" + rr.escape_entity_path_part(name))
        else:
            root = f"{root}/{name.replace('.', '_')}"
        key = "_".join(v for _, v in _key(attrs)) or "all"
        path = f"{root}/{rr.escape_entity_path_part(key)}"
        if isinstance(data, Histogram | ExponentialHistogram):
            if step.count <= 0:
                return
            value = step.delta / step.count
        elif isinstance(data, Sum):
            value = step.total
        else:
            value = step.delta
        frame.scalar(path, step.time, value)

    def _gap(self, attrs: Mapping[str, Any], t: int, frame: Frame) -> None:
        gap = Gap(str(attrs.get(Attr.GPU_BACKEND, "?")), str(attrs.get(Attr.HW_ID, "?")),
                  str(attrs.get(Attr.GPU_CAPABILITY, "?")),
                  str(attrs.get(Attr.GPU_CAPABILITY_REASON, "?")))
        if self.gaps.add(gap, t, "metric"):
            frame.document("gpu/capability_gaps", t, self.gaps.markdown())
            frame.text("logs/gpu", t, f"GPU capability unavailable: {gap.capability} "
                                      f"({gap.reason}) on {gap.backend} device {gap.device}",
                       "WARN")

    def _style(self, frame: Frame, path: str, name: str) -> None:
        if path in self._styled or len(self._styled) >= self._max_series:
            return
        self._styled.add(path)
        frame.static(path, rr.SeriesLines(names=[name]))
