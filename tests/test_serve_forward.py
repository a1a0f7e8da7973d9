"""`proofscope serve --forward`: what serve receives goes on over OTLP to a real
receiver on 127.0.0.1, mapped (the original name kept), with the proof metrics the
mapped spans imply, so Grafana sees a foreign prover; forwarding to serve itself is
refused. Both protocols (gRPC, HTTP/protobuf) and both sources of the endpoint
(``--forward``, else ``$OTEL_EXPORTER_OTLP_ENDPOINT``) are covered."""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
    OTLPMetricExporter as GrpcMetricExporter,
)
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
    OTLPSpanExporter as GrpcSpanExporter,
)
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2_grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from serve_helpers import ProtobufReplies, read_until

from otel_proofscope.semconv import Attr, Metric

PROCESS_TIMEOUT_S = 60
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_PROTOCOL"
#: A metric point the prover sends to serve, to be forwarded as it is.
PROVER_METRIC = "toy.proofs"

RULES = """
[meta]
name = "toy"
system = "toyvm"

[[span]]
match = "toy_prove"
to = "proof"

[[span]]
match = "toy_sumcheck"
to = "layer"

[[span]]
match = "toy_round"
to = "round"
"""


class Collector(trace_service_pb2_grpc.TraceServiceServicer,  # type: ignore[misc]
                metrics_service_pb2_grpc.MetricsServiceServicer):  # type: ignore[misc]
    """A real OTLP/gRPC receiver for both signals; records what arrives."""

    def __init__(self) -> None:
        self.traces: list[ExportTraceServiceRequest] = []
        self.metrics: list[ExportMetricsServiceRequest] = []
        #: The paths POSTed to (the OTLP/HTTP route only).
        self.paths: list[str] = []
        self.lock = threading.Lock()

    def Export(self, request: Any, context: Any) -> Any:
        with self.lock:
            if isinstance(request, ExportTraceServiceRequest):
                self.traces.append(request)
                return ExportTraceServiceResponse()
            self.metrics.append(request)
            return ExportMetricsServiceResponse()

    def spans(self) -> list[Any]:
        return [s for r in self.traces for rs in r.resource_spans for ss in rs.scope_spans
                for s in ss.spans]

    def metric_names(self) -> set[str]:
        return {m.name for r in self.metrics for rm in r.resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}


