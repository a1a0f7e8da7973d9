"""Bound Rerun's own exit hook, so a frozen viewer cannot hold the process forever.

``import rerun`` registers ``rerun_shutdown`` with :mod:`atexit`; it flushes every
recording with no time limit (``GrpcSink::flush_blocking``). When the viewer accepts
TCP but never answers, that call never returns and the process never exits: SIGTERM
does nothing either, since Python is inside an atexit hook. :func:`install` replaces
the hook with one that runs Rerun's shutdown on a daemon thread. Once a sink has seen
trouble (a viewer that stopped answering, a failed write, a close that timed out; see
:func:`mark_trouble`), it waits only until the deadline of the last sink close (at
least ``MIN_WAIT_S``): what it abandons was already counted by that sink. Otherwise it
gives Rerun ``CALM_WAIT_S``, so recordings of the application's own are not cut short.

Measured here against a listening-but-silent port: without this, exit blocks until
killed; with it, exit follows the shutdown bound (the sink's close plus ``MIN_WAIT_S``).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import time

import rerun as rr

#: The least time Rerun's shutdown gets at exit after trouble (a healthy flush takes ms).
MIN_WAIT_S = 0.2
#: What it gets when no sink saw trouble: a bound, but a generous one.
CALM_WAIT_S = 10.0

_lock = threading.Lock()
_installed = False
_deadline = 0.0
_trouble = False


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


def mark_trouble() -> None:
    """A sink could not deliver (what it lost is counted): bound the exit tightly."""
    global _trouble
    _trouble = True


def bounded_shutdown() -> bool:
    """Run Rerun's shutdown; True when it finished within the bound."""
    worker = threading.Thread(target=_shutdown, daemon=True, name="proofscope-rerun-exit")
    worker.start()
    wait = max(MIN_WAIT_S, _deadline - time.monotonic()) if _trouble else CALM_WAIT_S
    worker.join(wait)
    return not worker.is_alive()


def _shutdown() -> None:
    # Nothing useful to do about an error at exit; the sink already counted its items.
    with contextlib.suppress(Exception):
        rr.rerun_shutdown()


# At import, right after ``import rerun`` registered its hook: ours takes that hook's
# place in atexit's last-in-first-out order. Installed later (at the first sink), it
# would run *before* an OTel provider's own exit flush and close the recording while
# that flush still had spans for it (seen: an EZKL proof under opentelemetry-instrument
# lost every span its exit flush carried).
install()
