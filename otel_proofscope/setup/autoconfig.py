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

import os
from typing import Any

from opentelemetry.sdk._configuration import _BaseConfigurator, _OTelSDKConfigurator

#: The entry-point name a user selects with ``OTEL_PYTHON_CONFIGURATOR``.
NAME = "proofscope"


class ProofscopeConfigurator(_BaseConfigurator):
    """Entry point ``proofscope`` in group ``opentelemetry_configurator``."""

    telemetry: Any = None

    def _configure(self, **kwargs: Any) -> None:
        if os.environ.get("OTEL_PYTHON_CONFIGURATOR", "").strip() != NAME:
            # Opt-in only. opentelemetry-instrument runs the *first* configurator entry
            # point when none is named, and which one is first depends on install order:
            # unnamed, behave exactly as the SDK's own configurator would.
            _OTelSDKConfigurator()._configure(**kwargs)  # type: ignore[no-untyped-call]
            return
        from otel_proofscope.setup import configure

        if ProofscopeConfigurator.telemetry is None:
            ProofscopeConfigurator.telemetry = configure()
