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

#: The JSON-lines files a run writes in its output directory.
RUN_FILES = ("traces.jsonl", "metrics.jsonl")


def start_fresh(out_dir: Path) -> list[Path]:
    """Remove the previous run's JSON-lines files from ``out_dir``; returns those removed."""
    removed = []
    for name in RUN_FILES:
        path = out_dir / name
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed
