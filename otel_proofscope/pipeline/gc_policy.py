"""The cyclic garbage collector in the processes this project owns: ``proofscope serve``,
the Rerun worker and the export process (never in a prover's process: that is the
prover's to tune).

Why: those processes decode spans all day, and the spans they hold (a burst waiting to
be drawn: the export process's queues and backlog) are long-lived containers. CPython's collector
walks every young container at least once, and the older generations again and again,
though nothing in them is ever cyclic garbage: the spans, their events and their
attribute dicts are freed by reference counting. Measured in the export process after a
burst of 5,050 layers of 32 rounds: the collections took ~0.9 s of its ~3 s of drawing,
and the shutdown took 3.07-3.32 s with them against 2.44-2.87 s without (3 runs each,
2 CPUs); the parent's exit bound is 3 s.

What is cyclic in such a process is a little of Rerun's own work (closures and classes
it builds per batch: ~300 objects per 1,000 spans drawn). So :class:`CollectWhenIdle`
turns the automatic collector off and collects in full on a thread of its own once the
process is idle (no progress for a tick), and at the latest after ``max_busy_s`` of
uninterrupted work, so that garbage stays bounded in a process that is never idle.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable

#: Containers allocated since the last collection below which another is not worth a
#: walk (CPython's own young-generation threshold is 700).
GC_YOUNG_THRESHOLD = 10_000
#: How often :class:`CollectWhenIdle` looks at the progress.
IDLE_TICK_S = 0.25
#: The longest :class:`CollectWhenIdle` lets a busy process go without a collection.
MAX_BUSY_S = 10.0


class CollectWhenIdle:
    """The automatic collector off; a full collection when ``progress()`` (any value
    that changes while the process works: frames received, batches drawn) has not
    changed for a tick, or ``max_busy_s`` after the last one, provided at least
    :data:`GC_YOUNG_THRESHOLD` containers were allocated since."""

    def __init__(self, progress: Callable[[], object], *, tick_s: float = IDLE_TICK_S,
                 max_busy_s: float = MAX_BUSY_S) -> None:
        self._progress = progress
        self._tick_s = tick_s
        self._max_busy_s = max_busy_s
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._thread: threading.Thread | None = None
        #: Collections run so far (for tests and benchmarks).
        self.collections = 0

    def start(self) -> CollectWhenIdle:
        gc.collect()
        gc.freeze()  # the start-up heap: out of every later walk
        gc.disable()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="proofscope-gc-when-idle")
        self._thread.start()
        return self

    def pause(self) -> None:
        """No more collections (closing against a deadline: every second is drawing)."""
        self._paused.set()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self._tick_s * 4)
        gc.enable()

    def _run(self) -> None:
        last = self._progress()
        collected_at = time.monotonic()
        while not self._stop.wait(self._tick_s):
            progress = self._progress()
            busy, last = progress != last, progress
            if self._paused.is_set() or gc.get_count()[0] < GC_YOUNG_THRESHOLD:
                continue  # closing, or too little allocated since the last one to matter
            if not busy or time.monotonic() - collected_at >= self._max_busy_s:
                gc.collect()
                self.collections += 1
                collected_at = time.monotonic()
