"""serve's in-flight byte budget: an HTTP request past it is refused at once with a retry
hint and counted; a gRPC request (it has a deadline) is held for room until its answer
is due, then refused so; the ones within it are served."""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence

import grpc
import pytest
from google.rpc.error_details_pb2 import RetryInfo
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from otel_proofscope.integrations.otlp_receiver import OtlpReceiver
from otel_proofscope.ledger import DROPS

pytestmark = pytest.mark.chaos

BUDGET = 1 << 20


class Held(SpanExporter):
    """A downstream sink that holds the first export until released (a slow Rerun)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.release.wait(20)
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.release.set()


def _request(spans: int, pad: int) -> bytes:
    req = ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i in range(spans):
        s = ss.spans.add()
        s.trace_id = bytes(15) + bytes([1])
        s.span_id = bytes(7) + bytes([i + 1])
        s.name = "x" * pad
        s.start_time_unix_nano = 1
        s.end_time_unix_nano = 2
    return bytes(req.SerializeToString())



@contextlib.contextmanager
def _receiver(held: Held) -> Iterator[tuple[OtlpReceiver, grpc.UnaryUnaryMultiCallable]]:
    """A receiver with a 1 MiB budget in front of ``held``, and its gRPC Export call."""
    receiver = OtlpReceiver([held], [], grpc_port=0, http_port=0,
                            max_message_bytes=4 << 20, max_inflight_bytes=BUDGET)
    receiver.start()
    channel = grpc.insecure_channel(receiver.grpc_endpoint or "")
    try:
        yield receiver, channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None, response_deserializer=None)
    finally:
        held.release.set()
        channel.close()
        receiver.stop()


def test_requests_past_the_budget_get_a_retry_hint_and_are_counted() -> None:
    held = Held()
    with _receiver(held) as (receiver, export):
        big = _request(8, 100_000)  # ~800 KB: fits alone
        first = export.future(big, timeout=20)
        assert held.entered.wait(10)
        # a second one does not fit next to the first: held until its answer is due
        # (deadline less max(2 s, 30 %)), then refused with RetryInfo
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            export(big, timeout=3)
        assert time.monotonic() - start >= 0.9
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(err.value.trailing_metadata() or ())
        info = RetryInfo.FromString(trailing["google.rpc.retryinfo-bin"])
        assert info.retry_delay.seconds >= 1
        # HTTP: 503 with Retry-After
        http = urllib.request.Request(f"{receiver.http_endpoint}/v1/traces", data=big,
                                      headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as herr:
            urllib.request.urlopen(http, timeout=5)
        assert herr.value.code == 503
        assert herr.value.headers["Retry-After"] == "1"
        held.release.set()
        first.result(timeout=20)
        # within the budget again: served
        export(big, timeout=20)
        assert held.spans == 16
        assert DROPS.total(signal="otlp_traces_requests", reason="queue_full") == 2


def test_a_grpc_request_past_the_budget_is_served_once_room_comes_within_its_deadline() -> None:
    # The official JS gRPC exporter never retries: a refusal is a lost export.
    held = Held()
    ledger_before = DROPS.total(signal="otlp_traces_requests")
    with _receiver(held) as (receiver, export):
        big = _request(8, 100_000)
        first = export.future(big, timeout=20)
        assert held.entered.wait(10)
        second = export.future(big, timeout=10)  # held: over the budget beside the first
        time.sleep(1.0)
        assert not second.done()
        held.release.set()
        first.result(timeout=20)
        second.result(timeout=20)
        assert held.spans == 16
        assert DROPS.total(signal="otlp_traces_requests") == ledger_before
        assert receiver.stats().get("requests.traces.over_budget", 0) == 0


def test_a_held_grpc_request_is_refused_and_counted_when_the_receiver_stops() -> None:
    # Held up to its deadline (here ~14 s), it must not outlive serve's stop: it is
    # refused and counted before stop() returns, so the exit summary includes it.
    held = Held()
    with _receiver(held) as (receiver, export):
        big = _request(8, 100_000)
        first = export.future(big, timeout=30)
        assert held.entered.wait(10)
        second = export.future(big, timeout=20)
        time.sleep(0.5)
        assert not second.done()
        before = receiver.stats().get("requests.traces.over_budget", 0)
        start = time.monotonic()
        stopper = threading.Thread(target=receiver.stop)
        stopper.start()
        with pytest.raises(grpc.RpcError) as err:
            second.result(timeout=10)
        assert time.monotonic() - start < 2.0  # at once, not at its deadline
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        held.release.set()
        stopper.join(15)
        assert receiver.stats().get("requests.traces.over_budget", 0) == before + 1
        with contextlib.suppress(grpc.RpcError):
            first.result(timeout=10)


def test_a_hostile_deadline_holds_a_request_no_longer_than_serve_allows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An hour's deadline must not hold one of the 16 gRPC worker threads for most of it.
    from otel_proofscope.integrations.otlp_receiver import grpc_server

    monkeypatch.setattr(grpc_server, "MAX_HOLD_S", 1.0)
    held = Held()
    with _receiver(held) as (receiver, export):
        big = _request(8, 100_000)
        first = export.future(big, timeout=30)
        assert held.entered.wait(10)
        start = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            export(big, timeout=3600)
        assert 0.9 <= time.monotonic() - start < 5.0
        assert err.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert receiver.stats().get("requests.traces.over_budget", 0) == 1
        held.release.set()
        first.result(timeout=20)
