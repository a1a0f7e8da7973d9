"""One reference-counted resource per Rerun target, shared by span and metric exporters.

Spans and metrics of one target must land in one recording, so both exporters acquire
the same sink (or child process); the last release closes it, earlier ones only flush.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from otel_proofscope.pipeline.forking import after_fork_in_child


class Closable(Protocol):
    def flush(self, timeout_s: float) -> bool: ...

    def close(self, timeout_s: float) -> None: ...


T = TypeVar("T", bound=Closable)


class SharedByTarget(Generic[T]):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[T, int]] = {}
        # A forked child must not write to its parent's recording or pipe, nor wait on
        # its threads: it starts with an empty registry.
        after_fork_in_child(self._forget)

    def acquire(self, name: str, create: Callable[[], T]) -> T:
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                resource = create()
                self._entries[name] = (resource, 1)
                return resource
            self._entries[name] = (entry[0], entry[1] + 1)
            return entry[0]

    def release(self, name: str, resource: T, timeout_s: float) -> None:
        with self._lock:
            entry = self._entries.get(name)
            last = True
            if entry is not None and entry[0] is resource:
                if entry[1] > 1:
                    self._entries[name] = (resource, entry[1] - 1)
                    last = False
                else:
                    del self._entries[name]
        if last:
            resource.close(timeout_s)
        else:
            resource.flush(timeout_s)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._entries.clear()
