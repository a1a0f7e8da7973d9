"""Opening the two inputs: a trace file, or a folder holding ``traces.jsonl``.

The only module of the diff that touches the file system for reading. A file that
cannot be compared at all (missing, unreadable, or without a single decodable span)
raises :class:`InputError` naming the file and, where there is one, the line.

Reads are bounded: a line longer than :data:`MAX_LINE_BYTES` or an input longer than
:data:`MAX_INPUT_BYTES` is an :class:`InputError`, never an unbounded buffer
(``diff base /dev/zero`` grew from 634 MB to 4 GB in 8 s looking for a newline).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from otel_proofscope.diff.traces import TraceFile, read_lines

#: The file a folder stands for (what ``demo``/``configure()`` write).
TRACES_FILE = "traces.jsonl"


#: The longest line read: one batch of a trace file (512 spans of 32 rounds each is
#: ~5 MB of OTLP/JSON), with room to spare.
MAX_LINE_BYTES = 64 << 20
#: The most read from one input: ~10 million spans' lines, held as small records.
MAX_INPUT_BYTES = 2 << 30


class InputError(ValueError):
    """An input that cannot be compared; the message names the file (and line)."""


def bounded_lines(fh: BinaryIO, source: str, max_line: int | None = None,
                  max_total: int | None = None) -> Iterator[bytes]:
    """The lines of ``fh``, each at most ``max_line`` bytes and ``max_total`` in all;
    :class:`InputError` naming ``source`` (and the line) past either cap."""
    max_line = MAX_LINE_BYTES if max_line is None else max_line
    max_total = MAX_INPUT_BYTES if max_total is None else max_total
    total = 0
    number = 0
    while True:
        line = fh.readline(max_line + 1)
        if not line:
            return
        number += 1
        total += len(line)
        if len(line) > max_line:
            raise InputError(f"{source}:{number}: a line longer than {_size(max_line)} "
                             f"(not OTLP/JSON lines?)")
        if total > max_total:
            raise InputError(f"{source}: longer than {_size(max_total)}, the most one "
                             f"input may hold (stopped at line {number})")
        yield line


def _size(n: int) -> str:
    return f"{n / (1 << 30):g} GiB" if n >= 1 << 30 else f"{n / (1 << 20):g} MiB" \
        if n >= 1 << 20 else f"{n} bytes"


def resolve(path: Path) -> Path:
    if path.is_dir():
        inner = path / TRACES_FILE
        if not inner.is_file():
            raise InputError(f"{path}: a folder, but it holds no {TRACES_FILE}")
        return inner
    if not path.exists():
        raise InputError(f"{path}: no such file")
    return path


def read(path: Path) -> TraceFile:
    """Read one input; partial damage is counted in the result, total damage raises."""
    resolved = resolve(path)
    try:
        with resolved.open("rb") as fh:
            traces = read_lines(bounded_lines(fh, str(resolved)), str(resolved))
    except OSError as exc:
        raise InputError(f"{resolved}: cannot be read: {exc.strerror or exc}") from None
    if not traces.spans:
        if traces.bad_lines:
            first = traces.bad_lines[0]
            raise InputError(f"{traces.where(first)}: {first.reason} "
                             f"({traces.bad_line_count} bad line(s), no spans)")
        if traces.rejected_spans:
            raise InputError(f"{resolved}: every span was rejected "
                             f"({traces.rejected_reasons[0]})")
        raise InputError(f"{resolved}: no spans (expected OTLP/JSON lines of "
                         f"ExportTraceServiceRequest, as traces.jsonl holds)")
    return traces
