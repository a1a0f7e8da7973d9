"""The child's stdout and stderr through pipes: passed on unchanged, and read as log lines.

``proofscope run --map`` gives the prover pipes instead of our terminal. One thread per
pipe reads whatever is there (``os.read``, no buffering on our side), writes those exact
bytes to our own stdout or stderr at once, then hands each complete line, stamped with
the monotonic time the read returned, to the :class:`~otel_proofscope.mapping.lines.
LineEngine`. So the terminal shows the prover's output byte for byte, and a line's time
is when it reached us: the prover's own flushing bounds the resolution (Node writes to a
pipe synchronously; a C program's stdio may hold lines until its buffer fills).

Measured (benchmarks/bench_line_arrival.py: a Node child stamps each line with its own
monotonic clock; 2 CPUs at load average ~9): from write to our stamp, median 0.15–1.8 ms,
p90 4–7 ms, max 20–74 ms.

A line ends at ``\\n`` or ``\\r`` (progress bars redraw with ``\\r``); blank lines are not
counted. A line longer than :data:`MAX_LINE_BYTES` is passed on but not matched: it is
counted as malformed. A prover that writes to a closed terminal loses nothing here: we
keep reading (so it never blocks on a full pipe) and count the bytes we could not pass on.

Matching runs in its own thread behind a bounded queue, so a prover that prints faster
than the rules match is not slowed by us: the pumps only read, pass the bytes on and
queue the chunk (lines are split in the matcher's thread), the pipes are widened to
1 MiB so the prover writes on while a pump waits for a CPU, and lines the queue has no
room for are counted (``proofscope.line.dropped``, the drop ledger), not matched.
Measured (benchmarks/bench_run_map.py, 200k short lines, loaded 2-CPU machine): the
child's own runtime 0.53 s without ``--map``, 0.72–0.86 s with it (7.5–10.6 s before).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import metrics, trace

from otel_proofscope.ledger import DROPS
from otel_proofscope.mapping.lines import LineEngine, LineRules
from otel_proofscope.mapping.rust_console import RustTracingConsole
from otel_proofscope.semconv import DropReason

MAX_LINE_BYTES = 65536
#: Lines waiting for the matcher; beyond this they are passed on but not matched. The
#: backlog is held as the chunks read (bounded by MAX_PENDING_BYTES too), so a large
#: bound costs only the output's own bytes, and the matcher works through it until the
#: drain bound after the prover exits.
MAX_PENDING_LINES = 1 << 20
#: Drop-ledger names for lines that were never matched.
DROP_SIGNAL, DROP_SINK = "log_lines", "line-rules"
READ_SIZE = 65536
#: Backlog of unsplit output beyond which chunks are counted, not queued.
MAX_PENDING_BYTES = 64 << 20
#: Pipe buffer asked for (the default pipe-max-size: an unprivileged process may).
PIPE_BYTES = 1 << 20
_EOL = re.compile(rb"[\r\n]")


class LineSplitter:
    """One pipe's bytes, chunk by chunk, into lines for ``on_line(bytes, t)``.

    Runs in whichever thread feeds it: the pump's own (tests, simple use) or the
    matcher's (``proofscope run``), so that the thread draining the prover's pipe does
    no per-line work at all.
    """

    def __init__(self, on_line: Callable[[bytes, int], None],
                 on_overlong: Callable[[str], None], name: str) -> None:
        self._on_line, self._on_overlong = on_line, on_overlong
        self.name = name
        self._buf = bytearray()
        self._skipping = False  # inside an over-long line: pass it on, do not match it

    def feed(self, chunk: bytes, t: int) -> None:
        buf = self._buf
        pos = 0
        for m in _EOL.finditer(chunk):
            piece = chunk[pos:m.start()]
            pos = m.end()
            if self._skipping:
                self._skipping = False
                buf.clear()
                continue
            if len(buf) + len(piece) > MAX_LINE_BYTES:
                self._overlong()
                buf.clear()
                continue
            buf += piece
            if buf:
                self._on_line(bytes(buf), t)
                buf.clear()
        buf += chunk[pos:]
        if not self._skipping and len(buf) > MAX_LINE_BYTES:
            self._overlong()
            self._skipping = True
        if self._skipping:
            buf.clear()

    def end(self, t: int) -> None:
        """EOF: the last line, if it had no newline."""
        if self._buf and not self._skipping:
            self._on_line(bytes(self._buf), t)
        self._buf.clear()

    def _overlong(self) -> None:
        self._on_overlong(f"{self.name}: a line longer than {MAX_LINE_BYTES} bytes, passed "
                          "on but not matched")


class LinePump:
    """Copies one pipe to ``dst`` and feeds its lines to ``on_line(bytes, t_monotonic)``.

    With ``on_chunk`` it hands over each chunk read instead (``on_chunk(bytes, t)``,
    ``on_chunk(None, t)`` at EOF) and splits nothing: the reader of the prover's pipe
    then only reads, writes and appends, whatever the rules cost.
    """

    def __init__(self, src: int, dst: int, on_line: Callable[[bytes, int], None],
                 on_overlong: Callable[[str], None], name: str, *,
                 on_chunk: Callable[[bytes | None, int], None] | None = None) -> None:
        self._src, self._dst = src, dst
        splitter = LineSplitter(on_line, on_overlong, name)
        self._on_chunk = on_chunk or (
            lambda data, t: splitter.feed(data, t) if data is not None else splitter.end(t))
        self.name = name
        self.bytes_read = 0
        self.bytes_not_passed_on = 0
        self._dst_broken = False
        self._thread = threading.Thread(target=self._run, name=f"proofscope-{name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> bool:
        """True when the pipe reached EOF within ``timeout``."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        t = time.monotonic_ns()
        try:
            while True:
                try:
                    chunk = os.read(self._src, READ_SIZE)
                except OSError:
                    break
                if not chunk:
                    break
                t = time.monotonic_ns()
                self.bytes_read += len(chunk)
                self._pass_on(chunk)
                self._on_chunk(chunk, t)
            self._on_chunk(None, t)
        finally:
            os.close(self._src)

    def _pass_on(self, data: bytes) -> None:
        if self._dst_broken:
            self.bytes_not_passed_on += len(data)
            return
        view = memoryview(data)
        while view:
            try:
                n = os.write(self._dst, view)
            except OSError:
                # Our terminal went away: keep draining so the prover never blocks.
                self._dst_broken = True
                self.bytes_not_passed_on += len(view)
                return
            view = view[n:]


