"""Issue 28 item 9: garbage in the environment is refused by configure(), in one clear
error naming the variable and its value, before any child process starts.

Before: PROOFSCOPE_RERUN_QUEUE=nan killed the Rerun child (ValueError in
rerun/worker.py) and the whole view was lost; a protocol nobody speaks, switch words
like ``2`` or ``maybe``, an encoder ``turbo``, a nice ``abc`` and the address
999.1.1.1 were accepted silently; a broken endpoint URL, ``file:`` and a missing
mapping were reported without naming the variable."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_proofscope.cli import main
from otel_proofscope.setup import configure
from otel_proofscope.setup.options import check_environment

pytestmark = pytest.mark.chaos

GARBAGE = [
    ("PROOFSCOPE_RERUN_QUEUE", "nan"),
    ("PROOFSCOPE_RERUN_QUEUE", "0"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon"),
    ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"),
    ("PROOFSCOPE_EXPORT_PROCESS", "2"),
    ("PROOFSCOPE_OTLP_ENCODER", "turbo"),
    ("PROOFSCOPE_RERUN_NICE", "abc"),
    ("PROOFSCOPE_RERUN_NICE", "99"),
    ("PROOFSCOPE_RERUN_PROCESS", "maybe"),
    ("PROOFSCOPE_CAPTURE_WITNESS", "perhaps"),
    ("PROOFSCOPE_PROMETHEUS_HOST", "999.1.1.1"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"),
    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://host:99999"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd-please"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "nan"),
    ("OTEL_EXPORTER_OTLP_INSECURE", "sure"),
    ("PROOFSCOPE_TRACE_WAIT_S", "-1"),
    ("PROOFSCOPE_RERUN", "file:"),
    ("PROOFSCOPE_RERUN", "localhost:notaport"),
    ("PROOFSCOPE_MAP", "nonexistent"),
]


@pytest.mark.parametrize(("name", "value"), GARBAGE)
def test_garbage_is_refused_naming_variable_and_value(
        name: str, value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as info:
        configure(out_dir=tmp_path, set_global=False, handle_sigterm=False)
    message = str(info.value)
    assert name in message and repr(value) in message, message


@pytest.mark.parametrize(("name", "value"), [
    ("PROOFSCOPE_RERUN_PROCESS", "auto"), ("PROOFSCOPE_RERUN_PROCESS", "OFF"),
    ("PROOFSCOPE_EXPORT_PROCESS", "0"), ("PROOFSCOPE_RERUN_QUEUE", "64"),
    ("PROOFSCOPE_RERUN_NICE", "-5"), ("PROOFSCOPE_PROMETHEUS_HOST", "::1"),
    ("PROOFSCOPE_PROMETHEUS_HOST", "metrics.internal"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317"),
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://[::1]:4317/"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "HTTP/protobuf"), ("OTEL_EXPORTER_OTLP_TIMEOUT", "2.5"),
    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"), ("PROOFSCOPE_OTLP_ENCODER", "sdk"),
])
def test_meant_values_still_pass(name: str, value: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, value)
    check_environment()


SWITCHES = ("PROOFSCOPE_RERUN_PROCESS", "PROOFSCOPE_EXPORT_PROCESS",
            "PROOFSCOPE_CAPTURE_WITNESS", "PROOFSCOPE_EXPORT_WITNESS",
            "OTEL_EXPORTER_OTLP_INSECURE")
WORDS = {"1", "0", "true", "false", "yes", "no", "on", "off", "auto"}


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(SWITCHES),
       value=st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)),
                     min_size=1, max_size=8))
def test_a_switch_is_a_switch_or_an_error_naming_it(name: str, value: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(name, value)
        word = value.strip().lower()
        if not word or word in WORDS - ({"auto"} if name != "PROOFSCOPE_RERUN_PROCESS"
                                         else set()):
            check_environment()
        else:
            with pytest.raises(ValueError, match=re.escape(name)):
                check_environment()


@settings(max_examples=100, deadline=None)
@given(value=st.one_of(st.text(st.characters(exclude_characters="\x00",
                                             exclude_categories=("Cs",)), max_size=12),
                       st.floats().map(str)))
def test_a_rerun_queue_is_a_positive_integer_or_named(value: str) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PROOFSCOPE_RERUN_QUEUE", value)
        try:
            ok = value.strip() == "" or int(value) > 0
        except ValueError:
            ok = False
        if ok:
            check_environment()
        else:
            with pytest.raises(ValueError, match="PROOFSCOPE_RERUN_QUEUE"):
                check_environment()


def test_the_cli_says_it_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PROOFSCOPE_RERUN_QUEUE", "nan")
    assert main(["demo", "--out", str(tmp_path), "--layers", "1", "--width", "4"]) == 2
    err = capsys.readouterr().err
    assert "PROOFSCOPE_RERUN_QUEUE" in err and "'nan'" in err and "Traceback" not in err
