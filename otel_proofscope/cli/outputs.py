"""Each CLI run starts its output files afresh.

The Rerun recording of a run is always rewritten, while the OTel file exporter appends
to ``traces.jsonl`` / ``metrics.jsonl``; a directory reused across runs therefore held
one recording next to the lines of every earlier run. ``proofscope demo``, ``replay``
and ``run`` are one run each, so they remove the previous run's JSON lines before they
start: all three files then describe the same run. (``configure()`` in a user's
program still appends: several processes of one job may share a directory.)
"""

from __future__ import annotations

from pathlib import Path

from otel_proofscope.pipeline.output_files import UnsafeOutputError, check_folder, refuse_link

#: The JSON-lines files a run writes in its output directory.
RUN_FILES = ("traces.jsonl", "metrics.jsonl")


def start_fresh(out_dir: Path) -> list[Path]:
    """Remove the previous run's JSON-lines files from ``out_dir``; returns those removed."""
    removed = []
    for name in RUN_FILES:
        path = out_dir / name
        try:
            path.unlink()  # a planted link is removed, never its target
        except (FileNotFoundError, NotADirectoryError):
            continue  # NotADirectoryError: OUT is a file (check_outputs names it)
        removed.append(path)
    return removed


def check_outputs(out_dir: Path, rerun: str | None, flag: str = "--out") -> str | None:
    """Why ``out_dir`` cannot take a run's files, or None: it is a file, it cannot be
    written, or a symbolic link sits where the recording goes (``rerun`` None: the
    default ``OUT/proofscope.rrd``). Checked before anything is written, so the user
    reads one line naming ``flag``, not a traceback."""
    recording = (out_dir / "proofscope.rrd" if rerun is None
                 else Path(rerun[5:]).expanduser() if rerun.lower().startswith("file:")
                 else None)
    try:
        check_folder(out_dir, flag)
        if recording is not None:
            refuse_link(recording, "recording")
    except UnsafeOutputError as exc:
        return str(exc.strerror or exc)
    return None
