"""Line sources: files, FIFOs, followed files, stdin through the CLI, and a real
WebSocket server on 127.0.0.1 (with a token check and a broken connection)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.server import Request, Response, ServerConnection, serve

from otel_proofscope.integrations.proof_stream.decoder import MAX_LINE_BYTES
from otel_proofscope.integrations.proof_stream.sources import (
    FollowSource,
    SourceError,
    StreamSource,
    WebSocketSource,
    open_source,
    redact,
)

FIXTURE = Path(__file__).parent / "fixtures" / "proof_stream_tiny_mlp.jsonl"
LINES = FIXTURE.read_bytes().splitlines()
TOKEN = "s3cret-token"


def collect(source: Any, limit_s: float = 20.0) -> list[tuple[int, bytes]]:
    """Drain a source on a thread, bounded so a broken source fails instead of hanging."""
    out: list[tuple[int, bytes]] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            out.extend(source.lines())
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit_s)
    if t.is_alive():
        source.stop()
        t.join(5)
        pytest.fail("source did not end in time")
    if error:
        raise error[0]
    return out


def test_file_source_numbers_lines_and_cuts_over_long_ones(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(LINES[0] + b"\n" + b"x" * (MAX_LINE_BYTES + 500) + b"\n" + LINES[1])
    assert not StreamSource(path).live  # a recording, not a live stream
    got = list(StreamSource(path).lines())
    assert [n for n, _ in got] == [1, 2, 3]
    assert got[0][1].rstrip() == LINES[0] and got[2][1] == LINES[1]
    assert len(got[1][1]) == MAX_LINE_BYTES + 1  # rejected by size downstream, not kept


def test_follow_source_reads_a_growing_file_across_partial_writes(tmp_path: Path) -> None:
    path = tmp_path / "grow.jsonl"
    path.touch()
    source = FollowSource(path, poll_s=0.01).open()
    data = b"\n".join(LINES) + b"\n"

    def writer() -> None:
        with open(path, "ab", buffering=0) as f:
            for i in range(0, len(data), 97):  # cuts lines mid-way on purpose
                f.write(data[i:i + 97])
                time.sleep(0.001)
        source.stop()

    threading.Thread(target=writer, daemon=True).start()
    got = collect(source)
    assert [raw.rstrip(b"\n") for _, raw in got] == LINES
    assert [n for n, _ in got] == list(range(1, len(LINES) + 1))


def test_follow_source_fifo_with_writers_coming_and_going(tmp_path: Path) -> None:
    path = tmp_path / "events.fifo"
    os.mkfifo(path)
    assert StreamSource(path).live
    source = FollowSource(path, poll_s=0.01).open()
    half = len(LINES) // 2

    def writer() -> None:
        for part in (LINES[:half], LINES[half:]):
            with open(path, "wb") as f:
                f.write(b"\n".join(part) + b"\n")
        time.sleep(0.05)
        source.stop()

    threading.Thread(target=writer, daemon=True).start()
    got = collect(source)
    assert [raw.rstrip(b"\n") for _, raw in got] == LINES


def test_follow_source_without_a_writer_stops_promptly(tmp_path: Path) -> None:
    path = tmp_path / "idle.fifo"
    os.mkfifo(path)
    source = FollowSource(path, poll_s=0.01).open()
    threading.Timer(0.1, source.stop).start()
    assert collect(source, limit_s=5) == []


def test_follow_source_drops_the_tail_of_an_over_long_line(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"y" * (3 * MAX_LINE_BYTES) + b"\n" + LINES[0] + b"\nunterminated")
    source = FollowSource(path, poll_s=0.01)
    source.stop()  # everything is already written: drain and end
    got = collect(source)
    assert [n for n, _ in got] == [1, 2, 3]
    assert len(got[0][1]) == MAX_LINE_BYTES + 1
    assert got[1][1].rstrip() == LINES[0] and got[2][1] == b"unterminated"


def test_redact_hides_tokens_and_userinfo() -> None:
    assert redact(f"ws://h:1/ws?token={TOKEN}&x=1") == "ws://h:1/ws?token=***&x=1"
    assert TOKEN not in redact(f"wss://user:{TOKEN}@h/ws")


def test_open_source_rejects_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such file"):
        open_source(str(tmp_path / "nope.jsonl"))


# ── WebSocket ────────────────────────────────────────────────────────────────────────


def ws_server(handler: Callable[[ServerConnection], None]) -> Iterator[str]:
    def check_token(conn: ServerConnection, request: Request) -> Response | None:
        if request.path != f"/ws?token={TOKEN}":
            return conn.respond(HTTPStatus.FORBIDDEN, "bad token\n")
        return None

    server = serve(handler, "127.0.0.1", 0, process_request=check_token, compression=None)
    port = server.socket.getsockname()[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"ws://127.0.0.1:{port}/ws"
    finally:
        server.shutdown()
        thread.join(5)


@pytest.fixture
def fixture_server() -> Iterator[str]:
    def send_all(conn: ServerConnection) -> None:
        for raw in LINES:
            conn.send(raw.decode())
        conn.close()

    yield from ws_server(send_all)


@pytest.fixture
def flaky_server() -> Iterator[str]:
    """Breaks the first connection (no close frame) after 10 events; resumes after."""
    calls = {"n": 0}

    def handler(conn: ServerConnection) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            for raw in LINES[:10]:
                conn.send(raw.decode())
            time.sleep(0.1)
            conn.close_socket()
            return
        for raw in LINES[10:]:
            conn.send(raw.decode())
        conn.close()

    yield from ws_server(handler)


def test_websocket_source_receives_the_stream(fixture_server: str) -> None:
    source = WebSocketSource(f"{fixture_server}?token={TOKEN}", open_timeout=5)
    got = collect(source)
    assert [raw for _, raw in got] == LINES
    assert source.ended_by == "closed by the server" and source.reconnects == 0


def test_websocket_wrong_token_is_refused_without_leaking_it(fixture_server: str) -> None:
    source = WebSocketSource(f"{fixture_server}?token=wrong-{TOKEN}", open_timeout=5)
    with pytest.raises(SourceError) as info:
        collect(source)
    assert "HTTP 403" in str(info.value) and TOKEN not in str(info.value)


def test_websocket_reconnects_after_a_broken_connection(flaky_server: str) -> None:
    source = WebSocketSource(f"{flaky_server}?token={TOKEN}", open_timeout=5,
                             max_reconnects=3)
    got = collect(source)
    assert [raw for _, raw in got] == LINES
    assert source.reconnects == 1
    assert [n for n, _ in got] == list(range(1, len(LINES) + 1))


def test_websocket_nobody_listening_fails_within_its_bound() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connection refused
        source = WebSocketSource(f"ws://127.0.0.1:{port}/ws", open_timeout=1,
                                 max_reconnects=2)
        with pytest.raises(SourceError, match="cannot connect"):
            collect(source, limit_s=15)


# ── the CLI end to end ───────────────────────────────────────────────────────────────


def spans_in(out: Path) -> list[dict[str, Any]]:
    spans = []
    for raw in (out / "traces.jsonl").read_text().splitlines():
        for rs in json.loads(raw)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                spans += ss["spans"]
    return spans


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "PROOFSCOPE_")) and k != "TRACEPARENT"}
    return subprocess.run([sys.executable, "-m", "otel_proofscope", *args],
                          capture_output=True, timeout=timeout, env=env, text=True)


def test_cli_replay_from_stdin(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "otel_proofscope", "replay", "-", "--out", str(tmp_path),
         "--rerun", "off", "--strict"],
        input=FIXTURE.read_bytes(), capture_output=True, timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")})
    stderr = proc.stderr.decode()
    assert proc.returncode == 1, stderr  # --strict: two lines were rejected
    assert "line 13: malformed JSON" in stderr and "stdin: 44 line(s), 42 event(s)" in stderr
    names = sorted(s["name"] for s in spans_in(tmp_path))
    assert names.count("proof.layer") == 6 and names.count("proof") == 1


def test_cli_replay_live_websocket(fixture_server: str, tmp_path: Path) -> None:
    proc = cli("replay", f"{fixture_server}?token={TOKEN}", "--out", str(tmp_path),
               "--rerun", "off", "--idle-timeout", "10")
    assert proc.returncode == 0, proc.stderr
    assert TOKEN not in proc.stderr and "token=***" in proc.stderr
    spans = spans_in(tmp_path)
    assert len({s["traceId"] for s in spans}) == 1
    assert sum(1 for s in spans if s["name"] == "proof.layer") == 6


def _timing(spans: list[dict[str, Any]]) -> set[str]:
    return {a["value"]["stringValue"] for s in spans for a in s.get("attributes", [])
            if a["key"] == "proofscope.stream.timing"}


@pytest.mark.parametrize(("extra", "timing"), [((), "replay"), (("--live",), "live")],
                         ids=["piped-recording", "declared-live"])
def test_cli_replay_of_a_piped_recording_is_not_live(tmp_path: Path, extra: tuple[str, ...],
                                                     timing: str) -> None:
    """`cat rec.jsonl | proofscope replay -`: the pipe carries a recording, so its arrival
    times are never presented as the prover's (a live producer says --live); the Rerun
    log says the proof was replayed instead of "finished in X s"."""
    rrd = tmp_path / "replay.rrd"
    cat = subprocess.Popen(["cat", str(FIXTURE)], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "otel_proofscope", "replay", "-", "--out", str(tmp_path),
             "--rerun", f"file:{rrd}", *extra], stdin=cat.stdout, capture_output=True,
            timeout=120, env={k: v for k, v in os.environ.items()
                              if not k.startswith(("OTEL_", "PROOFSCOPE_"))})
    finally:
        assert cat.stdout is not None
        cat.stdout.close()
        cat.wait(10)
    assert proc.returncode == 0, proc.stderr.decode()
    assert _timing(spans_in(tmp_path)) == {timing}
    from otel_proofscope.rerun import readback

    rec = readback.read(rrd)
    texts = [str(v) for path in rec.paths() if path.lstrip("/").startswith("logs/proof/")
             for v in rec.values(path, "TextLog:text")]
    finished = [t for t in texts if "finished" in t or "FAILED" in t]
    assert finished, texts
    if timing == "replay":
        assert all(" s:" not in t and "replay" in t for t in finished), finished
    else:
        assert any(re.search(r"in \d+\.\d{3} s:", t) for t in finished), finished
