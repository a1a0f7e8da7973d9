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
than the rules match (~20k lines/s) is never slowed by us: the pumps keep passing bytes
on, and lines the queue has no room for are counted (``proofscope.line.dropped``, the
drop ledger), not matched.
"""

from __future__ import annotations

import os
import queue
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
#: Lines waiting for the matcher; beyond this they are passed on but not matched.
MAX_PENDING_LINES = 65536
#: Drop-ledger names for lines that were never matched.
DROP_SIGNAL, DROP_SINK = "log_lines", "line-rules"
READ_SIZE = 65536
_EOL = re.compile(rb"[\r\n]")


class LinePump:
    """Copies one pipe to ``dst`` and feeds its lines to ``on_line(bytes, t_monotonic)``."""

    def __init__(self, src: int, dst: int, on_line: Callable[[bytes, int], None],
                 on_overlong: Callable[[str], None], name: str) -> None:
        self._src, self._dst = src, dst
        self._on_line, self._on_overlong = on_line, on_overlong
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
        buf = bytearray()
        skipping = False  # inside an over-long line: pass it on, do not match it
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
                pos = 0
                for m in _EOL.finditer(chunk):
                    piece = chunk[pos:m.start()]
                    pos = m.end()
                    if skipping:
                        skipping = False
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
                if not skipping and len(buf) > MAX_LINE_BYTES:
                    self._overlong()
                    skipping = True
                if skipping:
                    buf.clear()
            if buf and not skipping:
                self._on_line(bytes(buf), t)  # the last line had no newline
        finally:
            os.close(self._src)

    def _overlong(self) -> None:
        self._on_overlong(f"{self.name}: a line longer than {MAX_LINE_BYTES} bytes, passed "
                          "on but not matched")

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
    """The engine fed from a bounded queue, in its own thread."""

    _STOP = object()

    def __init__(self, engine: LineEngine, max_pending: int = MAX_PENDING_LINES) -> None:
        self.engine = engine
        self._queue: queue.Queue[Any] = queue.Queue(max_pending)
        self._abandon = False
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="proofscope-line-rules",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def line(self, data: bytes, t: int) -> None:
        self._put((data, t))

    def overlong(self, why: str) -> None:
        self._put((None, why))

    def _put(self, item: tuple[bytes | None, Any]) -> None:
        if self._stopped:  # a pipe still open after the run (a grandchild holds it)
            self._drop(1, DropReason.SHUTDOWN)
            return
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._drop(1, DropReason.QUEUE_FULL)

    def _drop(self, n: int, reason: DropReason) -> None:
        for _ in range(n):
            self.engine.dropped_line()
        DROPS.record(DROP_SIGNAL, DROP_SINK, reason.value, n)

    def stop(self, timeout: float) -> bool:
        """Match what is queued (bounded); True when all of it was."""
        self._stopped = True
        if self._thread.ident is None:
            return True  # never started: the prover did not start either
        self._queue.put(self._STOP)  # the queue may be full: wait for room
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._abandon = True  # count the rest instead of matching it
            self._thread.join(timeout)
            return False
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not self._STOP:
            data, arg = item
            if self._abandon:
                self._drop(1, DropReason.SHUTDOWN)
            elif data is None:
                self.engine.malformed_line(arg)
            else:
                self.engine.feed(data, arg)


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
            pump = LinePump(fd, dst, self._matcher.line, self._matcher.overlong, name)
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