@pytest.fixture
def collector() -> Iterator[tuple[Collector, int]]:
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(c, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(c, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield c, port
    server.stop(0)


_HTTP_ROUTES: dict[str, Any] = {"/v1/traces": ExportTraceServiceRequest,
                                "/v1/metrics": ExportMetricsServiceRequest}


@pytest.fixture
def http_collector() -> Iterator[tuple[Collector, int]]:
    """The same Collector behind a real OTLP/HTTP endpoint: binary protobuf POSTed to
    /v1/traces and /v1/metrics; any other path is 404, any other body type 415."""
    c = Collector()

    class Handler(ProtobufReplies):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            with c.lock:
                c.paths.append(self.path)
            kind = _HTTP_ROUTES.get(self.path)
            payload = b""
            if kind is None:
                status = 404
            elif self.headers.get_content_type() != "application/x-protobuf":
                status = 415
            else:
                status = 200
                payload = c.Export(kind.FromString(body), None).SerializeToString()
            self.reply(status, payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield c, int(server.server_address[1])
    server.shutdown()
    server.server_close()
    thread.join(5)


def _foreign_proof() -> list[Any]:
    memory = InMemorySpanExporter()
    tp = TracerProvider(resource=Resource({"service.name": "toy-prover"}))
    tp.add_span_processor(SimpleSpanProcessor(memory))
    tracer = tp.get_tracer("toy")
    with tracer.start_as_current_span("toy_prove"):
        for _ in range(2):
            with tracer.start_as_current_span("toy_sumcheck"):
                for _ in range(3):
                    with tracer.start_as_current_span("toy_round"):
                        pass
        with tracer.start_as_current_span("unrelated"):
            pass
    tp.shutdown()
    return list(memory.get_finished_spans())


def _prover_metrics() -> Any:
    """One counter point from the prover's own SDK, as its exporter would send it."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader],
                             resource=Resource({"service.name": "toy-prover"}))
    provider.get_meter("toy").create_counter(PROVER_METRIC).add(1)
    data = reader.get_metrics_data()
    provider.shutdown()
    return data


def _serve(tmp_path: Path, *extra: str,
           env_vars: dict[str, str] | None = None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PROOFSCOPE_"))}
    env["XDG_RUNTIME_DIR"] = str(tmp_path)
    env.update(env_vars or {})
    return subprocess.Popen(
        [sys.executable, "-m", "otel_proofscope", "serve", "--grpc-port", "0",
         "--http-port", "off", "--rerun", "off", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _through_serve(tmp_path: Path, *args: str, env_vars: dict[str, str] | None = None,
                   send_metrics: bool = False) -> tuple[str, str]:
    """Run serve (mapping the toy prover), send it the foreign proof (and, with
    ``send_metrics``, one metric point) over OTLP/gRPC with the official exporters,
    stop it with SIGTERM; return (stdout, stderr) once it exited 0."""
    rules = tmp_path / "toy.toml"
    rules.write_text(RULES)
    proc = _serve(tmp_path, "--map", str(rules), *args, env_vars=env_vars)
    killer = threading.Timer(PROCESS_TIMEOUT_S, proc.kill)
    killer.start()
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        exporter = GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        assert exporter.export(_foreign_proof()).name == "SUCCESS"
        exporter.shutdown()
        if send_metrics:
            metrics = GrpcMetricExporter(endpoint=endpoint, insecure=True, timeout=5)
            assert metrics.export(_prover_metrics()) is MetricExportResult.SUCCESS
            metrics.shutdown()
        proc.send_signal(signal.SIGTERM)
        # read(), not communicate(): that reads the pipe itself, and would skip the
        # lines (Rerun:, mapping:, forwarding to) read_until's iteration buffered.
        assert proc.stdout is not None and proc.stderr is not None
        out = proc.stdout.read()
        err = proc.stderr.read()
        proc.wait(PROCESS_TIMEOUT_S)
    finally:
        killer.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    return "".join(lines) + out, err


def _assert_mapped_proof_arrived(received: Collector, summary: str, err: str) -> None:
    spans = received.spans()
    names = sorted(s.name for s in spans)
    # mapped names; the rounds are events of their layer too; the rest forwarded as is
    assert names == ["proof", "proof.layer", "proof.layer", *["toy_round"] * 6,
                     "unrelated"], (names, summary, err)
    source = {s.name: {kv.key: kv.value.string_value for kv in s.attributes}
              .get(Attr.MAPPING_SOURCE_NAME) for s in spans}
    assert source["proof"] == "toy_prove" and source["proof.layer"] == "toy_sumcheck"
    layers = [s for s in spans if s.name == "proof.layer"]
    assert all(sum(e.name == "proof.sumcheck.round" for e in s.events) == 3 for s in layers)
    metric_names = received.metric_names()
    assert {Metric.PROOF_DURATION.name, Metric.PROOF_LAYER_DURATION.name,
            Metric.PROOF_SUMCHECK_ROUND_COUNT.name} <= metric_names, metric_names
    rounds = [dp.as_int for r in received.metrics for rm in r.resource_metrics
              for sm in rm.scope_metrics for m in sm.metrics
              if m.name == Metric.PROOF_SUMCHECK_ROUND_COUNT.name
              for dp in m.sum.data_points]
    assert rounds and rounds[-1] == 6


def test_serve_forwards_mapped_spans_and_proof_metrics(
        tmp_path: Path, collector: tuple[Collector, int]) -> None:
    received, port = collector
    summary, err = _through_serve(tmp_path, "--forward", f"http://127.0.0.1:{port}")
    assert f"forwarding to http://127.0.0.1:{port} (grpc)" in summary, summary
    _assert_mapped_proof_arrived(received, summary, err)
    assert "forwarded to http://127.0.0.1:" in summary and ": 10 spans" in summary, summary


def test_serve_forwards_over_http_protobuf(
        tmp_path: Path, http_collector: tuple[Collector, int]) -> None:
    """``--forward-protocol http/protobuf``: spans to ENDPOINT/v1/traces, the received
    and the implied metrics to ENDPOINT/v1/metrics; the flag wins over the variable."""
    received, port = http_collector
    summary, err = _through_serve(
        tmp_path, "--forward", f"http://127.0.0.1:{port}/", "--forward-protocol",
        "http/protobuf", env_vars={PROTOCOL_ENV: "grpc"}, send_metrics=True)
    assert f"forwarding to http://127.0.0.1:{port}/ (http/protobuf)" in summary, summary
    _assert_mapped_proof_arrived(received, summary, err)
    assert set(received.paths) == set(_HTTP_ROUTES), received.paths
    assert PROVER_METRIC in received.metric_names(), received.metric_names()
    assert re.search(r"\(http/protobuf\): 10 spans, [1-9]\d* received metric points, "
                     r"[1-9]\d* proof metric points", summary), summary


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_serve_forwards_to_the_otlp_endpoint_variable(
        tmp_path: Path, request: pytest.FixtureRequest, protocol: str) -> None:
    """No ``--forward``: ``$OTEL_EXPORTER_OTLP_ENDPOINT`` is the endpoint, spoken in
    ``$OTEL_EXPORTER_OTLP_PROTOCOL`` (unset: grpc)."""
    grpc_default = protocol == "grpc"
    received, port = request.getfixturevalue("collector" if grpc_default
                                             else "http_collector")
    env_vars = {ENDPOINT_ENV: f"http://127.0.0.1:{port}"}
    if not grpc_default:
        env_vars[PROTOCOL_ENV] = protocol
    summary, err = _through_serve(tmp_path, env_vars=env_vars)
    assert f"forwarding to http://127.0.0.1:{port} ({protocol})" in summary, (summary, err)
    _assert_mapped_proof_arrived(received, summary, err)
    assert f"({protocol}): 10 spans" in summary, summary


def test_forward_off_beats_the_otlp_endpoint_variable(
        tmp_path: Path, collector: tuple[Collector, int]) -> None:
    received, port = collector
    summary, _ = _through_serve(tmp_path, "--forward", "off",
                                env_vars={ENDPOINT_ENV: f"http://127.0.0.1:{port}"})
    assert "spans_accepted=10" in summary, summary
    assert "forwarding to" not in summary and "forwarded to" not in summary, summary
    assert received.spans() == [] and received.metrics == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("cause", ["own port", "bad protocol"])
def test_unusable_otlp_endpoint_variable_is_a_warning_not_a_refusal(
        tmp_path: Path, cause: str) -> None:
    """The variable may have been exported for the prover (pointing at serve itself)
    or with another protocol: serve warns, names it, and serves without forwarding;
    the same endpoint given with ``--forward`` is refused (exit 2, tested below)."""
    own = _free_port()
    if cause == "own port":
        args: tuple[str, ...] = ("--grpc-port", str(own))
        env_vars = {ENDPOINT_ENV: f"http://127.0.0.1:{own}"}
        why = "loop"
    else:
        args = ()
        env_vars = {ENDPOINT_ENV: f"http://127.0.0.1:{_free_port()}",
                    PROTOCOL_ENV: "carrier-pigeon"}
        why = "carrier-pigeon"
    summary, err = _through_serve(tmp_path, *args, env_vars=env_vars)
    assert f"warning: not forwarding to ${ENDPOINT_ENV}" in err and why in err, err
    assert "spans_accepted=10" in summary, summary
    assert "forwarding to" not in summary and "forwarded to" not in summary, summary


def _refused(tmp_path: Path, *args: str,
             env_vars: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """Serve started with ``args`` (expected to stop at once): (exit code, out, err)."""
    proc = _serve(tmp_path, *args, env_vars=env_vars)
    try:
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_serve_refuses_to_forward_to_itself(tmp_path: Path) -> None:
    code, _, err = _refused(tmp_path, "--forward", "http://127.0.0.1:4317",
                            "--grpc-port", "4317")
    assert code == 2
    assert "--forward" in err and "loop" in err


@pytest.mark.parametrize("header_env", ["OTEL_EXPORTER_OTLP_HEADERS",
                                        "OTEL_EXPORTER_OTLP_METRICS_HEADERS"])
def test_serve_never_forwards_its_own_token(tmp_path: Path, header_env: str) -> None:
    """A shell that set the prover's headers to serve's own token: the forward exporters
    would send it on, so --forward is refused, naming the variable, not the token."""
    token = "s3cret-token-of-serve"
    code, out, err = _refused(tmp_path, "--forward", f"http://127.0.0.1:{_free_port()}",
                              env_vars={"PROOFSCOPE_SERVE_TOKEN": token,
                                        header_env: f"authorization=Bearer {token}"})
    assert code == 2, err
    assert f"${header_env} holds this serve's own token" in err, err
    assert token not in err and token not in out


def test_the_token_check_reads_headers_as_the_exporters_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """URL-encoded (as the OTLP spec writes them) or not, the token as a header's value
    or after its scheme is caught; a longer value that merely contains it is not it."""
    from otel_proofscope.cli.serve_forward import ForwardError, check_token_stays

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "authorization=Bearer%20tok")
    with pytest.raises(ForwardError, match="OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        check_token_stays("tok")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-api-key=tok")
    with pytest.raises(ForwardError):
        check_token_stays("tok")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-request-id=stock-42")
    check_token_stays("tok")  # another value that contains the letters: not the token
    check_token_stays(None)


def test_serve_wants_a_base_url_for_http_protobuf(tmp_path: Path) -> None:
    """/v1/traces is added to an OTLP/HTTP endpoint: one given with it would post to
    /v1/traces/v1/traces and lose every span, so it is refused with the reason."""
    code, _, err = _refused(tmp_path, "--forward",
                            f"http://127.0.0.1:{_free_port()}/v1/traces",
                            "--forward-protocol", "http/protobuf")
    assert code == 2, err
    assert "give the base URL (without /v1/traces)" in err, err


def test_serve_counts_what_it_cannot_forward(tmp_path: Path) -> None:
    """A forward endpoint that is down: every span is counted, never lost silently."""
    dead = _free_port()  # a port with nothing behind it
    proc = _serve(tmp_path, "--forward", f"http://127.0.0.1:{dead}")
    lines: list[str] = []
    try:
        endpoint = read_until(proc, "OTLP/gRPC listening on", lines)
        exporter = GrpcSpanExporter(endpoint=endpoint, insecure=True, timeout=5)
        assert exporter.export(_foreign_proof()).name == "SUCCESS"
        exporter.shutdown()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err
    summary = "".join(lines) + out
    assert ": 0 spans" in summary
    lost = sum(int(n) for n, reason in re.findall(
        r"(\d+) spans → forward \((\w+)\)", summary))
    assert lost == 10, summary
