"""Where proof-stream lines come from: a file, stdin, a FIFO, a followed file, a WebSocket.

Every source yields ``(line_number, raw_bytes)`` and is bounded: lines longer than the
decoder's cap are cut (the decoder then rejects them by size), followers poll with a
stop event, and the WebSocket client has connect/close timeouts and a bounded number
of reconnects. Tokens in URLs are redacted in every message.
"""

from __future__ import annotations

import errno
import os
import re
import select
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from otel_proofscope.extras import missing
from otel_proofscope.integrations.proof_stream.decoder import MAX_LINE_BYTES

_READ_CHUNK = 1 << 16


class SourceError(RuntimeError):
    """A source that cannot be opened or was refused (message safe to print)."""


class LineSource(Protocol):
    name: str
    reconnects: int
    #: True when lines arrive as they are produced (not a recording read back).
    live: bool

    def lines(self) -> Iterator[tuple[int, bytes]]: ...

    def stop(self) -> None: ...


def redact(url: str) -> str:
    """The URL with secrets (token / password query values, userinfo) masked."""
    url = re.sub(r"(?i)([?&](?:token|access_token|auth|password|key)=)[^&#]*", r"\1***", url)
    return re.sub(r"(//)[^/@]*@", r"\1***@", url)


def _read_bounded_lines(stream: BinaryIO) -> Iterator[bytes]:
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            # Skip the rest of an over-long line; the decoder rejects it by its size.
            while True:
                rest = stream.readline(_READ_CHUNK)
                if not rest or rest.endswith(b"\n"):
                    break
        yield raw


def _is_regular_file(target: int | str) -> bool:
    try:
        return stat.S_ISREG(os.stat(target).st_mode)
    except OSError:
        return False


class StreamSource:
    """A file, a FIFO (blocks until a writer opens it, ends at EOF) or stdin (``-``)."""

    def __init__(self, path: str | Path, live: bool | None = None) -> None:
        self.path = str(path)
        self.name = "stdin" if self.path == "-" else Path(self.path).name
        self.reconnects = 0
        self._stopped = False
        # Arrival times are the prover's times only for a live producer. A FIFO is
        # opened by one by convention; stdin is as often `cat recording.jsonl` as a
        # prover, and nothing here can tell them apart, so stdin counts as a recording
        # unless the caller says otherwise (``proofscope replay - --live``).
        self.live = live if live is not None else (
            self.path != "-" and not _is_regular_file(self.path))

    def lines(self) -> Iterator[tuple[int, bytes]]:
        if self.path == "-":
            yield from self._numbered(sys.stdin.buffer)
            return
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - closed below, generator-scoped
        except OSError as exc:
            raise SourceError(f"cannot open {self.path}: {exc.strerror}") from None
        with f:
            yield from self._numbered(f)

    def _numbered(self, stream: BinaryIO) -> Iterator[tuple[int, bytes]]:
        for n, raw in enumerate(_read_bounded_lines(stream), start=1):
            if self._stopped:
                return
            yield n, raw

    def stop(self) -> None:
        self._stopped = True


