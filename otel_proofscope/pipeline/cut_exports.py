"""Exports our own shutdown cut short: counted once, not logged a second time.

Why: at the exit bound, a sink whose collector accepts and never answers still has an
export in flight. The pipeline counts its items as lost (``… → otlp (shutdown)`` in the
summary) and shuts the upstream OTLP exporter down, which closes its channel; the
export then fails with ``CANCELLED … Channel closed!`` and the upstream exporter logs
that as an ERROR, in its own thread, at a moment no caller can order against the
summary (CI saw it after the demo's summary). That line is our shutdown, said twice,
and read as a second failure. Only that line goes: an export that fails on its own
(a refused or timed-out collector) is still logged by the exporter as before.

Use: the thread that calls an upstream exporter's ``export`` does so inside
:func:`exporting`; whoever shuts that exporter down while the export is in flight
calls :func:`cut_short` with the thread first. The filter on the upstream exporters'
loggers then drops their ERROR records from that thread until the export returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# The loggers the official OTLP exporters log an export's failure on (each module's
# ``logging.getLogger(__name__)``; opentelemetry-exporter-otlp 1.3x).
UPSTREAM_EXPORTER_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
)

_lock = threading.Lock()
_exporting: set[int] = set()
_cut: set[int] = set()
_installed = False


class _CutExportFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        with _lock:
            return threading.get_ident() not in _cut


def _install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    log_filter = _CutExportFilter()
    for name in UPSTREAM_EXPORTER_LOGGERS:
        # First in line: the gRPC exporter's DuplicateFilter keeps one line per message
        # per 20 s, and a line it saw but we dropped would hide the next real failure.
        logging.getLogger(name).filters.insert(0, log_filter)


@contextmanager
def exporting() -> Iterator[int]:
    """Around one call of an upstream exporter's ``export``; yields the thread's id."""
    _install()
    ident = threading.get_ident()
    with _lock:
        _exporting.add(ident)
    try:
        yield ident
    finally:
        with _lock:
            _exporting.discard(ident)
            _cut.discard(ident)


def cut_short(ident: int | None) -> None:
    """The export running in thread ``ident`` is being cut by our shutdown (and was
    counted as lost by the caller): its exporter's ERROR for it is not logged. A no-op
    when that thread is not exporting any more."""
    if ident is None:
        return
    with _lock:
        if ident in _exporting:
            _cut.add(ident)
