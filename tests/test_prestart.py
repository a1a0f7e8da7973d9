"""The export process started ahead of configure() (rerun/prestart.py): a command's own
imports overlap the child's, and configure() hands the waiting child its work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otel_proofscope.ledger import DROPS
from otel_proofscope.rerun import prestart, readback
from otel_proofscope.setup import configure
from tests.chaos.faults import child_env, run_python
from tests.test_export_process import _prove, _route, _started
from tests.test_fast_otlp import _GrpcReceiver, grpc_receiver

__all__ = ["grpc_receiver"]  # a fixture, used by name


@pytest.fixture
def waiting(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PROOFSCOPE_EXPORT_PROCESS", raising=False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    yield
    prestart._discard_waiting()  # a test that failed before configure() took it


def _waiting_pid() -> int:
    proc = prestart._waiting
    assert proc is not None
    return proc.pid


def test_configure_takes_the_waiting_child_and_passes_the_environment_since(
        waiting: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        grpc_receiver: tuple[_GrpcReceiver, int]) -> None:
    assert prestart.prestart()
    pid = _waiting_pid()
    assert prestart.prestart() and _waiting_pid() == pid  # one child, not two
    # Set after the child started: it reads its variables from the header, not its birth.
    receiver, port = grpc_receiver
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    rrd = tmp_path / "early.rrd"
    telemetry = _started(configure(rerun=f"file:{rrd}", export_process=True,
                                   set_global=False, out_dir=tmp_path))
    worker: Any = _route(telemetry).exporter.worker
    assert worker.proc.pid == pid
    assert prestart._waiting is None
    _prove(telemetry, layers=3)
    report = telemetry.shutdown(timeout_s=20)
    assert report.spans_exported["rerun"] == 4
    assert report.spans_exported["otlp"] == 4
    assert DROPS.total() == 0
    assert sum(len(ss.spans) for r in receiver.requests for rs in r.resource_spans
               for ss in rs.scope_spans) == 4
    assert "/gkr/walk/nodes" in readback.read(rrd).paths()


def test_a_variable_unset_after_the_start_is_unset_in_the_child(
        waiting: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A nonsense queue size in the child's birth environment would kill its Rerun sink;
    # the parent removed it before configure(), so the child must not see it.
    monkeypatch.setenv("PROOFSCOPE_RERUN_QUEUE", "not-a-number")
    assert prestart.prestart()
    monkeypatch.delenv("PROOFSCOPE_RERUN_QUEUE")
    rrd = tmp_path / "unset.rrd"
    telemetry = _started(configure(rerun=f"file:{rrd}", set_global=False,
                                   out_dir=tmp_path))
    _prove(telemetry, layers=2)
    report = telemetry.shutdown(timeout_s=20)
    assert report.spans_exported["rerun"] == 3
    assert DROPS.total() == 0


def test_a_child_nobody_takes_is_stopped_at_exit_without_a_word(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = ("import sys; from otel_proofscope.rerun import prestart; prestart.prestart(); "
            "open(sys.argv[1], 'w').write(str(prestart._waiting.pid))")
    start = time.monotonic()
    res = run_python(code, str(pid_file), env=child_env(), timeout=60)
    assert res.returncode == 0, res.stderr
    assert time.monotonic() - start < 30
    assert res.stderr == ""
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the unused export child outlived its parent"


def test_a_child_whose_parent_vanished_exits_at_end_of_input() -> None:
    proc = subprocess.Popen([sys.executable, "-m", prestart.MODULE, prestart.ARG],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=child_env())
    out, err = proc.communicate(b"", timeout=120)
    assert proc.returncode == 0
    assert out == b"" and err == b""


@pytest.mark.parametrize(("header", "words"), [
    (prestart.HEADER.pack(prestart.MAX_HEADER_BYTES + 1), "at most"),
    (prestart.HEADER.pack(4) + b"[1]\n", "configuration header"),
    (prestart.HEADER.pack(2) + b"{}", "configuration header"),
    (prestart.HEADER.pack(3) + b"{x}", "not JSON"),
])
def test_a_bad_header_is_refused_with_a_clear_error(header: bytes, words: str) -> None:
    read, write = os.pipe()
    try:
        os.write(write, header)
        os.close(write)
        write = -1
        with pytest.raises(ValueError, match=words):
            prestart.read_header(read)
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_a_short_header_is_end_of_input() -> None:
    read, write = os.pipe()
    os.write(write, prestart.HEADER.pack(100) + b'{"config"')
    os.close(write)
    try:
        assert prestart.read_header(read) is None
    finally:
        os.close(read)


def test_a_fork_does_not_inherit_the_waiting_child(waiting: None) -> None:
    assert prestart.prestart()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child reports by exit code
        os._exit(0 if prestart._waiting is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert prestart._waiting is not None  # still the parent's


def test_the_demo_prestarts_only_when_it_draws(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    from otel_proofscope.cli import main

    started: list[bool] = []

    def fake() -> bool:
        started.append(True)
        return True

    monkeypatch.setattr(prestart, "prestart", fake)
    assert main(["demo", "--out", str(tmp_path / "off"), "--rerun", "off",
                 "--layers", "2", "--width", "8"]) == 0
    assert started == []
    assert main(["demo", "--out", str(tmp_path / "on"), "--layers", "2",
                 "--width", "8"]) == 0
    assert started == [True]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by a parent that is itself gone) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return False
