"""Span export to an OTLP/JSON-lines file, one line per batch.

The same file the upstream ``opentelemetry-exporter-otlp-json-file`` ``FileSpanExporter``
writes (line for line: :func:`otel_proofscope.otlp.encode_json.encode_json_line`), and
the same behaviour: the file opened for appending (UTF-8), each batch written and
flushed under a lock, a batch after shutdown refused with a warning. The difference is
the encoder, ~10x cheaper per span event, and round records read without building
their SDK events (see that module).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.otlp.encode_json import encode_json_line

_log = logging.getLogger(__name__)


class JsonLinesSpanExporter(SpanExporter):
    """Spans to ``path`` as OTLP/JSON lines; a failed batch returns FAILURE (the
    processor counts it as lost)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._stream = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open
        self._lock = threading.Lock()
        self._shutdown = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            _log.warning("Exporter already shutdown, ignoring call")
            return SpanExportResult.FAILURE
        try:
            line = encode_json_line(spans)
            with self._lock:
                if self._stream.closed:
                    _log.warning("Stream is closed, ignoring spans export call")
                    return SpanExportResult.FAILURE
                if line is not None:
                    self._stream.write(line)
                self._stream.flush()
        except Exception as error:
            _log.exception("Failed to write spans batch to %s: %s: %s", self.path,
                           type(error).__name__, error)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        with self._lock:
            self._stream.close()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # every batch is flushed as it is written
