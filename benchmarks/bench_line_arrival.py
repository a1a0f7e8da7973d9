"""Line-arrival latency of ``proofscope run --map``: when a line is written vs when we see it.

A Node child (the runtime snarkjs uses) logs ``t=<process.hrtime.bigint()>`` every 2 ms;
the pump (integrations/mapped_output.py) stamps each line with ``time.monotonic_ns()`` when
its ``read()`` returns. Both clocks are CLOCK_MONOTONIC on Linux, so the difference is the
delay a phase boundary suffers: the resolution behind ``proofscope.timing=log_arrival``.

Run: ``python benchmarks/bench_line_arrival.py [LINES]`` (needs ``node``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys

from otel_proofscope.integrations.mapped_output import LinePump

CHILD = """
const n = Number(process.argv[1]);
function spin(ms) { const e = process.hrtime.bigint() + BigInt(ms * 1e6);
                    while (process.hrtime.bigint() < e) {} }
for (let i = 0; i < n; i++) { console.log(`t=${process.hrtime.bigint()}`); spin(2); }
"""


def main() -> int:
    if shutil.which("node") is None:
        print("node is not installed", file=sys.stderr)
        return 2
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 500
    child = subprocess.Popen(["node", "-e", CHILD, str(n)], stdout=subprocess.PIPE, bufsize=0)
    assert child.stdout is not None
    delays: list[float] = []
    fd = os.dup(child.stdout.fileno())
    child.stdout.close()
    sink = os.open(os.devnull, os.O_WRONLY)
    pump = LinePump(fd, sink, lambda line, t: delays.append((t - int(line[2:])) / 1e6),
                    print, "stdout")
    pump.start()
    child.wait()
    pump.join(10)
    os.close(sink)
    delays.sort()
    q = lambda p: delays[min(len(delays) - 1, int(p * len(delays)))]  # noqa: E731
    print(f"line arrival delay over {len(delays)} lines: median {statistics.median(delays):.3f}"
          f" ms, p90 {q(0.9):.3f} ms, p99 {q(0.99):.3f} ms, max {delays[-1]:.3f} ms")
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
