"""Bound Rerun's own exit hook, so a frozen viewer cannot hold the process forever.

``import rerun`` registers ``rerun_shutdown`` with :mod:`atexit`; it flushes every
recording with no time limit (``GrpcSink::flush_blocking``). When the viewer accepts
TCP but never answers, that call never returns and the process never exits: SIGTERM
does nothing either, since Python is inside an atexit hook. :func:`install` replaces
the hook with one that runs Rerun's shutdown on a daemon thread and waits for it only
until the deadline of the last sink close (at least ``MIN_WAIT_S``). What it abandons was
already counted by the sink: a sink that cannot confirm its sends counts them lost.

Measured here against a listening-but-silent port: without this, exit blocks until
killed; with it, exit follows the shutdown bound (the sink's close plus ``MIN_WAIT_S``).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time

import rerun as rr

#: The least time Rerun's shutdown gets at exit (a healthy flush takes a few ms).
MIN_WAIT_S = 0.2

_lock = threading.Lock()
_installed = False
_deadline = 0.0


def install() -> None:
    """Replace Rerun's unbounded exit hook with the bounded one (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    rr.unregister_shutdown()
    atexit.register(bounded_shutdown)


def extend_deadline(deadline: float) -> None:
    """Rerun's shutdown may take until ``deadline`` (a ``time.monotonic()`` value)."""
    global _deadline
    with _lock:
        _deadline = max(_deadline, deadline)


def bounded_shutdown() -> bool:
    """Run Rerun's shutdown; True when it finished within the bound."""
    worker = threading.Thread(target=_shutdown, daemon=True, name="proofscope-rerun-exit")
    worker.start()
    worker.join(max(MIN_WAIT_S, _deadline - time.monotonic()))
    return not worker.is_alive()


def _shutdown() -> None:
    # Nothing useful to do about an error at exit; the sink already counted its items.
    with contextlib.suppress(Exception):
        rr.rerun_shutdown()
