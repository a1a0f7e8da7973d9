"""What one slow or greedy client may hold in ``proofscope serve``: time and bytes.

Why: the receiver used to take a shared admission slot before reading an HTTP body and
only had a per-read socket timeout, so 8 clients dripping one byte every 10 s held every
slot for good and every legitimate exporter, gRPC included, got "busy". Now:

* :class:`Watchdog`: one thread that closes any request still unfinished at its
  deadline (headers and body together, not per read) and counts it;
* :class:`ByteBudget`: request bytes in flight (being received, decoded or exported) are
  reserved from one budget; a request past it is refused at once with a retry hint
  (HTTP 503 + ``Retry-After``, gRPC RESOURCE_EXHAUSTED + ``RetryInfo``) and counted.
  One request is always let through when nothing else is in flight, so a request within
  the message cap can never be refused forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections.abc import Callable

#: Seconds a client has from its request line to the last body byte.
DEFAULT_REQUEST_DEADLINE_S = 10.0
#: Request bytes in flight across all connections and both transports.
DEFAULT_MAX_INFLIGHT_BYTES = 16 * 1024 * 1024
#: What a refused client is told to wait before retrying.
RETRY_AFTER_S = 1


#: Request bytes handled since the heap was last trimmed, before trimming again.
TRIM_AFTER_BYTES = 4 * 1024 * 1024


def _load_trim() -> Callable[[], object] | None:
    try:
        libc = ctypes.CDLL("libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return lambda: trim(0)


_malloc_trim = _load_trim()


def _trim_heap() -> None:
    """Give freed decode buffers back to the OS once the receiver is idle: glibc keeps
    them otherwise (measured: ~135 MB stayed resident after 8 x 3 MB requests)."""
    if _malloc_trim is not None:
        _malloc_trim()


class ByteBudget:
    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the in-flight byte budget must be positive, got {limit}")
        self.limit = limit
        self._used = 0
        self._peak = 0
        self._since_trim = 0
        self._lock = threading.Lock()

    def reserve(self, n: int) -> bool:
        """Take ``n`` bytes if they fit (or nothing else is in flight); never waits."""
        with self._lock:
            if self._used and self._used + n > self.limit:
                return False
            self._used += n
            self._peak = max(self._peak, self._used)
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self._used = max(0, self._used - n)
            idle = self._used == 0
            self._since_trim += n
            trim = idle and self._since_trim >= TRIM_AFTER_BYTES
            if trim:
                self._since_trim = 0
        if trim:
            _trim_heap()

    @property
    def used(self) -> int:
        return self._used

    @property
    def peak(self) -> int:
        return self._peak


class Watchdog:
    """Closes connections whose request outlives its deadline."""

    def __init__(self, tick_s: float = 0.1) -> None:
        self._tick = tick_s
        self._armed: dict[int, tuple[float, socket.socket, Callable[[], None]]] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, conn: socket.socket, deadline_s: float,
            on_expire: Callable[[], None]) -> int:
        """Shut ``conn`` down and call ``on_expire`` unless disarmed within ``deadline_s``."""
        with self._lock:
            self._next += 1
            token = self._next
            self._armed[token] = (time.monotonic() + deadline_s, conn, on_expire)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name="proofscope-otlp-deadlines")
                self._thread.start()
        return token

    def disarm(self, token: int) -> bool:
        """False when the deadline already fired (the connection is closed)."""
        with self._lock:
            return self._armed.pop(token, None) is not None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                expired = [t for t, (d, _, _) in self._armed.items() if d <= now]
                fired = [self._armed.pop(t) for t in expired]
            for _, conn, on_expire in fired:
                on_expire()
                # shutdown, not close: the handler thread still owns the descriptor;
                # its blocked read returns at once and it unwinds normally.
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
