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
import threading
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
    leaving = _WorkerExit(telemetry)
    util.Finalize(telemetry, leaving.flush_once, exitpriority=EXIT_PRIORITY)

    # Pool.terminate() sends SIGTERM: flush within the bound, then leave as SIGTERM
    # would. A SystemExit instead could be swallowed (in a finalizer, an at-fork hook)
    # and leave the worker alive, with terminate() waiting for it forever.
    def flush_and_exit(signum: int, _frame: object) -> None:
        leaving.terminate(signum)

    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, flush_and_exit)
        _watch_for_sigterm(leaving)


class _WorkerExit:
    """A worker flushes once, whichever way it leaves (its finalizer, the SIGTERM
    handler in the main thread, or the watcher thread)."""

    def __init__(self, telemetry: _HasProcessors) -> None:
        self._telemetry = telemetry
        self._lock = threading.Lock()
        self._owner: int | None = None

    def flush_once(self) -> None:
        me = threading.get_ident()
        if self._owner == me:  # a signal handler run inside our own flush
            return
        # Another thread flushing leaves within the bound; past it, leave without.
        if self._lock.acquire(timeout=self._telemetry.shutdown_timeout_s + 1.0):
            self._owner = me
            _flush(self._telemetry)  # the lock stays held: once per worker

    def terminate(self, signum: int) -> None:
        if self._owner == threading.get_ident():
            return  # inside our own flush (the finalizer's): let it finish, it exits
        self.flush_once()
        os._exit(128 + signum)


#: This process's own wakeup pipe (write end, read end; -1: none), and the write end
#: of the one a fork inherited.
_wakeup_fd = -1
_wakeup_read_fd = -1
_inherited_fd = -1


def _after_fork_in_child() -> None:
    # A child inherits the wakeup fd: its signals would land in the parent's pipe, and
    # a Pool's workers getting their SIGTERM would end the worker that runs the Pool.
    global _wakeup_fd, _wakeup_read_fd, _inherited_fd
    if _wakeup_fd == -1:
        return
    _inherited_fd, _wakeup_fd = _wakeup_fd, -1
    with contextlib.suppress(OSError):  # no watcher thread survives a fork to read it
        os.close(_wakeup_read_fd)
    _wakeup_read_fd = -1
    with contextlib.suppress(ValueError, OSError):  # ValueError: forked off the main thread
        previous = signal.set_wakeup_fd(-1)
        if previous != _inherited_fd:  # someone else's: leave it
            signal.set_wakeup_fd(previous)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _watch_for_sigterm(leaving: _WorkerExit) -> None:
    """Act on SIGTERM from a thread of our own, not only in the main thread.

    Why: Python runs a signal handler in the main thread, and only once that thread
    is back in the interpreter. A ``Pool`` worker's main thread blocked on the task
    queue's lock (which ``Pool.terminate()`` holds and never releases) wakes only if the
    kernel delivered SIGTERM to it; delivered to any other thread (ours, the SDK's,
    gRPC's), the worker hung forever and ``terminate()`` with it (3 of 30 runs of the
    forked-workers scenario). CPython writes each caught signal's number to the wakeup
    fd from whichever thread got it, so a thread reading that fd always sees it. Not
    installed where the worker already has a wakeup fd of someone else's (an event
    loop's): the main thread's handler is left to act alone there, as before.
    """
    global _wakeup_fd, _wakeup_read_fd
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(read_fd)
        os.close(write_fd)
        raise
    if previous not in (-1, _inherited_fd):
        signal.set_wakeup_fd(previous)
        os.close(read_fd)
        os.close(write_fd)
        return
    _wakeup_fd, _wakeup_read_fd = write_fd, read_fd

    def watch() -> None:
        while True:
            try:
                got = os.read(read_fd, 64)
            except OSError:
                return
            if not got:
                return
            if signal.SIGTERM in got:
                leaving.terminate(signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="proofscope-worker-sigterm").start()


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
