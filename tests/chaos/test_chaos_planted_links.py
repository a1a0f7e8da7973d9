"""Issue 28 item 8: symbolic links planted where output files go are refused, never
followed, and an unusable output folder is named in one clear error.

Before: a link at OUT/traces.jsonl had configure() append OTLP JSON to its target; at
OUT/proofscope.rrd `demo` replaced the target's content; at serve's default
proofscope-out/serve.rrd the target was overwritten. An output folder that is a file:
`demo` printed a traceback, configure() raised a raw FileExistsError."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_rerun_sink import spans

from otel_proofscope.cli import main
from otel_proofscope.ledger import DROPS
from otel_proofscope.pipeline.json_file import JsonLinesSpanExporter
from otel_proofscope.pipeline.output_files import UnsafeOutputError, open_output
from otel_proofscope.setup import configure

pytestmark = pytest.mark.chaos

SECRET = "not yours to overwrite\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(SECRET)
    return path


def _plant(out: Path, name: str, victim: Path) -> Path:
    out.mkdir(exist_ok=True)
    link = out / name
    link.symlink_to(victim)
    return link


def test_configure_refuses_a_link_at_traces_jsonl(tmp_path: Path, victim: Path) -> None:
    _plant(tmp_path / "out", "traces.jsonl", victim)
    with pytest.raises(ValueError, match=r"traces\.jsonl.*symbolic link.*victim"):
        configure(out_dir=tmp_path / "out", set_global=False, handle_sigterm=False)
    assert victim.read_text() == SECRET


@pytest.mark.parametrize("mode", ["a", "w"])
def test_the_exporter_itself_opens_without_following(tmp_path: Path, victim: Path,
                                                     mode: str) -> None:
    link = _plant(tmp_path / "out", "traces.jsonl", victim)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        JsonLinesSpanExporter(link)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        open_output(link, mode)
    assert victim.read_text() == SECRET


def test_a_planted_fifo_is_refused_without_hanging(tmp_path: Path) -> None:
    fifo = tmp_path / "traces.jsonl"
    os.mkfifo(fifo)
    done: list[BaseException] = []

    def attempt() -> None:
        try:
            JsonLinesSpanExporter(fifo)
        except BaseException as exc:  # handed to the test thread
            done.append(exc)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(10)
    assert done and isinstance(done[0], OSError), "the open blocked on a FIFO"


def test_demo_refuses_a_link_at_its_recording(tmp_path: Path, victim: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    _plant(tmp_path / "out", "proofscope.rrd", victim)
    assert main(["demo", "--out", str(tmp_path / "out"), "--layers", "1",
                 "--width", "4"]) == 2
    err = capsys.readouterr().err
    assert "proofscope.rrd" in err and "symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == SECRET


def test_rerun_file_target_refuses_a_link(tmp_path: Path, victim: Path) -> None:
    """serve's route: the Rerun exporter on file:proofscope-out/serve.rrd."""
    from otel_proofscope.rerun.exporter import RerunSpanExporter

    link = _plant(tmp_path / "proofscope-out", "serve.rrd", victim)
    exporter = RerunSpanExporter(f"file:{link}")
    batch = spans(2)
    exporter.export(batch)
    exporter.force_flush(10_000)
    exporter.shutdown()
    assert victim.read_text() == SECRET
    assert os.path.islink(link)
    assert DROPS.total(signal="spans", sink="rerun") == len(batch)


def test_configure_refuses_a_link_at_the_rerun_file(tmp_path: Path, victim: Path) -> None:
    link = _plant(tmp_path, "view.rrd", victim)
    with pytest.raises(ValueError, match=r"rerun.*symbolic link"):
        configure(out_dir=tmp_path / "out", rerun=f"file:{link}", set_global=False,
                  handle_sigterm=False)
    assert victim.read_text() == SECRET


@pytest.mark.parametrize("via", ["argument", "variable"])
def test_an_out_dir_that_is_a_file_is_named(tmp_path: Path, via: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    kwargs: dict[str, object] = {}
    if via == "argument":
        kwargs["out_dir"] = afile
        name = "out_dir"
    else:
        monkeypatch.setenv("PROOFSCOPE_OUT_DIR", str(afile))
        name = "PROOFSCOPE_OUT_DIR"
    with pytest.raises(ValueError, match=rf"{name}: output folder .*afile.* is a file"):
        configure(set_global=False, handle_sigterm=False, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"{name}: .*has a file where"):
        configure(out_dir=afile / "sub", set_global=False, handle_sigterm=False) \
            if via == "argument" else _env_sub(monkeypatch, afile)


def _env_sub(monkeypatch: pytest.MonkeyPatch, afile: Path) -> None:
    monkeypatch.setenv("PROOFSCOPE_OUT_DIR", str(afile / "sub"))
    configure(set_global=False, handle_sigterm=False)


def test_demo_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["demo", "--out", str(afile), "--layers", "1", "--width", "4"]) == 2
    err = capsys.readouterr().err
    assert "--out: output folder" in err and "is a file" in err and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_out_dir_is_named(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(ValueError, match=r"out_dir: output folder .* not writable"):
            configure(out_dir=ro, set_global=False, handle_sigterm=False)
    finally:
        ro.chmod(0o700)


def test_diff_recording_refuses_a_link(tmp_path: Path, victim: Path) -> None:
    from otel_proofscope.diff import rerun_view

    link = _plant(tmp_path, "diff.rrd", victim)
    with pytest.raises(UnsafeOutputError, match="symbolic link"):
        rerun_view.write(f"file:{link}", [], "summary")
    assert victim.read_text() == SECRET
