"""``opentelemetry-instrument`` with the bounded pipeline: an ``opentelemetry_configurator``.

Why: ``opentelemetry-instrument --traces_exporter rerun,otlp`` goes through the
distro's SDK configurator, whose ``BatchSpanProcessor`` waits for a dead collector
(measured: exit 9 s after the script, against our 3 s bound), drops silently and prints
no report. Select this configurator instead and auto-instrumented provers get what
``configure()`` gives: per-sink bounded queues, counted drops, the witness filter, the
bounded exit and its report::

    OTEL_PYTHON_CONFIGURATOR=proofscope opentelemetry-instrument \\
        --traces_exporter rerun,otlp python prover.py

Exporter selection, endpoints and service name come from the standard ``OTEL_*``
variables (the CLI flags set them), ``PROOFSCOPE_*`` from the environment.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk._configuration import _BaseConfigurator


class ProofscopeConfigurator(_BaseConfigurator):
    """Entry point ``proofscope`` in group ``opentelemetry_configurator``."""

    telemetry: Any = None

    def _configure(self, **kwargs: Any) -> None:
        from otel_proofscope.setup import configure

        if ProofscopeConfigurator.telemetry is None:
            ProofscopeConfigurator.telemetry = configure()
