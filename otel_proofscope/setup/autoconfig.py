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

import logging
import os
from typing import Any

from opentelemetry.sdk._configuration import _BaseConfigurator, _OTelSDKConfigurator

#: The entry-point name a user selects with ``OTEL_PYTHON_CONFIGURATOR``.
NAME = "proofscope"
#: opentelemetry-distro's configurator: the SDK's own, which ours is when not selected.
SDK_CONFIGURATOR = "configurator"
_LOAD_LOGGER = "opentelemetry.instrumentation.auto_instrumentation._load"


class _EquivalentConfigurators(logging.Filter):
    """Drops opentelemetry-instrument's "Configuration of X not loaded, Y already loaded"
    (and "… because Y is set by OTEL_PYTHON_CONFIGURATOR") when X and Y are this
    package's configurator and the SDK's: unselected, ours *is* the SDK's, so which of
    the two ran changes nothing, and a warning on every run (issue 30) says nothing a
    user can act on. Any other configurator's warning passes."""

    _PAIR = frozenset({NAME, SDK_CONFIGURATOR})

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) else ""
        args = record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("Configuration of %s not loaded") and len(args) >= 2:
            return not {str(args[0]), str(args[1])} <= self._PAIR
        return True


_FILTER = _EquivalentConfigurators()


def quiet_equivalent_configurators() -> None:
    """Install the filter on opentelemetry-instrument's loader logger (idempotent)."""
    logger = logging.getLogger(_LOAD_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)


class ProofscopeConfigurator(_BaseConfigurator):
    """Entry point ``proofscope`` in group ``opentelemetry_configurator``."""

    telemetry: Any = None

    def _configure(self, **kwargs: Any) -> None:
        quiet_equivalent_configurators()  # the SDK's configurator comes next, skipped
        if os.environ.get("OTEL_PYTHON_CONFIGURATOR", "").strip() != NAME:
            # Opt-in only. opentelemetry-instrument runs the *first* configurator entry
            # point when none is named, and which one is first depends on install order:
            # unnamed, behave exactly as the SDK's own configurator would.
            _OTelSDKConfigurator()._configure(**kwargs)  # type: ignore[no-untyped-call]
            return
        from otel_proofscope.setup import configure

        if ProofscopeConfigurator.telemetry is None:
            ProofscopeConfigurator.telemetry = configure()
