"""EZKL's own log lines (Rust ``log`` → Python ``logging``) as span events.

EZKL forwards its Rust logs to the Python loggers ``ezkl.*`` and ``halo2_proofs.*``, and
it asks Python for the effective level before it formats a line, so a line is only
produced when the logger lets it through. To see INFO lines on spans without changing
what the user's console shows, the bridge lowers the logger's level to the capture level,
stops propagation, and re-dispatches every record that would have passed the logger's
original level to the original handlers. Uninstalling restores level and propagation.

The event goes on the current span of the logging thread, or, for lines logged from a
Rust worker thread that has no OpenTelemetry context, on the innermost EZKL phase span
still running.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from opentelemetry import trace
from opentelemetry.trace import Span

from otel_proofscope.semconv import Attr, EventName

#: Loggers EZKL's Rust side logs to.
DEFAULT_LOGGERS: tuple[str, ...] = ("ezkl", "halo2_proofs")


class LogAttr:
    """Attributes of a ``proof.log`` event (same names as the proof-stream bridge)."""

    LEVEL = Attr.LOG_LEVEL
    MESSAGE = Attr.LOG_MESSAGE
    LOGGER = Attr.LOG_LOGGER


#: Longest message kept on an event (EZKL can log whole tables at DEBUG).
MAX_MESSAGE = 4096


def level_name(levelno: int) -> str:
    """The proof-stream level vocabulary (Trace, Debug, Info, Warn, Error)."""
    if levelno >= logging.ERROR:
        return "Error"
    if levelno >= logging.WARNING:
        return "Warn"
    if levelno >= logging.INFO:
        return "Info"
    if levelno >= logging.DEBUG:
        return "Debug"
    return "Trace"


class SpanEventHandler(logging.Handler):
    """Turns records into ``proof.log`` events and forwards what the console would show."""

    def __init__(self, logger: logging.Logger, original_level: int,
                 fallback_span: Callable[[], Span | None]) -> None:
        super().__init__(logging.NOTSET)
        self._logger = logger
        self._original_level = original_level
        self._fallback_span = fallback_span

    def _would_have_passed(self, record: logging.LogRecord) -> bool:
        level = self._original_level
        if level == logging.NOTSET:
            parent = self._logger.parent
            level = parent.getEffectiveLevel() if parent is not None else logging.WARNING
        return record.levelno >= level

    def emit(self, record: logging.LogRecord) -> None:
        try:
            span: Span | None = trace.get_current_span()
            if span is None or not span.is_recording():
                span = self._fallback_span()
            if span is not None and span.is_recording():
                span.add_event(EventName.LOG, {
                    LogAttr.LEVEL: level_name(record.levelno),
                    LogAttr.MESSAGE: record.getMessage()[:MAX_MESSAGE],
                    LogAttr.LOGGER: record.name,
                }, timestamp=int(record.created * 1e9))
        except Exception:
            self.handleError(record)
        if self._would_have_passed(record) and self._logger.parent is not None:
            # As if the record had propagated past the (unchanged) logger.
            self._logger.parent.callHandlers(record)


class LogBridge:
    """Installs :class:`SpanEventHandler` on EZKL's loggers; :meth:`uninstall` undoes it."""

    def __init__(self, capture_level: int = logging.INFO,
                 loggers: Sequence[str] = DEFAULT_LOGGERS,
                 fallback_span: Callable[[], Span | None] = lambda: None) -> None:
        self._capture_level = capture_level
        self._names = tuple(loggers)
        self._fallback = fallback_span
        self._saved: list[tuple[logging.Logger, int, bool, SpanEventHandler]] = []
        self._lock = threading.Lock()

    def install(self) -> None:
        with self._lock:
            if self._saved:
                return
            for name in self._names:
                logger = logging.getLogger(name)
                handler = SpanEventHandler(logger, logger.level, self._fallback)
                self._saved.append((logger, logger.level, logger.propagate, handler))
                effective = logger.getEffectiveLevel()
                logger.setLevel(min(effective, self._capture_level))
                logger.propagate = False
                logger.addHandler(handler)

    def uninstall(self) -> None:
        with self._lock:
            for logger, level, propagate, handler in reversed(self._saved):
                logger.removeHandler(handler)
                logger.setLevel(level)
                logger.propagate = propagate
            self._saved.clear()
