"""Which processes are "the prover": this process, the children ``proofscope run`` wraps,
and their descendants.

NVML's running-process and process-utilization queries list every process on a device;
the sampler keeps only those this watch accepts, so per-process figures are the
prover's own (``gpu.scope=process``) while device-wide figures stay device-wide.

Descendants are found by walking a GPU process's parent chain in ``/proc`` (Linux),
only for the few pids NVML reports, never by scanning every process. Elsewhere only the
registered roots themselves match. A pid NVML reports from another PID namespace (a
container without ``--pid=host``) does not match anything here and is left out.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path

#: Longest parent chain followed (guards against a /proc that changes under us).
MAX_DEPTH = 64


def parent_pid(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The parent of ``pid`` from ``/proc/PID/stat``; None when unknown."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces or ')'.
    close = raw.rfind(b")")
    fields = raw[close + 2:].split()
    if close < 0 or len(fields) < 2:
        return None
    try:
        return int(fields[1])
    except ValueError:
        return None


class ProcessWatch:
    """The set of root pids whose process trees count as the prover."""

    def __init__(self, roots: Iterable[int] | None = None, *, proc: Path = Path("/proc")
                 ) -> None:
        self._lock = threading.Lock()
        self._roots: set[int] = set(roots) if roots is not None else {os.getpid()}
        self._proc = proc

    def add_root(self, pid: int) -> None:
        """Watch ``pid`` and its descendants too (``proofscope run`` adds its child)."""
        with self._lock:
            self._roots.add(int(pid))

    def discard_root(self, pid: int) -> None:
        with self._lock:
            self._roots.discard(int(pid))

    @property
    def roots(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._roots)

    def watched(self, pids: Iterable[int]) -> set[int]:
        """The subset of ``pids`` that are roots or descend from one."""
        roots = self.roots
        out: set[int] = set()
        for pid in pids:
            p: int | None = pid
            for _ in range(MAX_DEPTH):
                if p is None or p <= 1:
                    break
                if p in roots:
                    out.add(pid)
                    break
                p = parent_pid(p, self._proc)
        return out
