"""What one slow or greedy client may hold in ``proofscope serve``: time and bytes.

Why: the receiver used to take a shared admission slot before reading an HTTP body and
only had a per-read socket timeout, so 8 clients dripping one byte every 10 s held every
slot for good and every legitimate exporter, gRPC included, got "busy". Now:

* :class:`Watchdog`: one thread that closes any request still unfinished at its
  deadline (request line and headers within the deadline; the body within the
  deadline plus what its progress earns, :class:`BodyClock`) and counts it;
* :class:`ByteBudget`: request bytes in flight (being received, decoded or exported) are
  reserved from one budget as they are actually read or inflated (:class:`Reservation`;
  reserving the declared length plus the gzip cap up front let 4 clients dripping one
  byte a second hold it all), at most half of it per HTTP client address; an HTTP request
  past it is refused at once with a retry hint (HTTP 503 + ``Retry-After``) and counted.
  A gRPC request has its whole body already and a deadline: it waits for room until its
  answer is due (some gRPC exporters never retry), within half the budget so that the
  senders that do retry still find room, then is refused so (RESOURCE_EXHAUSTED +
  ``RetryInfo``). One request is always let through when nothing else is in flight, so a
  request within the message cap can never be refused forever.
"""

from __future__ import annotations

import contextlib
import ctypes
import socket
import threading
import time
from collections.abc import Callable

#: Seconds a client has from its request line to the end of its headers; the body then
#: gets as long again, extended while it arrives at least :data:`MIN_BODY_RATE`.
DEFAULT_REQUEST_DEADLINE_S = 10.0
#: Bytes per second a body must average to earn time past the deadline (a 4 MiB body on
#: a 1 Mbit/s link: ~125 KB/s). A client that drips one byte a second earns nothing.
MIN_BODY_RATE = 16 * 1024
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
    """Request bytes in flight, in total and per client.

    A client (``holder``: the peer address) may hold at most ``limit // 2`` unless it
    holds nothing yet, so one address that opens many connections and sends bodies it
    never finishes cannot take the whole budget from the others.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"the in-flight byte budget must be positive, got {limit}")
        self.limit = limit
        self.per_client = max(1, limit // 2)
        self._used = 0
        self._peak = 0
        self._since_trim = 0
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._freed = threading.Condition(self._lock)
        self._stopping = False

    def reserve(self, n: int, holder: str | None = None, *,
                wait_until: float | None = None) -> bool:
        """Take ``n`` bytes if they fit (or nothing else is in flight). ``wait_until``
        (monotonic): else wait for bytes to be released until then; None: never wait.

        A waiting request is let in only while it leaves half the budget free: it wakes
        the moment bytes are released, while a refused sender retries a second later,
        so waiters would otherwise take every release (measured: one official JS HTTP
        exporter lost all 6 attempts beside 4 held gRPC senders)."""
        with self._lock:
            if not self._fits(n, holder, self.limit):
                while not self._fits(n, holder, self.limit // 2):
                    left = None if wait_until is None else wait_until - time.monotonic()
                    if left is None or left <= 0 or self._stopping:
                        return False
                    self._freed.wait(left)
            if holder is not None:
                self._held[holder] = self._held.get(holder, 0) + n
            self._used += n
            self._peak = max(self._peak, self._used)
            return True

    def _fits(self, n: int, holder: str | None, limit: int) -> bool:
        if self._used and self._used + n > limit:
            return False
        if holder is not None:
            held = self._held.get(holder, 0)
            if held and held + n > self.per_client:
                return False
        return True

    def stop_waiting(self) -> None:
        """End every wait now and refuse new ones (the receiver is stopping)."""
        with self._lock:
            self._stopping = True
            self._freed.notify_all()

    def release(self, n: int, holder: str | None = None) -> None:
        with self._lock:
            self._used = max(0, self._used - n)
            if holder is not None:
                left = self._held.pop(holder, 0) - n
                if left > 0:
                    self._held[holder] = left
            idle = self._used == 0
            self._freed.notify_all()
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


class Reservation:
    """What one request holds of the budget, taken as its bytes actually arrive (or are
    inflated), never on what a header declares."""

    def __init__(self, budget: ByteBudget, holder: str | None) -> None:
        self.budget = budget
        self.holder = holder
        self.held = 0

    def take(self, n: int) -> bool:
        if n <= 0 or self.budget.reserve(n, self.holder):
            self.held += max(n, 0)
            return True
        return False

    def give_back(self, n: int) -> None:
        n = min(n, self.held)
        if n > 0:
            self.held -= n
            self.budget.release(n, self.holder)

    def close(self) -> None:
        self.give_back(self.held)


class BodyClock:
    """The body's deadline, measured on the client's own progress: ``deadline_s`` from
    the body's start, extended by what the bytes read so far earn at
    :data:`MIN_BODY_RATE`, and never more than ``deadline_s`` past the last byte (a
    client that sends fast, then stalls, holds its bytes no longer than that)."""

    def __init__(self, deadline_s: float, min_rate: float = MIN_BODY_RATE) -> None:
        self.deadline_s = deadline_s
        self.min_rate = min_rate
        self.start = time.monotonic()
        self.read = 0

    def advance(self, n: int) -> float:
        """Count ``n`` more bytes; seconds from now to the new deadline."""
        self.read += n
        now = time.monotonic()
        earned = self.start + self.deadline_s + self.read / self.min_rate
        return max(0.0, min(earned, now + self.deadline_s) - now)


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

    def move(self, token: int, deadline_s: float) -> bool:
        """Set ``token``'s deadline to ``deadline_s`` from now; False when it already
        fired."""
        with self._lock:
            entry = self._armed.get(token)
            if entry is None:
                return False
            self._armed[token] = (time.monotonic() + deadline_s, entry[1], entry[2])
            return True

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
