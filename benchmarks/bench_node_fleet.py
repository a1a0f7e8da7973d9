"""A fleet of non-Python provers against one ``proofscope serve`` (issue 29, decision 5).

Run: python benchmarks/bench_node_fleet.py [--grpc 8 --http 8 --layers 250 --rounds 128]

Needs Node and the pinned OpenTelemetry JS packages: ``npm ci --prefix
benchmarks/node_fleet`` (``benchmarks/node_fleet/package.json``: ``@opentelemetry/sdk-trace``
with ``BatchSpanProcessor``, the official ``exporter-trace-otlp-grpc`` and
``exporter-trace-otlp-proto``, default settings and retries).

Starts ``proofscope serve`` (gRPC and HTTP on free ports, ``--rerun file:``), then
``--grpc`` + ``--http`` Node processes at once (``benchmarks/node_fleet/prover.mjs``),
each sending one proof: a ``proof`` root, ``--layers`` ``proof.layer`` spans with
``--rounds`` ``proof.sumcheck.round`` events each, a ``proof.verify``. Each prover reports
the spans its exporter accepted after its own retries and every failure. Then serve is
left to go idle (its CPU time stops moving) and stopped; its summary says how many spans
it drew and why any were not.

The run passes when every prover's every export succeeded and serve drew every span.
Printed: per protocol, spans handed to the exporters / exported / failed; serve's
requests refused as busy or over its byte budget (senders retried them); serve's CPU
from "listening" to idle (µs per span and per round event) and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLEET = Path(__file__).resolve().parent / "node_fleet"
#: Serve is idle once its CPU time has not moved for this long.
IDLE_S = 1.0
#: Bound on the whole fleet (the exporters' retries included).
FLEET_TIMEOUT_S = 900.0


def missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not installed (Debian: apt-get install nodejs npm)"
    if not (FLEET / "node_modules" / "@opentelemetry" / "sdk-trace").is_dir():
        return f"the OpenTelemetry JS packages are not installed: npm ci --prefix {FLEET}"
    return None


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc", type=int, default=8, help="provers over OTLP/gRPC")
    parser.add_argument("--http", type=int, default=8, help="provers over OTLP/HTTP protobuf")
    parser.add_argument("--layers", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=128)
    parser.add_argument("--layer-ms", type=float, default=0.0,
                        help="each prover's time per layer (a timer), so that its batch "
                             "processor exports on its schedule (default 0: the whole proof "
                             "at once, exported at the final flush)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for serve (repeat), e.g. "
                             "--serve-arg=--max-message-bytes=16777216")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose serve runs")
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"bench_node_fleet: {why}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp), "PYTHONPATH": str(args.root)}
        serve = subprocess.Popen(
            [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
             "--http-port", "0", "--rerun", f"file:{tmp / 'fleet.rrd'}", *args.serve_arg],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            cwd=args.root)
        assert serve.stdout is not None
        grpc_url = http_url = ""
        for line in serve.stdout:
            if line.startswith("OTLP/gRPC listening on"):
                grpc_url = "http://" + line.split()[-1]
            elif line.startswith("OTLP/HTTP listening on"):
                http_url = line.split()[-1]
            if grpc_url and http_url:
                break
        cpu0 = _cpu(serve.pid)
        start = time.perf_counter()
        provers = []
        for protocol, n, url in (("grpc", args.grpc, grpc_url), ("http", args.http, http_url)):
            for i in range(n):
                provers.append(subprocess.Popen(
                    ["node", str(FLEET / "prover.mjs"), protocol, url, f"prover-{protocol}-{i}",
                     str(args.layers), str(args.rounds), str(args.layer_ms)],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=FLEET))
        results = []
        deadline = start + FLEET_TIMEOUT_S
        for p in provers:
            try:
                out, err = p.communicate(timeout=max(1.0, deadline - time.perf_counter()))
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            line = next((x for x in out.splitlines() if x.startswith("{")), "")
            results.append(json.loads(line) if line else
                           {"name": "?", "protocol": "?", "handed": 0, "ok": 0, "failed": 0,
                            "errors": [f"exit {p.returncode}: {err.strip()[-300:]}"]})
        fleet_s = time.perf_counter() - start
        last, changed = _cpu(serve.pid), time.perf_counter()
        while time.perf_counter() - changed < IDLE_S:
            time.sleep(0.05)
            now = _cpu(serve.pid)
            if now != last:
                last, changed = now, time.perf_counter()
        busy_s, cpu_s = changed - start, last - cpu0
        serve.send_signal(signal.SIGTERM)
        summary, _ = serve.communicate(timeout=60)
    spans = sum(r["handed"] for r in results)
    ok = sum(r["ok"] for r in results)
    failed = sum(r["failed"] for r in results)
    expected = (args.grpc + args.http) * (args.layers + 2)
    print(f"{args.grpc} gRPC + {args.http} HTTP provers, {args.layers} layers x {args.rounds} "
          f"rounds each, {args.layer_ms} ms a layer; serve from {args.root} "
          f"{' '.join(args.serve_arg)}")
    for protocol in ("grpc", "http"):
        rs = [r for r in results if r["protocol"] == protocol]
        print(f"  {protocol}: handed {sum(r['handed'] for r in rs)}, exported "
              f"{sum(r['ok'] for r in rs)}, failed {sum(r['failed'] for r in rs)}; per prover "
              f"exported: {[r['ok'] for r in rs]}")
    for r in results:
        for e in r["errors"]:
            print(f"  {r['name']}: {e}")
        if r.get("flush_error"):
            print(f"  {r['name']}: flush: {r['flush_error'][:200]}")
    received = next((x for x in summary.splitlines() if x.startswith("received:")), "")
    drawn_line = next((x for x in summary.splitlines() if x.startswith("rerun: drawn")), "")
    refused = {k: int(v) for k, v in re.findall(r"requests\.traces\.(\w+)=(\d+)", received)}
    m = re.match(r"rerun: drawn (\d+) spans?", drawn_line)
    drawn = int(m.group(1)) if m else -1
    events = ok * args.rounds  # layer spans dominate; the two others carry none
    print(f"  serve: {received}")
    print(f"  serve: {drawn_line}")
    refusals = ", ".join(f"{k}={v}" for k, v in refused.items() if k != "ok") or "none"
    print(f"  serve CPU {cpu_s:.2f} s listening → idle ({cpu_s / max(ok, 1) * 1e6:,.0f} µs per "
          f"span, {cpu_s / max(events, 1) * 1e6:.1f} µs per round event); fleet done in "
          f"{fleet_s:.1f} s, serve idle {busy_s:.1f} s after the start; refused requests "
          f"(retried by the exporters): {refusals}")
    passed = failed == 0 and ok == spans == expected and drawn == ok
    print("PASS: every export succeeded within the exporters' default retries and serve drew "
          "every span" if passed else
          f"FAIL: {failed} spans failed, {spans}/{expected} handed, {drawn} drawn of {ok}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
