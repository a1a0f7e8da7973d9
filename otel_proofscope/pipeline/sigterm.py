"""SIGTERM for a prover: unwind it, then hold a second one off the bounded shutdown.

``configure()`` turns a default-action SIGTERM into ``SystemExit`` so open spans end
(marked as errors) and the bounded shutdown runs at exit. A second SIGTERM while that
shutdown runs (an impatient supervisor) used to raise ``SystemExit`` inside the exit
handler: no report, and the queued spans neither exported nor counted. During the
shutdown our handler is swapped for one that only logs; the bound already guarantees a
prompt exit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable

_log = logging.getLogger("otel_proofscope.setup")


def _terminate(signum: int, _frame: object) -> None:
    # 128 + 15 is the conventional exit code.
    raise SystemExit(128 + signum)


def sigterm_to_exit() -> None:
    """Install the unwinding handler where SIGTERM still has its default action."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # the application has its own handler; leave it alone
    signal.signal(signal.SIGTERM, _terminate)


def hold_sigterm() -> Callable[[], object]:
    """While the bounded shutdown runs, log a SIGTERM instead of raising (only when our
    handler is installed); returns the function that restores it."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not _terminate:
        return lambda: None

    def noted(signum: int, _frame: object) -> None:
        _log.warning("SIGTERM during the bounded shutdown: finishing it (at most the "
                     "shutdown bound) so that every span is exported or counted")

    signal.signal(signal.SIGTERM, noted)
    return lambda: signal.signal(signal.SIGTERM, _terminate)


def _default_in_child() -> None:
    # A forked child must not turn SIGTERM into SystemExit: raised inside an at-fork
    # hook or a finalizer it is swallowed, the child lives on, and Pool.terminate() then
    # waits for it forever (seen: a worker stuck on the task queue's lock). Children
    # made by multiprocessing get a handler that flushes, then exits (fork_exit.py).
    if signal.getsignal(signal.SIGTERM) is _terminate:
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_child)
