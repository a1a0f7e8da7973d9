"""Peak RSS of ``proofscope serve`` under 8 concurrent ~3 MB OTLP/gRPC requests.

Runs the real CLI (``--rerun off``, no token) in a child process, sends 8 requests at
once from 8 threads (each retried on a retryable refusal, as OTLP exporters do), samples
the server's RSS every 10 ms, and reports the peak, what stays resident afterwards, and
how many requests were served at once vs refused with a retry hint. Compared: the
default in-flight byte budget and an effectively unlimited one (the old behaviour).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time

import grpc
import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def request(target_bytes: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    i = 0
    while req.ByteSize() < target_bytes:
        i += 1
        s = ss.spans.add()
        s.trace_id = i.to_bytes(16, "big")
        s.span_id = i.to_bytes(8, "big")
        s.name = "proof.layer"
        s.start_time_unix_nano, s.end_time_unix_nano = 1, 2
        for k in range(6):
            a = s.attributes.add()
            a.key = f"proof.attr{k}"
            a.value.string_value = "v" * 12
        for r in range(16):
            e = s.events.add()
            e.name = "proof.sumcheck.round"
            e.time_unix_nano = 1 + r
            a = e.attributes.add()
            a.key = "proof.sumcheck.poly"
            a.value.string_value = "123456789,987654321,555"
    return bytes(req.SerializeToString())


def run(budget: int | None, body: bytes, clients: int) -> dict[str, float]:
    args = [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
            "--http-port", "off", "--rerun", "off", "--max-message-bytes", str(4 << 20)]
    if budget is not None:
        args += ["--max-inflight-bytes", str(budget)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    endpoint = ""
    while not endpoint:
        line = proc.stdout.readline()
        if "OTLP/gRPC listening on" in line:
            endpoint = line.split("listening on")[1].strip()
    ps = psutil.Process(proc.pid)
    time.sleep(0.5)
    base = ps.memory_info().rss
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, ps.memory_info().rss)
            time.sleep(0.01)

    refused = 0
    lock = threading.Lock()

    def client() -> None:
        nonlocal refused
        with grpc.insecure_channel(endpoint, options=[
                ("grpc.max_send_message_length", 8 << 20)]) as ch:
            call = ch.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
            for _ in range(50):
                try:
                    call(body, timeout=60)
                    return
                except grpc.RpcError as exc:
                    if exc.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED,
                                          grpc.StatusCode.UNAVAILABLE):
                        raise
                    with lock:
                        refused += 1
                    time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.monotonic()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - start
    time.sleep(1.0)
    after = ps.memory_info().rss
    done.set()
    proc.terminate()
    proc.wait(20)
    return {"peak_mb": (peak - base) / 2**20, "after_mb": (after - base) / 2**20,
            "refused": refused, "seconds": took}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    body = request(3 << 20 if not a.quick else 1 << 20)
    print(f"request: {len(body) / 2**20:.1f} MiB, 8 concurrent gRPC clients, pid {os.getpid()}")
    print("| budget | peak RSS over idle | resident 1 s after | refusals (retried) | all 8 "
          "served in |")
    print("|---|---|---|---|---|")
    for name, budget in (("default (16 MiB)", None), ("8 MiB", 8 << 20),
                         ("unlimited (old behaviour)", 1 << 40)):
        r = run(budget, body, 8)
        print(f"| {name} | {r['peak_mb']:.0f} MB | {r['after_mb']:.0f} MB | "
              f"{r['refused']:.0f} | {r['seconds']:.1f} s |")


if __name__ == "__main__":
    main()
