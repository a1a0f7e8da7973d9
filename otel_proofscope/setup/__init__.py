"""The composition root: :func:`configure` and the :class:`Telemetry` handle it returns.

The only layer that wires the pipeline, the GPU sampler and the Rerun exporters together
(see docs/architecture.md): options in :mod:`.options`, one builder per sink in
:mod:`.sinks`, the wiring in :mod:`.wiring`, the handle in :mod:`.telemetry`.
"""

from otel_proofscope.setup.options import Options
from otel_proofscope.setup.telemetry import ShutdownReport, Telemetry
from otel_proofscope.setup.wiring import build, configure

__all__ = ["Options", "ShutdownReport", "Telemetry", "build", "configure"]
