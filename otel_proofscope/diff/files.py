"""Opening the two inputs: a trace file, or a folder holding ``traces.jsonl``.

The only module of the diff that touches the file system for reading. A file that
cannot be compared at all (missing, unreadable, or without a single decodable span)
raises :class:`InputError` naming the file and, where there is one, the line.
"""

from __future__ import annotations

from pathlib import Path

from otel_proofscope.diff.traces import TraceFile, read_lines

#: The file a folder stands for (what ``demo``/``configure()`` write).
TRACES_FILE = "traces.jsonl"


class InputError(ValueError):
    """An input that cannot be compared; the message names the file (and line)."""


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
            traces = read_lines(fh, str(resolved))
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
