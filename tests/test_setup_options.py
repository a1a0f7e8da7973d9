"""setup.options: configure()'s arguments and variables are parsed once, and values that
cannot be meant are refused with an error naming the argument or variable."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import otel_proofscope as ps
from otel_proofscope.setup import Options, configure
from otel_proofscope.setup.sinks import otlp_timeout_s

_ENV = ("PROOFSCOPE_SHUTDOWN_TIMEOUT", "OTEL_METRIC_EXPORT_INTERVAL", "PROOFSCOPE_MAX_QUEUE",
        "PROOFSCOPE_MAX_EVENTS_PER_SPAN", "PROOFSCOPE_PROMETHEUS_PORT", "PROOFSCOPE_RERUN",
        "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "PROOFSCOPE_OUT_DIR", "PROOFSCOPE_CAPTURE_WITNESS", "PROOFSCOPE_EXPORT_WITNESS",
        "OTEL_EXPORTER_OTLP_TIMEOUT")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


def test_public_api_is_the_composition_root() -> None:
    import otel_proofscope.setup as setup

    assert ps.configure is configure is setup.configure
    assert ps.Telemetry is setup.Telemetry


def test_defaults() -> None:
    opts = Options.resolve()
    assert (opts.shutdown_timeout_s, opts.metric_interval_s) == (3.0, 5.0)
    assert (opts.max_queue_size, opts.max_events_per_span) == (8192, 16384)
    assert opts.trace_exporters == ("file",) and opts.metric_exporters == ("file",)
    assert opts.out_dir == Path("proofscope-out") and not opts.rerun_on
    assert opts.prometheus_port is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.max_queue_size = 1  # type: ignore[misc]


def test_arguments_win_over_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROOFSCOPE_SHUTDOWN_TIMEOUT", "7")
    monkeypatch.setenv("PROOFSCOPE_MAX_QUEUE", "11")
    monkeypatch.setenv("PROOFSCOPE_RERUN", "file:x.rrd")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    from_env = Options.resolve()
    assert (from_env.shutdown_timeout_s, from_env.max_queue_size) == (7.0, 11)
    assert from_env.trace_exporters == ("otlp", "rerun")
    given_ = Options.resolve(shutdown_timeout_s=2, max_queue_size=5, rerun="off")
    assert (given_.shutdown_timeout_s, given_.max_queue_size) == (2.0, 5)
    assert given_.trace_exporters == ("otlp",)


def test_prometheus_exporter_name_gets_the_default_port(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    assert Options.resolve().prometheus_port == 9464
    assert Options.resolve(prometheus_port=9999).prometheus_port == 9999


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-1", "0", "soon"])
@pytest.mark.parametrize("name", ["PROOFSCOPE_SHUTDOWN_TIMEOUT", "OTEL_METRIC_EXPORT_INTERVAL"])
def test_bad_float_variables_are_refused_by_name(monkeypatch: pytest.MonkeyPatch, name: str,
                                                 raw: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name) as info:
        configure(set_global=False, handle_sigterm=False)
    assert repr(raw) in str(info.value)


@pytest.mark.parametrize("raw", ["-3", "0", "1.5", "many"])
@pytest.mark.parametrize("name", ["PROOFSCOPE_MAX_QUEUE", "PROOFSCOPE_MAX_EVENTS_PER_SPAN"])
def test_bad_int_variables_are_refused_by_name(monkeypatch: pytest.MonkeyPatch, name: str,
                                               raw: str) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name):
        Options.resolve()


@pytest.mark.parametrize("raw", ["-1", "65536", "http"])
def test_bad_prometheus_port_variable(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("PROOFSCOPE_PROMETHEUS_PORT", raw)
    with pytest.raises(ValueError, match="PROOFSCOPE_PROMETHEUS_PORT"):
        Options.resolve()


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
@pytest.mark.parametrize("arg", ["shutdown_timeout_s", "metric_interval_s"])
def test_bad_float_arguments_are_refused_by_name(arg: str, value: float) -> None:
    with pytest.raises(ValueError, match=arg):
        Options.resolve(**{arg: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", ["nan", "inf", "-2", "later"])
def test_bad_otlp_timeout_is_refused_by_name(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", raw)
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_TIMEOUT"):
        otlp_timeout_s(3.0)


def test_otlp_timeout_is_capped_by_the_shutdown_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    assert otlp_timeout_s(3.0) == 3.0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1.5")
    assert otlp_timeout_s(3.0) == 1.5
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "0")
    assert otlp_timeout_s(3.0) == 0.1


@given(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False))
def test_any_positive_finite_timeout_is_kept(value: float) -> None:
    assert Options.resolve(shutdown_timeout_s=value).shutdown_timeout_s == value