class Matcher:
    """The engine fed from a bounded queue, in its own thread.

    The pump must never wait on the matcher. A ``queue.Queue`` put per line (the first
    design) notified a condition on every line, so the matcher thread contended for the
    GIL line by line, and the pump split lines in Python while the prover waited on a
    full pipe: a fast printer ran ~8x slower (benchmarks/README.md, "run --map"). Now a
    pump hands over whole chunks (:meth:`chunk`, one ``deque.append``, no lock), the
    lines are split here, and the matcher is woken only when it went idle.

    The bound is in lines (counted per chunk with ``bytes.count``, so approximately):
    past it a chunk is still split here, in order, but its lines are counted as dropped
    (``queue_full``) instead of matched; past :data:`MAX_PENDING_BYTES` of backlog a
    chunk is not even queued, and its newlines are counted as dropped lines.
    """

    _STOP = object()

    def __init__(self, engine: LineEngine, max_pending: int = MAX_PENDING_LINES) -> None:
        self.engine = engine
        self._pending: collections.deque[tuple[Any, ...]] = collections.deque()
        self._max_pending = max_pending
        self._count_lock = threading.Lock()
        self._pending_lines = 0
        self._pending_bytes = 0
        self._wake = threading.Event()
        self._idle = True  # the matcher waits on _wake: the next item must set it
        self._dropping: DropReason | None = None  # set while a counted-only chunk splits
        self._abandon = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="proofscope-line-rules",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def splitter(self, name: str) -> Callable[[bytes | None, int], None]:
        """An ``on_chunk`` for a :class:`LinePump`: its chunks are split into lines here,
        in the matcher's thread."""
        split = LineSplitter(self._line_here, self._overlong_here, name)
        return lambda data, t: self.chunk(split, data, t)

    def chunk(self, split: LineSplitter, data: bytes | None, t: int) -> None:
        if data is None:
            self._enqueue(("end", split, t, None, 0, 0))
            return
        lines = data.count(b"\n") or (1 if b"\r" in data else 0)
        if self._stopped:  # a pipe still open after the run (a grandchild holds it)
            self._drop(lines, DropReason.SHUTDOWN)
            return
        with self._count_lock:
            if self._pending_bytes + len(data) > MAX_PENDING_BYTES:
                full = True
            else:
                full = False
                over = self._pending_lines + lines > self._max_pending
                self._pending_lines += lines
                self._pending_bytes += len(data)
        if full:
            self._drop(lines, DropReason.QUEUE_FULL)
            return
        self._enqueue(("chunk", split, t, data, lines, DropReason.QUEUE_FULL if over
                       else None))

    def line(self, data: bytes, t: int) -> None:
        self._put(("line", data, t))

    def overlong(self, why: str) -> None:
        self._put(("overlong", why, 0))

    def _put(self, item: tuple[Any, ...]) -> None:
        if self._stopped:  # a pipe still open after the run (a grandchild holds it)
            self._drop(1, DropReason.SHUTDOWN)
            return
        with self._count_lock:
            full = self._pending_lines >= self._max_pending
            if not full:
                self._pending_lines += 1
        if full:
            self._drop(1, DropReason.QUEUE_FULL)
            return
        self._enqueue(item)

    def _enqueue(self, item: tuple[Any, ...]) -> None:
        self._pending.append(item)
        if self._idle:
            self._idle = False
            self._wake.set()

    def _drop(self, n: int, reason: DropReason) -> None:
        if n <= 0:
            return
        for _ in range(n):
            self.engine.dropped_line()
        DROPS.record(DROP_SIGNAL, DROP_SINK, reason.value, n)

    def stop(self, timeout: float) -> bool:
        """Match what is queued (bounded); True when all of it was."""
        self._stopped = True
        if self._thread.ident is None:
            return True  # never started: the prover did not start either
        self._pending.append((self._STOP,))  # past the bound: it is not a line
        self._idle = False
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon = True  # count the rest instead of matching it
            self._thread.join(timeout)
            return False
        return True

    # ── the matcher's thread ──

    def _line_here(self, data: bytes, t: int) -> None:
        if self._dropping is not None:
            self._drop(1, self._dropping)
        else:
            self.engine.feed(data, t)

    def _overlong_here(self, why: str) -> None:
        if self._dropping is not None:
            self._drop(1, self._dropping)
        else:
            self.engine.malformed_line(why)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while True:
                try:
                    item = self._pending.popleft()
                except IndexError:
                    break
                kind = item[0]
                if kind is self._STOP:
                    return
                self._one(kind, item)
            # Idle from here: an item appended before this flag is seen by the check
            # below, one appended after it sets _wake.
            self._idle = True
            if self._pending:
                self._idle = False
                self._wake.set()

    def _one(self, kind: str, item: tuple[Any, ...]) -> None:
        if kind == "chunk":
            _, split, t, data, lines, reason = item
            self._dropping = DropReason.SHUTDOWN if self._abandon else reason
            try:
                split.feed(data, t)
            finally:
                self._dropping = None
                with self._count_lock:
                    self._pending_lines -= lines
                    self._pending_bytes -= len(data)
        elif kind == "end":
            _, split, t = item[:3]
            self._dropping = DropReason.SHUTDOWN if self._abandon else None
            try:
                split.end(t)
            finally:
                self._dropping = None
        else:
            with self._count_lock:
                self._pending_lines -= 1
            if self._abandon:
                self._drop(1, DropReason.SHUTDOWN)
            elif kind == "overlong":
                self.engine.malformed_line(item[1])
            else:
                self.engine.feed(item[1], item[2])


