"""The Rerun sink: targets, the bounded queue, an absent or dying viewer, bounded shutdown."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.instrumentation import ProofTracer
from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import readback
from otel_proofscope.rerun import sink as sinks
from otel_proofscope.rerun.exporter import RerunMetricExporter, RerunSpanExporter
from otel_proofscope.rerun.sink import RerunSink
from otel_proofscope.rerun.target import Target, parse_target


def spans(layers: int = 3) -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = ProofTracer(provider)
    with tracer.proof(system="gkr", layers=layers):
        for i in range(layers):
            with tracer.layer(index=i, kind="MatMul", rounds=2):
                tracer.sumcheck_round(0, [1, 2], 3)
                tracer.sumcheck_round(1, [1, 2], 4)
    return list(memory.get_finished_spans())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rerun_binary() -> str:
    # The real binary, not a shim: killing a shim would orphan the server.
    try:
        import rerun_cli

        path = Path(rerun_cli.__file__).parent / "rerun"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    found = shutil.which("rerun")
    assert found, "the rerun CLI (bundled with rerun-sdk) is needed"
    return found


class Server:
    """``rerun --serve-grpc`` on a loopback port: a viewer stand-in that can die."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [rerun_binary(), "--serve-grpc", "--bind", "127.0.0.1", "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while not sinks.probe("127.0.0.1", self.port, 0.2):
            assert self.proc.poll() is None, "rerun --serve-grpc exited"
            assert time.monotonic() < deadline, "rerun --serve-grpc did not listen"
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(free_port())
    yield s
    s.kill()


def test_targets_parse() -> None:
    assert parse_target("spawn") == Target("spawn", url="rerun+http://127.0.0.1:9876/proxy",
                                           host="127.0.0.1", port=9876)
    assert parse_target("file:out/x.rrd") == Target("file", path="out/x.rrd")
    assert parse_target("rerun+http://10.0.0.2:9000/proxy") == Target(
        "grpc", url="rerun+http://10.0.0.2:9000/proxy", host="10.0.0.2", port=9000)
    assert parse_target("localhost:9100").url == "rerun+http://localhost:9100/proxy"
    assert parse_target("off").kind == parse_target("none").kind == "off"
    for bad in ("file:", "ftp://x:1", "rerun+http://host:notaport/proxy"):
        with pytest.raises(ValueError):
            parse_target(bad)


def test_no_argument_construction_reads_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_target(None) == Target("file", path="proofscope.rrd")  # the default
    monkeypatch.setenv("PROOFSCOPE_RERUN", f"file:{tmp_path / 'env.rrd'}")
    # As OTEL_TRACES_EXPORTER=rerun / OTEL_METRICS_EXPORTER=rerun build them.
    [span_ep] = entry_points(group="opentelemetry_traces_exporter", name="rerun")
    [metric_ep] = entry_points(group="opentelemetry_metrics_exporter", name="rerun")
    span_exporter = span_ep.load()()
    metric_exporter = metric_ep.load()()
    assert isinstance(span_exporter, RerunSpanExporter)
    assert isinstance(metric_exporter, RerunMetricExporter)
    assert span_exporter.sink is metric_exporter.sink is not None
    span_exporter.export(spans())
    span_exporter.shutdown()
    metric_exporter.shutdown()
    assert "/gkr/walk/nodes" in readback.read(tmp_path / "env.rrd").paths()
    monkeypatch.setenv("PROOFSCOPE_RERUN", "off")
    off = RerunSpanExporter()
    assert off.sink is None and off.export(spans()).name == "SUCCESS"
    assert DROPS.total() == 0


def test_full_queue_drops_are_counted_exactly(tmp_path: Path) -> None:
    batch = spans(layers=3)  # 4 spans, 6 events
    sink = RerunSink(parse_target(f"file:{tmp_path / 'q.rrd'}"), queue_size=3)
    assert sink.submit_spans(batch) == 3  # the check happens before the sender runs
    lost = batch[3:]
    assert DROPS.total(signal="spans", sink="rerun", reason="queue_full") == len(lost)
    assert DROPS.total(signal="span_events", sink="rerun", reason="queue_full") == sum(
        len(s.events) for s in lost)
    assert sink.flush(30)
    sink.close(10)
    assert sink.submit_spans(batch) == 0  # closed: counted as shutdown losses
    assert DROPS.total(signal="spans", reason="shutdown") == len(batch)


