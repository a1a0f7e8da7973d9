"""One set of GPU instruments per MeterProvider, shared by every sampler and runtime.

The SDK returns the *first* observable instrument registered under a name and silently
ignores the callbacks of a second one, so each observable metric is created once per
provider with a callback that asks every live source. Sources are held weakly: a
runtime or sampler that is garbage-collected stops reporting without an unregister call.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from otel_proofscope.semconv import METER_NAME, InstrumentKind, MetricDef
from otel_proofscope.version import __version__


class Observer(Protocol):
    """Anything that can report observations for an observable metric."""

    def observe(self, metric: MetricDef) -> Iterable[Observation]: ...


class Instruments:
    """The GPU instruments of one MeterProvider."""

    def __init__(self, meter: metrics.Meter) -> None:
        self.meter = meter
        self._lock = threading.Lock()
        self._sync: dict[str, Any] = {}
        self._sources: dict[str, weakref.WeakSet[Any]] = {}

    def counter(self, d: MetricDef) -> metrics.Counter:
        inst = self._sync.get(d.name)
        if inst is None:
            with self._lock:
                inst = self._sync.get(d.name)
                if inst is None:
                    inst = self.meter.create_counter(d.name, d.unit, d.description)
                    self._sync[d.name] = inst
        return inst

    def histogram(self, d: MetricDef) -> metrics.Histogram:
        inst = self._sync.get(d.name)
        if inst is None:
            with self._lock:
                inst = self._sync.get(d.name)
                if inst is None:
                    inst = d.histogram(self.meter)
                    self._sync[d.name] = inst
        return inst

    def observe(self, d: MetricDef, source: Observer) -> None:
        """Make ``source`` report ``d`` (creating the observable instrument once)."""
        with self._lock:
            sources = self._sources.get(d.name)
            if sources is None:
                sources = weakref.WeakSet()
                self._sources[d.name] = sources
                self._create_observable(d, sources)
            sources.add(source)

    def _create_observable(self, d: MetricDef, sources: weakref.WeakSet[Any]) -> None:
        def callback(_options: CallbackOptions) -> Iterable[Observation]:
            out: list[Observation] = []
            for src in list(sources):
                out.extend(src.observe(d))
            return out

        create = {
            InstrumentKind.OBSERVABLE_GAUGE: self.meter.create_observable_gauge,
            InstrumentKind.OBSERVABLE_COUNTER: self.meter.create_observable_counter,
            InstrumentKind.OBSERVABLE_UP_DOWN_COUNTER:
                self.meter.create_observable_up_down_counter,
        }[d.kind]
        create(d.name, callbacks=[callback], unit=d.unit, description=d.description)


_registry: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()
_registry_lock = threading.Lock()


def instruments_for(meter_provider: metrics.MeterProvider | None = None) -> Instruments:
    """The shared instruments of ``meter_provider`` (default: the global one)."""
    provider = meter_provider if meter_provider is not None else metrics.get_meter_provider()
    with _registry_lock:
        inst = _registry.get(provider)
        if inst is None:
            inst = Instruments(metrics.get_meter(METER_NAME, __version__, provider))
            _registry[provider] = inst
        return inst
