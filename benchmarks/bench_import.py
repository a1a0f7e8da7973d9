"""``proofscope import``: wall time, CPU time and peak RSS on two large Chrome traces.

* ``toy``: the viztracer trace of ``examples/toy_prover.py`` (the README's example),
  recorded once with ``viztracer -o toy.json examples/toy_prover.py``: 657k entries,
  103 MB while the Rerun sink ran in the prover's process; 333k entries, 54 MB since the
  export process draws it (2026-12-03: viztracer traces only the prover's process);
* ``synthetic``: a generated ~100 MB file of 1,000,000 complete events (4 threads,
  trees of 91 spans three levels deep, two small args each), written by this script.

Each import is the real CLI in a child process with its default sinks (OTLP/JSON-lines
files and a Rerun ``.rrd``), runs interleaved (toy, synthetic, toy, …); peak RSS and CPU
time are the child's own (``os.wait4``: its ``ru_maxrss`` is the larger of its own peak and
its export process's, the Rerun drawing); "tree peak" is the largest sum of both, sampled
every 0.1 s from ``/proc``. Sizes are MiB (printed "MB"). Big files go to ``--work``
(default a folder under /tmp), never into the checkout.

    python benchmarks/bench_import.py [--runs 5] [--work /tmp/bench-import] \
        [--cpus 0,1] [--only toy|synthetic] [--pythonpath CHECKOUT] [--rerun off]

``--pythonpath`` runs another checkout's code (e.g. the main branch) for a before/after.
Prints a Markdown table: median (range) of the runs, and the drop lines of the last run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def toy_trace(work: Path) -> Path:
    path = work / "toy.json"
    if not path.exists():
        subprocess.run(["viztracer", "--quiet", "-o", str(path), str(ROOT / "examples" /
                        "toy_prover.py"), str(work / "toy-out")], check=True, cwd=work,
                       env=_env(None), capture_output=True)
    return path


def synthetic_trace(work: Path, events: int = 1_000_000) -> Path:
    """~100 bytes an event: trees of 1 + 9 + 81 spans (durations 1000, 100, 10 µs)."""
    path = work / "synthetic.json"
    if path.exists():
        return path
    with path.open("w") as f:
        f.write('{"traceEvents": [\n')
        f.write(json.dumps({"ph": "M", "name": "process_name", "pid": 7,
                            "args": {"name": "synthetic-prover"}}))
        n = 0
        tree = 0
        while n < events:
            tid = 1 + tree % 4
            base = (tree // 4) * 1100.0
            spans = [("shard_prove", base, 1000.0, 0)]
            for c in range(9):
                child = base + 1 + c * 110
                spans.append(("commit_traces", child, 100.0, c))
                spans += [("sumcheck_round", child + 1 + g * 11, 10.0, g) for g in range(9)]
            for name, ts, dur, k in spans:
                if n >= events:
                    break
                f.write(f',\n{{"ph":"X","name":"{name}","pid":7,'
                        f'"tid":{tid},"ts":{ts + 0.125:.3f},"dur":{dur - 0.25:.3f},'
                        f'"args":{{"shard":{tree},"round":{k}}}}}')
                n += 1
            tree += 1
        f.write("\n]}\n")
    return path


def _env(pythonpath: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath or str(ROOT)
    env.setdefault("XDG_RUNTIME_DIR", tempfile.mkdtemp())
    return env


def _tree_rss(pid: int) -> int:
    """Bytes resident in ``pid`` and its descendants now (0 once it is gone)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


class _TreePeak(threading.Thread):
    """The largest sum of RSS over a process tree, sampled every 0.1 s: the import's
    export process (Rerun) runs beside it, and ``ru_maxrss`` gives only the larger of
    the two peaks, not what both hold at once."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.1):
            self.peak = max(self.peak, _tree_rss(self.pid))


def import_once(trace: Path, work: Path, cpus: set[int] | None, pythonpath: str | None,
                rerun: str = "file") -> tuple[float, float, float, float, list[str]]:
    """(wall s, CPU s, peak RSS MB, peak tree RSS MB, summary's drop lines) of one
    import."""
    out = Path(tempfile.mkdtemp(dir=work, prefix="out-"))
    cmd = [sys.executable, "-m", "otel_proofscope", "import", str(trace), "--out",
           str(out), "--rerun", f"file:{out / 'import.rrd'}" if rerun == "file" else rerun]
    preexec = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=_env(pythonpath), preexec_fn=preexec, text=True,
                            cwd=out)  # not the checkout: `-m` would import it first
    assert proc.stderr is not None
    tree = _TreePeak(proc.pid)
    tree.start()
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    tree.done.set()
    tree.join()
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"import failed ({proc.returncode}):\n{err[-2000:]}")
    for p in sorted(out.iterdir()):  # the outputs are GBs over the runs
        p.unlink()
    out.rmdir()
    lines = [ln for ln in err.splitlines() if "proofscope import:" in ln and (
        "dropped" in ln or "→" in ln or "drawn" in ln or "imported" in ln)]
    return (wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            tree.peak / 2**20, lines)


def _cell(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "bench-import")
    ap.add_argument("--cpus", default=None, help="pin the imports to these CPUs (0,1)")
    ap.add_argument("--only", choices=("toy", "synthetic"), default=None)
    ap.add_argument("--pythonpath", default=None, help="another checkout to measure")
    ap.add_argument("--rerun", default="file", help="'file' (default: a .rrd in the output "
                    "folder) or any --rerun target, e.g. 'off' to measure without the Rerun "
                    "sink (no export process)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    traces = {}
    if args.only in (None, "toy"):
        traces["toy"] = toy_trace(args.work)
    if args.only in (None, "synthetic"):
        traces["synthetic"] = synthetic_trace(args.work)
    results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in traces}
    last: dict[str, list[str]] = {}
    for run in range(args.runs):
        for name, path in traces.items():
            wall, cpu, rss, tree, lines = import_once(path, args.work, cpus,
                                                      args.pythonpath, args.rerun)
            results[name].append((wall, cpu, rss, tree))
            last[name] = lines
            print(f"run {run + 1} {name}: {wall:.1f} s wall, {cpu:.1f} s CPU, "
                  f"{rss:.0f} MB peak RSS, {tree:.0f} MB peak RSS of the process tree",
                  file=sys.stderr, flush=True)
    load = os.getloadavg()
    print(f"\n{args.runs} runs, load average at the end {load[0]:.1f} / {load[1]:.1f} / "
          f"{load[2]:.1f}, {os.cpu_count()} CPUs" + (f", pinned to {args.cpus}"
                                                      if args.cpus else "")
          + (f", --rerun {args.rerun}" if args.rerun != "file" else ""))
    print("\n| trace | file | wall s | CPU s | peak RSS MB | RSS / file | tree peak MB |"
          " tree / file |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        size = traces[name].stat().st_size / 2**20
        walls, cpus_s, rss, tree = ([r[i] for r in rows] for i in range(4))
        print(f"| {name} | {size:.0f} MB | {_cell(walls, '.0f')} | {_cell(cpus_s, '.0f')} | "
              f"{_cell(rss, '.0f')} | {statistics.median(rss) / size:.1f}x | "
              f"{_cell(tree, '.0f')} | {statistics.median(tree) / size:.1f}x |")
    for name, lines in last.items():
        print(f"\n{name}, last run:")
        for line in lines:
            print("    " + line.replace("proofscope import: ", ""))


if __name__ == "__main__":
    main()