class FollowSource:
    """Follows a regular file or FIFO like ``tail -f`` until :meth:`stop`, then drains.

    Used by ``proofscope run``: the child may open, write and close the path any number
    of times (or never); reads never block the child, and after ``stop`` everything
    already written is still read before the iterator ends.
    """

    def __init__(self, path: str | Path, poll_s: float = 0.05, *,
                 from_end: bool = False) -> None:
        self.path = str(path)
        self.from_end = from_end  # skip what an existing file already holds
        self.name = Path(self.path).name
        self.reconnects = 0
        self.live = True
        self.poll_s = poll_s
        self._stop = threading.Event()
        self._fd: int | None = None

    def stop(self) -> None:
        self._stop.set()

    def open(self) -> FollowSource:
        """Open the read end now (before a writer starts: a FIFO writer that opens
        non-blocking fails without a reader)."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            except OSError as exc:
                raise SourceError(f"cannot open {self.path}: {exc.strerror}") from None
            if self.from_end and stat.S_ISREG(os.fstat(self._fd).st_mode):
                os.lseek(self._fd, 0, os.SEEK_END)
        return self

    def lines(self) -> Iterator[tuple[int, bytes]]:
        self.open()
        fd = self._fd
        assert fd is not None
        is_fifo = stat.S_ISFIFO(os.fstat(fd).st_mode)
        buf = bytearray()
        n = 0
        skipping = False  # inside an over-long line whose head was already yielded
        try:
            while True:
                stopping = self._stop.is_set()  # read once more after stop: drain
                chunk = self._read(fd)
                if chunk:
                    buf += chunk
                    while True:
                        nl = buf.find(b"\n")
                        if nl < 0:
                            break
                        line = bytes(buf[:nl + 1])
                        del buf[:nl + 1]
                        if skipping:
                            skipping = False
                            continue
                        n += 1
                        yield n, line
                    if len(buf) > MAX_LINE_BYTES:
                        if not skipping:
                            n += 1
                            yield n, bytes(buf[:MAX_LINE_BYTES + 1])
                        skipping = True
                        buf.clear()
                    continue
                if stopping:
                    if buf and not skipping:
                        n += 1
                        yield n, bytes(buf)
                    return
                if is_fifo and chunk is None:
                    select.select([fd], [], [], self.poll_s)
                else:
                    # EOF: a FIFO without a writer or the end of a growing file.
                    self._stop.wait(self.poll_s)
        finally:
            os.close(fd)
            self._fd = None

    @staticmethod
    def _read(fd: int) -> bytes | None:
        """Bytes read, b'' at EOF, None when a FIFO has a writer but no data yet."""
        try:
            return os.read(fd, _READ_CHUNK)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                return None
            raise


class WebSocketSource:
    """A live client of the proof-stream WebSocket (``ws://HOST:PORT/ws?token=…``).

    One JSON event per text frame (several lines per frame are split). Bounded:
    ``open_timeout`` per connection attempt, ``max_reconnects`` after a connection that
    broke (not after a clean close or a refused handshake), exponential backoff capped
    at 5 s, and ``idle_timeout`` (None: wait forever) ends a silent stream.
    """

    def __init__(self, url: str, *, open_timeout: float = 5.0, max_reconnects: int = 5,
                 idle_timeout: float | None = None, poll_s: float = 0.25) -> None:
        if not url.startswith(("ws://", "wss://")):
            raise SourceError(f"not a WebSocket URL: {redact(url)}")
        try:  # the optional client, checked before anything else is started
            import websockets.sync.client  # noqa: F401
        except ImportError as exc:
            raise SourceError(f"reading {redact(url)} needs the WebSocket client: "
                              + missing("websockets", "stream", exc)) from None
        self.url = url
        self.name = redact(url)
        self.open_timeout = open_timeout
        self.max_reconnects = max_reconnects
        self.idle_timeout = idle_timeout
        self.poll_s = poll_s
        self.reconnects = 0
        self.live = True
        self.ended_by: str = ""
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def lines(self) -> Iterator[tuple[int, bytes]]:
        from websockets.exceptions import (
            ConnectionClosed,
            ConnectionClosedOK,
            InvalidHandshake,
            InvalidStatus,
            InvalidURI,
        )
        from websockets.sync.client import connect

        n = 0
        failures = 0
        ever_connected = False
        while not self._stop.is_set():
            try:
                ws = connect(self.url, open_timeout=self.open_timeout, close_timeout=1.0,
                             max_size=MAX_LINE_BYTES)
            except InvalidStatus as exc:
                raise SourceError(f"{self.name}: server refused the connection "
                                  f"(HTTP {exc.response.status_code})") from None
            except InvalidURI:
                raise SourceError(f"not a valid WebSocket URL: {self.name}") from None
            except (OSError, TimeoutError, InvalidHandshake) as exc:
                failures += 1
                if failures > self.max_reconnects:
                    if ever_connected:
                        self.ended_by = f"gave up reconnecting: {exc}"
                        return
                    raise SourceError(f"{self.name}: cannot connect ({exc})") from None
                self._stop.wait(min(5.0, 0.2 * 2 ** failures))
                continue
            if ever_connected:
                self.reconnects += 1
            ever_connected = True
            failures = 0
            last = time.monotonic()
            with ws:
                while True:
                    if self._stop.is_set():
                        self.ended_by = "stopped"
                        return
                    try:
                        msg = ws.recv(timeout=self.poll_s)
                    except TimeoutError:
                        if (self.idle_timeout is not None
                                and time.monotonic() - last >= self.idle_timeout):
                            self.ended_by = f"idle for {self.idle_timeout:g} s"
                            return
                        continue
                    except ConnectionClosedOK:
                        self.ended_by = "closed by the server"
                        return
                    except ConnectionClosed:
                        failures += 1
                        break  # reconnect
                    last = time.monotonic()
                    data = msg.encode("utf-8") if isinstance(msg, str) else bytes(msg)
                    for line in data.splitlines():
                        n += 1
                        yield n, line
            if failures > self.max_reconnects:
                self.ended_by = "connection lost"
                return
            self._stop.wait(min(5.0, 0.2 * 2 ** failures))
        self.ended_by = "stopped"


def open_source(spec: str, *, idle_timeout: float | None = None,
                max_reconnects: int = 5, live: bool | None = None) -> LineSource:
    """``FILE``, ``-`` (stdin), a FIFO path, or ``ws://…`` / ``wss://…``.

    ``live``: whether the producer is proving right now (arrival times are its times);
    None decides by the kind of source (see :class:`StreamSource`).
    """
    if spec.startswith(("ws://", "wss://")):
        ws = WebSocketSource(spec, idle_timeout=idle_timeout, max_reconnects=max_reconnects)
        if live is not None:
            ws.live = live
        return ws
    if spec != "-" and not os.path.exists(spec):
        raise SourceError(f"no such file: {spec}")
    return StreamSource(spec, live=live)