def _widen(fd: int) -> None:
    """Give the pipe PIPE_BYTES of buffer (Linux; 64 KiB by default): the prover writes
    on while our pump waits for a CPU or the GIL, instead of blocking on a full pipe."""
    setsize = getattr(fcntl, "F_SETPIPE_SZ", None)
    if setsize is None:
        return
    # Over /proc/sys/fs/pipe-max-size or the user's pipe quota: the default stays.
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, setsize, PIPE_BYTES)


class MappedOutput:
    """Line rules applied to one child process: pipes, pumps and the engine."""

    def __init__(self, rules: LineRules, argv: Sequence[str], root: Any, *,
                 tracer_provider: trace.TracerProvider | None,
                 meter_provider: metrics.MeterProvider | None,
                 system: str, backend: str, console: str = "off") -> None:
        # console: the Rust tracing close-line reader, "on", "auto" (quiet unless the
        # prover prints close lines) or "off".
        self.console = None if console == "off" else RustTracingConsole(
            root, tracer_provider=tracer_provider, auto=console == "auto")
        self.engine = LineEngine(rules, " ".join(argv), root, tracer_provider=tracer_provider,
                                 meter_provider=meter_provider, system=system, backend=backend,
                                 console=self.console)
        self._pumps: list[LinePump] = []
        self._matcher = Matcher(self.engine)

    @staticmethod
    def popen_kwargs() -> dict[str, Any]:
        return {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "bufsize": 0}

    def started(self, child: subprocess.Popen[bytes]) -> None:
        self.engine.begin(time.monotonic_ns())
        self._matcher.start()
        for pipe, dst, name in ((child.stdout, 1, "stdout"), (child.stderr, 2, "stderr")):
            if pipe is None:
                continue
            # The pump owns the descriptor from now on (it closes it at EOF).
            fd = os.dup(pipe.fileno())
            pipe.close()
            _widen(fd)
            pump = LinePump(fd, dst, self._matcher.line, self._matcher.overlong, name,
                            on_chunk=self._matcher.splitter(name))
            self._pumps.append(pump)
            pump.start()

    def finish(self, drain_timeout_s: float) -> list[str]:
        """After the child exited: drain the pipes (bounded), close the phases, report."""
        notes: list[str] = []
        deadline = time.monotonic() + drain_timeout_s
        for pump in self._pumps:
            if not pump.join(max(0.0, deadline - time.monotonic())):
                notes.append(f"{pump.name}: still open {drain_timeout_s:g} s after the prover "
                             "exited (a child of it holds the pipe?); later lines are not "
                             "mapped")
            if pump.bytes_not_passed_on:
                notes.append(f"{pump.name}: {pump.bytes_not_passed_on} bytes of the prover's "
                             "output could not be passed on (our output was closed)")
        if not self._matcher.stop(drain_timeout_s):
            notes.append("line rules: still matching after the prover exited; the rest of "
                         "its lines were counted, not matched")
        self.engine.finish(time.monotonic_ns())
        stats = self.engine.stats
        label = self.engine.rules.label
        console = self.console.report() if self.console is not None else []
        if not self.engine.rules.lines and self.console is not None:
            return console + notes  # the close-line reader alone (quiet when it found none)
        lines = [f"mapping {label}: {stats.report()}"]
        lines += [f"mapping {label}: {e}" for e in stats.errors]
        return lines + console + notes
