"""The garbage collection of the processes we own (serve, the Rerun worker, the export
process): off while they work, in full once they are idle, bounded in between."""

from __future__ import annotations

import gc
import itertools
import time
import weakref
from collections.abc import Iterator

import pytest

from otel_proofscope.pipeline.gc_policy import GC_YOUNG_THRESHOLD, CollectWhenIdle


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()  # start() froze this test process's heap
    if enabled:
        gc.enable()


def _garbage_cycle() -> weakref.ref[_Cycle]:
    ref = weakref.ref(_Cycle())
    assert ref() is not None  # only the collector can free it
    return ref


def _allocate() -> list[object]:
    return [[i] for i in range(2 * GC_YOUNG_THRESHOLD)]  # enough to be worth a walk


def _top_up(keep: list[object]) -> bool:
    """Allocate until a walk is worth it again (another collection may have reset the
    count); never the condition itself (returns False)."""
    if gc.get_count()[0] < 2 * GC_YOUNG_THRESHOLD:
        keep += _allocate()
    return False


def _until(condition: object, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.01)
    return False


def test_no_collection_while_busy_and_one_once_idle() -> None:
    # Busy is what progress() says, not how often this thread gets the CPU: with a
    # counter bumped by the test loop, two busy processes on two CPUs left the loop
    # unscheduled for a tick, which read as idle (and collected).
    busy = [True]
    calls = itertools.count()
    collector = CollectWhenIdle(lambda: next(calls) if busy[0] else -1, tick_s=0.05,
                                max_busy_s=60).start()
    try:
        assert not gc.isenabled()
        keep = _allocate()
        time.sleep(0.3)  # several ticks, each seeing progress
        assert collector.collections == 0
        busy[0] = False
        # Idle now: collected. Counted by the collector itself: a cycle freed proves
        # nothing, as another thread of the test process may collect too (a pipeline an
        # earlier test left behind; CI, 1 of 1,155), and what it collected resets the
        # young generation's count below the threshold, so keep enough allocated.
        assert _until(lambda: collector.collections >= 1 or _top_up(keep), timeout_s=30)
        assert collector.collections >= 1
        keep.clear()
    finally:
        collector.stop()
    assert gc.isenabled()


def test_a_process_that_is_never_idle_still_collects_after_max_busy() -> None:
    work = [0]
    collector = CollectWhenIdle(lambda: work[0], tick_s=0.02, max_busy_s=0.2).start()
    try:
        keep = _allocate()
        deadline = time.monotonic() + 5
        while collector.collections < 1 and time.monotonic() < deadline:
            work[0] += 1
            _top_up(keep)  # another thread of this process may collect too
            time.sleep(0.005)
        assert collector.collections >= 1
        del keep
    finally:
        collector.stop()


def test_paused_for_the_close_it_never_collects() -> None:
    collector = CollectWhenIdle(lambda: 0, tick_s=0.02, max_busy_s=0.05).start()
    try:
        collector.pause()
        _garbage_cycle()
        keep = _allocate()
        time.sleep(0.3)
        assert collector.collections == 0  # its own count: another thread may collect too
        del keep
    finally:
        collector.stop()


def test_too_little_allocated_is_not_worth_a_walk() -> None:
    collector = CollectWhenIdle(lambda: 0, tick_s=0.02).start()
    try:
        _garbage_cycle()  # a handful of objects, far below the threshold
        time.sleep(0.3)
        assert collector.collections == 0  # its own count: another thread may collect too
    finally:
        collector.stop()
