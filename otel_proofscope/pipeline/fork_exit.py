"""Export what a ``multiprocessing`` worker made before it leaves through ``os._exit``.

Why: a forked ``Process`` or ``Pool`` worker inherits ``configure()``'s providers, so its
spans queue in its own copy of each span processor, but it exits through ``os._exit``
without running :mod:`atexit`: measured on main, 4 ``Process`` children made 24 spans
and exported none, a ``Pool`` lost 6 of 120, and the report said nothing.

``multiprocessing`` runs its after-fork hooks and, at the worker's normal exit, its
finalizers. We register a finalizer in each worker, and a SIGTERM handler for
``Pool.terminate()``, that shut the span processors down within the shutdown bound
(ignoring a further SIGTERM meanwhile; the handler then exits as SIGTERM would): the queue is
exported, and what cannot be is counted in the worker's ledger and logged. (A hook
registered with ``os.register_at_fork`` would be cleared by ``multiprocessing`` before
the worker runs.) A bare ``os.fork()``
child that calls ``os._exit`` itself cannot be reached; it must call
``Telemetry.shutdown()`` first.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from multiprocessing import util
from typing import Protocol

from otel_proofscope.pipeline.processor import BoundedBatchSpanProcessor

_log = logging.getLogger(__name__)

#: Finalizers with a higher priority run first; ours only needs to run before exit.
EXIT_PRIORITY = 10


class _HasProcessors(Protocol):
    span_processors: list[BoundedBatchSpanProcessor]
    shutdown_timeout_s: float


def flush_forked_children(telemetry: _HasProcessors) -> None:
    """Make every ``multiprocessing`` worker forked from now on export its spans at exit."""
    util.register_after_fork(telemetry, _in_worker)


def _in_worker(telemetry: _HasProcessors) -> None:
    util.Finalize(telemetry, _flush, args=(telemetry,), exitpriority=EXIT_PRIORITY)

    # Pool.terminate() sends SIGTERM: flush within the bound, then leave as SIGTERM
    # would. A SystemExit instead could be swallowed (in a finalizer, an at-fork hook)
    # and leave the worker alive, with terminate() waiting for it forever.
    def flush_and_exit(signum: int, _frame: object) -> None:
        _flush(telemetry)
        os._exit(128 + signum)

    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, flush_and_exit)


def _flush(telemetry: _HasProcessors) -> None:
    # Pool.terminate() sends SIGTERM to a worker that is already leaving; configure()
    # turned SIGTERM into SystemExit, which would abort this flush half way. The flush
    # is bounded, so the worker stays terminable in time.
    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    deadline = time.monotonic() + telemetry.shutdown_timeout_s
    for processor in telemetry.span_processors:
        try:
            processor.shutdown(int(max(0.0, deadline - time.monotonic()) * 1000))
        except Exception as exc:  # never let a worker's exit fail on telemetry
            _log.warning("span sink %s: flushing a worker's spans failed: %r",
                         processor.sink, exc)
