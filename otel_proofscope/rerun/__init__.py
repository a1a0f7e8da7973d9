"""Rerun exporters: OpenTelemetry spans and metrics drawn as a live 3D proof walk.

``exporter`` (the SpanExporter / MetricExporter), ``translate`` and
``translate_metrics`` (pure translation), ``sink`` (recording, queue, sender thread),
``blueprint``, ``layout``, ``readback`` (read a ``.rrd`` back), ``export_process`` (the
one route by which ``configure()`` draws Rerun). See docs/rerun-view.md.
"""

import importlib.util

# Found, not imported: the prover's process starts the export process (configure()'s
# Rerun route) without paying the SDK's ~1.2 s import, which the child pays instead.
if importlib.util.find_spec("rerun") is None:  # pragma: no cover - depends on the extras
    raise ImportError("the Rerun exporters need rerun-sdk 0.41: "
                      "pip install 'otel-proofscope[rerun]'")
