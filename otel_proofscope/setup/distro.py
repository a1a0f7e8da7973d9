"""``opentelemetry_distro`` entry point ``proofscope``: what opentelemetry-distro does,
without a second configurator.

``opentelemetry-instrument`` loads one distro, then the *configurators*: with
opentelemetry-distro installed next to this package there are two (``configurator``,
the SDK's, and ``proofscope``), and it warns on every run that one was not loaded
(issue 30). This distro sets the same defaults as opentelemetry-distro (OTLP over gRPC
for traces, metrics and logs, unless the ``OTEL_*`` variables say otherwise), so that
package is not needed; and it quiets that warning for the two equivalent configurators
when both are installed (``OTEL_PYTHON_DISTRO=proofscope`` picks this distro then).
"""

from __future__ import annotations

import os
from typing import Any

from opentelemetry.environment_variables import (
    OTEL_LOGS_EXPORTER,
    OTEL_METRICS_EXPORTER,
    OTEL_TRACES_EXPORTER,
)
from opentelemetry.instrumentation.distro import BaseDistro  # type: ignore[attr-defined]
from opentelemetry.sdk.environment_variables import OTEL_EXPORTER_OTLP_PROTOCOL

from otel_proofscope.setup.autoconfig import quiet_equivalent_configurators


class ProofscopeDistro(BaseDistro):  # type: ignore[misc]
    """The defaults of opentelemetry-distro's ``OpenTelemetryDistro``."""

    def _configure(self, **kwargs: Any) -> None:
        os.environ.setdefault(OTEL_TRACES_EXPORTER, "otlp")
        os.environ.setdefault(OTEL_METRICS_EXPORTER, "otlp")
        os.environ.setdefault(OTEL_LOGS_EXPORTER, "otlp")
        os.environ.setdefault(OTEL_EXPORTER_OTLP_PROTOCOL, "grpc")
        quiet_equivalent_configurators()