def test_absent_viewer_one_warning_and_counted_drops(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_proofscope.rerun.sink")
    port = free_port()
    exporter = RerunSpanExporter(f"rerun+http://127.0.0.1:{port}/proxy")
    batch = spans()
    for _ in range(3):
        assert exporter.export(batch).name == "SUCCESS"  # never raises, never blocks
    assert exporter.force_flush(10_000)
    exporter.shutdown()
    assert DROPS.total(signal="spans", sink="rerun", reason="sink_unavailable") == 3 * len(batch)
    warnings = [r for r in caplog.records
                if r.name == sinks.__name__ and "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    assert f"127.0.0.1:{port}" in warnings[0].getMessage()
    assert "OTLP export is unaffected" in warnings[0].getMessage()


def test_viewer_dying_mid_run_and_coming_back(server: Server,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_proofscope.rerun.sink")
    server.start()
    sink = RerunSink(parse_target(f"rerun+http://127.0.0.1:{server.port}/proxy"),
                     probe_interval_s=0.0, retry_interval_s=0.2)
    batch = spans()
    sink.submit_spans(batch)
    assert sink.flush(30)
    assert DROPS.total() == 0
    server.kill()
    sink.submit_spans(batch)  # sent into the void: counted once the probe fails
    assert sink.flush(30)
    sink.submit_spans(batch)  # viewer known to be gone
    assert sink.flush(30)
    assert DROPS.total(signal="spans", reason="sink_unavailable") == 2 * len(batch)
    assert len([r for r in caplog.records
                if r.name == sinks.__name__ and "unavailable" in r.getMessage()]) == 1
    server.start()
    time.sleep(0.3)  # past the retry interval
    sink.submit_spans(batch)
    assert sink.flush(30)
    assert DROPS.total(signal="spans", reason="sink_unavailable") == 2 * len(batch)
    assert any("is back" in r.getMessage() for r in caplog.records)
    sink.close(5)


def test_spawn_without_a_viewer_binary(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="otel_proofscope.rerun.sink")
    monkeypatch.setenv("PATH", "/nonexistent")
    port = free_port()
    sink = RerunSink(Target("spawn", url=f"rerun+http://127.0.0.1:{port}/proxy",
                            host="127.0.0.1", port=port), connect_timeout_s=0.5)
    batch = spans()
    sink.submit_spans(batch)
    assert sink.flush(30)
    sink.close(5)
    assert DROPS.total(signal="spans", reason="sink_unavailable") == len(batch)
    assert len([r for r in caplog.records
                if r.name == sinks.__name__ and "unavailable" in r.getMessage()]) == 1


@pytest.mark.timeout(30)  # the bound under test: close() must return although Rerun hangs
def test_shutdown_is_bounded_when_rerun_hangs(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    stuck = threading.Event()
    release = threading.Event()

    def hang(self: RerunSink, sends: object) -> None:
        stuck.set()
        release.wait(30)

    monkeypatch.setattr(RerunSink, "_send", hang)
    sink = RerunSink(parse_target(f"file:{tmp_path / 'hang.rrd'}"))
    first, second = spans(), spans()
    sink.submit_spans(first)
    assert stuck.wait(10)
    sink.submit_spans(second)
    assert not sink.flush(0.2)  # bounded, and honest about it
    sink.close(0.3)
    assert DROPS.total(signal="spans", reason="shutdown") == len(first) + len(second)
    release.set()


def test_second_writer_of_one_rrd_gets_its_own_file(tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    # Two writers would interleave two streams into one corrupt recording (two provers,
    # or a multiprocessing worker that called configure() with the parent's target).
    path = tmp_path / "shared.rrd"
    first = RerunSink(parse_target(f"file:{path}"))
    second = RerunSink(parse_target(f"file:{path}"))
    batch_a, batch_b = spans(2), spans(3)
    first.submit_spans(batch_a)
    assert first.flush(10)
    with caplog.at_level(logging.WARNING, logger="otel_proofscope.rerun.sink"):
        second.submit_spans(batch_b)
        assert second.flush(10)
    first.close(5)
    second.close(5)
    sibling = path.with_name(f"shared-{os.getpid()}.rrd")
    assert [r.getMessage() for r in caplog.records] == [
        f"rerun: {path} is being written by another process; this one writes its "
        f"recording to {sibling}"]
    for file, batch in ((path, batch_a), (sibling, batch_b)):
        rec = readback.read(file)
        assert readback.recording_count(file) == 1
        assert len(rec.rows("/gkr/walk/nodes")) == 2 * (len(batch) - 1)  # start + end per layer
    assert DROPS.total(sink="rerun") == 0
    # The lock goes with the writer: a later one takes the original name again.
    third = RerunSink(parse_target(f"file:{path}"))
    third.submit_spans(spans(1))
    assert third.flush(10)
    third.close(5)
    assert len(readback.read(path).rows("/gkr/walk/nodes")) == 2


def _held(sink: RerunSink) -> RerunSink:
    """The sink with its sender not started yet: what is queued stays queued."""
    sink._start = lambda: None  # type: ignore[method-assign]
    return sink


def _release(sink: RerunSink) -> None:
    del sink._start  # the class's method again
    sink._start()


def test_the_queue_is_bounded_in_bytes_too_and_counts_what_does_not_fit(
        tmp_path: Path) -> None:
    from otel_proofscope.pipeline.processor import estimate_bytes

    batch = spans(layers=3)  # the layers first (they end first), then the proof
    sizes = [estimate_bytes(s) for s in batch]
    room = sizes[0] + sizes[1] + sizes[2] // 2  # two spans fit, the third does not
    sink = _held(RerunSink(parse_target(f"file:{tmp_path / 'b.rrd'}"), queue_bytes=room))
    assert sink.can_take(batch)  # an empty queue takes anything (the rest is counted)
    assert sink.submit_spans(batch) == 2
    lost = batch[2:]
    assert DROPS.total(signal="spans", sink="rerun", reason="queue_full") == len(lost)
    assert DROPS.total(signal="span_events", sink="rerun", reason="queue_full") == sum(
        len(s.events) for s in lost)
    assert not sink.can_take(batch[2:3])  # fits in count (8,192), not in bytes
    assert sink.backlog() == (2, sinks.DEFAULT_QUEUE)
    _release(sink)
    assert sink.flush(30)
    assert sink.can_take(batch)  # drained: the bytes are free again
    assert sink.stats.spans_translated == 2
    sink.close(10)


def test_an_empty_queue_takes_a_span_larger_than_its_byte_bound(tmp_path: Path) -> None:
    """Issue 28, smaller: an oversized span sent to an empty Rerun queue was counted
    as queue_full (nothing was queued). It is drawn; the next one waits for room."""
    from otel_proofscope.pipeline.processor import estimate_bytes

    batch = spans(layers=1)
    room = estimate_bytes(batch[0]) // 2  # the first span alone is twice the bound
    sink = _held(RerunSink(parse_target(f"file:{tmp_path / 'o.rrd'}"), queue_bytes=room))
    assert sink.submit_spans(batch) == 1  # the oversized one; the queue is now over
    assert DROPS.total(signal="spans", sink="rerun", reason="queue_full") == len(batch) - 1
    _release(sink)
    assert sink.flush(30)
    assert sink.stats.spans_translated == 1
    assert sink.submit_spans(batch[1:]) == len(batch) - 1  # drained: room again
    assert sink.flush(30)
    sink.close(10)


def test_a_byte_full_queue_makes_the_receiver_refuse_not_drop(tmp_path: Path) -> None:
    """serve's rule (a queue that cannot take a request refuses it, the sender retries)
    holds for the byte bound too: the receiver asks the exporter, not only the count."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    from otel_proofscope.integrations.otlp_receiver.core import Ingest, Outcome
    from otel_proofscope.pipeline.processor import estimate_bytes

    batch = spans(layers=3)
    exporter = RerunSpanExporter(f"file:{tmp_path / 'r.rrd'}")
    sink = _held(exporter.sink)
    sink._capacity_bytes = sum(estimate_bytes(s) for s in batch)  # the batch, no more
    receiver = Ingest([exporter], [])
    assert receiver.handle_traces(encode_spans(batch[:1])).outcome is Outcome.OK
    assert sink.backlog() == (1, sinks.DEFAULT_QUEUE)  # far from full in count
    refused = receiver.handle_traces(encode_spans(batch))
    assert refused.outcome is Outcome.BUSY
    assert DROPS.total(sink="rerun") == 0  # refused before the queue: nothing dropped
    _release(sink)
    assert sink.flush(30)
    assert receiver.handle_traces(encode_spans(batch)).outcome is Outcome.OK
    assert exporter.force_flush(30_000)
    assert sink.stats.spans_translated == 5
    # Only the refusal is counted (as a refused request): no span was dropped.
    assert DROPS.total() == DROPS.total(signal="otlp_traces_requests", reason="queue_full") == 1
    exporter.shutdown()


def test_once_closing_the_sink_draws_in_small_batches(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch still being translated at the deadline is abandoned whole: once close()
    has begun, queued spans are drawn CLOSING_BATCH at a time, so what the time allowed
    to translate is sent, not thrown away with one big batch."""
    sink = RerunSink(parse_target(f"file:{tmp_path / 'c.rrd'}"))
    sizes: list[tuple[bool, int]] = []
    hold = threading.Event()
    real = RerunSink._process

    def process(self: RerunSink, items: list[object]) -> None:
        sizes.append((self._closed, sum(i.n for i in items)))  # type: ignore[attr-defined]
        hold.wait(10)  # the first batch blocks, so the rest queue up behind it
        real(self, items)  # type: ignore[arg-type]

    monkeypatch.setattr(RerunSink, "_process", process)
    proof = spans(layers=2)  # 3 spans
    sink.submit_spans(proof)
    deadline = time.monotonic() + 10
    while not sizes and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(200):  # 600 spans, queued while the first batch is held
        sink.submit_spans(proof)
    closer = threading.Thread(target=sink.close, args=(30,))
    closer.start()
    while not sink._closed and time.monotonic() < deadline:
        time.sleep(0.01)
    hold.set()
    closer.join(30)
    after = [n for closing, n in sizes if closing]
    assert sum(after) == 600 and len(after) >= 600 // sinks.CLOSING_BATCH
    assert max(after) < sinks.CLOSING_BATCH + len(proof)  # whole items: one may overshoot
    assert sink.stats.spans_drawn == 603
