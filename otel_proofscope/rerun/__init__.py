"""Rerun exporters: OpenTelemetry spans and metrics drawn as a live 3D proof walk.

``exporter`` (the SpanExporter / MetricExporter), ``translate`` and
``translate_metrics`` (pure translation), ``sink`` (recording, queue, sender thread),
``blueprint``, ``layout``, ``readback`` (read a ``.rrd`` back). See docs/rerun-view.md.
"""

try:
    import rerun as _rerun  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError("the Rerun exporters need rerun-sdk 0.41: "
                      "pip install 'otel-proofscope[rerun]'") from exc
