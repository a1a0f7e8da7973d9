"""One fork hook for every object that must reset itself in a forked child."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from collections.abc import Callable


def after_fork_in_child(method: Callable[[], object]) -> None:
    """Run the bound ``method`` in a forked child, for as long as its object lives.

    A child inherits queues, locks and pipes but not the threads that serve them. The
    hook holds the object weakly, so registering it never keeps an exporter alive.
    """
    weak = weakref.WeakMethod(method)  # type: ignore[arg-type]
    os.register_at_fork(after_in_child=lambda: (m := weak()) and m())


def _collect_native_garbage() -> None:
    # Unreachable wgpu objects inherited by a fork are finalized by the child's first
    # garbage collection, which calls into wgpu-native from a process that does not own
    # its state: seen as a segfault in a multiprocessing child (during the SDK's own
    # after-fork hook). Collecting in the parent first leaves the child none.
    if "wgpu" in sys.modules:
        gc.collect()


os.register_at_fork(before=_collect_native_garbage)
