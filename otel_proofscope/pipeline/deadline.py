"""The shutdown bound: validated once, and one process-wide deadline every closer obeys.

Why: the SDK's ``SpanExporter.shutdown()`` takes no timeout, so an exporter with its own
queue (the Rerun sink or child) used its full configured bound even when the pipeline's
shutdown had already spent most of it, and the exit overran the promise. ``Telemetry``
publishes its deadline here; such exporters close within :func:`remaining`.

:func:`parse_timeout` is pure so that ``configure()``'s settings object and the Rerun
worker's command line validate ``PROOFSCOPE_SHUTDOWN_TIMEOUT`` the same way (``inf``
used to raise OverflowError deep in a join, ``nan`` to drop everything).
"""

from __future__ import annotations

import math
import threading
import time

ENV_SHUTDOWN_TIMEOUT = "PROOFSCOPE_SHUTDOWN_TIMEOUT"
DEFAULT_SHUTDOWN_TIMEOUT_S = 3.0
#: Longest accepted bound: what ``threading`` can wait (it raises OverflowError beyond,
#: which is how ``inf`` used to fail, deep in a join and after exporting nothing).
MAX_SHUTDOWN_TIMEOUT_S = float(threading.TIMEOUT_MAX)

_lock = threading.Lock()
_deadline: float | None = None


def parse_timeout(raw: str | float | None, *, name: str = ENV_SHUTDOWN_TIMEOUT,
                  default: float = DEFAULT_SHUTDOWN_TIMEOUT_S) -> float:
    """A positive, finite number of seconds; ``None`` / empty gives ``default``.

    Raises ValueError naming ``name`` and the value for anything else (``nan``, ``inf``,
    zero, negative, beyond ``threading.TIMEOUT_MAX``, not a number).
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return default
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_SHUTDOWN_TIMEOUT_S:
        raise ValueError(f"{name} must be a positive finite number of seconds (at most "
                         f"{MAX_SHUTDOWN_TIMEOUT_S:.0f}), got {raw!r}")
    return value


def set_shutdown_deadline(deadline: float | None) -> None:
    """Publish the pipeline's shutdown deadline (``time.monotonic()``), or clear it."""
    global _deadline
    with _lock:
        _deadline = deadline


def remaining(bound_s: float) -> float:
    """``bound_s``, or less when a published shutdown deadline comes sooner (>= 0)."""
    with _lock:
        deadline = _deadline
    if deadline is None:
        return bound_s
    return max(0.0, min(bound_s, deadline - time.monotonic()))
