"""What :func:`otel_proofscope.setup.configure` was asked for: keyword arguments and
environment variables, parsed and validated once into a frozen :class:`Options`.

A keyword argument wins over its variable; a value that cannot be meant (not a number,
``nan``, ``inf``, zero or negative where a positive amount is needed, a switch that is
neither on nor off, a protocol or encoder nobody speaks, an address or URL that does
not parse) is refused with a ``ValueError`` naming the argument or variable and the
value, before anything is built. :func:`check_environment` is the one place every
``PROOFSCOPE_*`` and ``OTEL_EXPORTER_OTLP_*`` variable this package reads is checked,
including those only a child process reads (the Rerun worker, the export process):
the child inherits the environment, so it only ever starts with values checked here
(``PROOFSCOPE_RERUN_QUEUE=nan`` used to kill the Rerun child and lose the whole view).
An unusable output folder (a file, not writable) or a symbolic link planted where an
output file goes is refused here too, naming ``out_dir=``/``PROOFSCOPE_OUT_DIR`` or
``rerun=``/``PROOFSCOPE_RERUN``.
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.trace.export import SpanExporter

from otel_proofscope.mapping.apply import Mapper
from otel_proofscope.mapping.wiring import mapper_for
from otel_proofscope.pipeline.deadline import ENV_SHUTDOWN_TIMEOUT, parse_timeout
from otel_proofscope.pipeline.output_files import UnsafeOutputError, check_folder, refuse_link
from otel_proofscope.pipeline.processor import DEFAULT_MAX_QUEUE_BYTES

DEFAULT_OUT_DIR = "proofscope-out"
DEFAULT_MAX_EVENTS_PER_SPAN = 16_384
DEFAULT_MAX_QUEUE = 8_192
DEFAULT_SHUTDOWN_TIMEOUT_S = 3.0
DEFAULT_METRIC_INTERVAL_MS = 5000.0
#: Where an unset Prometheus port lands when OTEL_METRICS_EXPORTER names prometheus.
DEFAULT_PROMETHEUS_PORT = 9464


_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def env_bool(name: str) -> bool | None:
    """A switch variable: None when unset or empty, else on or off; any other word is a
    ValueError naming the variable (``maybe`` used to mean off, silently)."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    word = raw.strip().lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ValueError(f"{name} must be 1/0, true/false, yes/no or on/off, got {raw!r}")


def positive_float(name: str, raw: str | float) -> float:
    """``raw`` as a finite number above zero, else a ValueError naming ``name``."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {raw!r}")
    return value


def positive_int(name: str, raw: str | int) -> int:
    """``raw`` as an integer above zero, else a ValueError naming ``name``."""
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {raw!r}")
    return value


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return positive_float(name, raw) if raw else default


def env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return [p.strip().lower() for p in raw.split(",") if p.strip()]


def otlp_endpoint_configured(kind: str) -> bool:
    return bool(os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or os.environ.get(f"OTEL_EXPORTER_OTLP_{kind.upper()}_ENDPOINT"))


def _port(name: str, raw: str | int) -> int:
    """A TCP port; 0 asks the OS for a free one."""
    try:
        port = int(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a TCP port number, got {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"{name} must be a TCP port (0-65535), got {raw!r}")
    return port


def _kwarg_or_env_float(arg: str, value: float | None, env: str, default: float) -> float:
    if value:  # None and 0 mean "not given", as they always have
        return positive_float(arg, value)
    return env_float(env, default)


# ── the environment, checked in one place ─────────────────────────────────────────────

#: Values the package's readers accept (setup/sinks.py, rerun/export_process.py).
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
OTLP_ENCODERS = ("fast", "sdk")
OTLP_COMPRESSIONS = ("none", "gzip", "deflate")
#: os.nice() increments the Rerun children accept (rerun/worker.py).
NICE_RANGE = (-20, 19)
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def _choice(name: str, allowed: Sequence[str]) -> None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return
    if raw.strip().lower() not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")


def _env_int(name: str, low: int, high: int) -> None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be an integer from {low} to {high}, got {raw!r}")


def _env_seconds(name: str) -> None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of seconds, "
                         f"got {raw!r}")


def check_host(name: str, raw: str) -> str:
    """An IP address or a host name (``999.1.1.1`` is neither), else a ValueError
    naming ``name``."""
    host = raw.strip()
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    # A name whose last label is all digits is a mistyped IPv4 address, not a host.
    if (len(host) <= 253 and _HOSTNAME.fullmatch(host)
            and not host.rstrip(".").rsplit(".", 1)[-1].isdigit()):
        return host
    raise ValueError(f"{name} must be an IP address or a host name, got {raw!r}")


def check_url(name: str, raw: str) -> None:
    """An OTLP endpoint that parses (scheme://host[:port][/path], or host:port as the
    gRPC exporter takes it), else a ValueError naming ``name``."""
    from urllib.parse import urlsplit

    text = raw.strip()
    try:
        parts = urlsplit(text if "://" in text else f"http://{text}")
        parts.port  # noqa: B018 - raises for a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"{name} is not a URL ({exc}): {raw!r}") from None
    if parts.scheme.lower() not in ("http", "https", "grpc", "grpcs", "unix") or (
            parts.scheme.lower() != "unix" and not parts.hostname):
        raise ValueError(f"{name} must be a URL such as http://HOST:PORT, got {raw!r}")


def check_environment() -> None:
    """Every PROOFSCOPE_* and OTEL_EXPORTER_OTLP_* variable this package (and its child
    processes) read, checked; a ValueError names the first bad variable and its value.

    Variables :meth:`Options.resolve` parses itself (timeouts, queue sizes, ports, the
    out folder, the Rerun target, the mapping) are checked there, where they are read.
    """
    for name in ("PROOFSCOPE_RERUN_PROCESS", "PROOFSCOPE_EXPORT_PROCESS",
                 "PROOFSCOPE_CAPTURE_WITNESS", "PROOFSCOPE_EXPORT_WITNESS"):
        if name == "PROOFSCOPE_RERUN_PROCESS" and (
                os.environ.get(name, "").strip().lower() == "auto"):
            continue  # the documented automatic choice, as when unset
        env_bool(name)
    raw_queue = os.environ.get("PROOFSCOPE_RERUN_QUEUE")
    if raw_queue and raw_queue.strip():
        positive_int("PROOFSCOPE_RERUN_QUEUE", raw_queue)
    _env_int("PROOFSCOPE_RERUN_NICE", *NICE_RANGE)
    _env_seconds("PROOFSCOPE_TRACE_WAIT_S")
    _choice("PROOFSCOPE_OTLP_ENCODER", OTLP_ENCODERS)
    if raw_host := os.environ.get("PROOFSCOPE_PROMETHEUS_HOST"):
        check_host("PROOFSCOPE_PROMETHEUS_HOST", raw_host)
    for signal in ("", "TRACES_", "METRICS_"):
        prefix = f"OTEL_EXPORTER_OTLP_{signal}"
        _choice(f"{prefix}PROTOCOL", OTLP_PROTOCOLS)
        _choice(f"{prefix}COMPRESSION", OTLP_COMPRESSIONS)
        _env_seconds(f"{prefix}TIMEOUT")
        insecure = os.environ.get(f"{prefix}INSECURE")
        if insecure and insecure.strip():
            env_bool(f"{prefix}INSECURE")
        if endpoint := os.environ.get(f"{prefix}ENDPOINT"):
            check_url(f"{prefix}ENDPOINT", endpoint)


def _check_outputs(directory: Path, source: str, files: Sequence[str]) -> None:
    """The out folder can hold our files, and none of them is a planted link."""
    try:
        check_folder(directory, source)
        for name in files:
            refuse_link(directory / name, f"{name} ({source})")
    except UnsafeOutputError as exc:
        raise ValueError(str(exc.strerror or exc)) from None


def _check_rerun_target(target: str, source: str) -> None:
    """``file:`` needs a path, and the path may not be a planted link; other targets
    are parsed by the Rerun layer, which names the variable or argument on error."""
    low = target.lower()
    if low.startswith("file:"):
        path = target[5:].strip()
        if not path:
            raise ValueError(f"{source}={target!r}: a file target needs a path, "
                             "e.g. file:proofscope.rrd")
        try:
            refuse_link(Path(path).expanduser(), f"recording ({source})")
        except UnsafeOutputError as exc:
            raise ValueError(str(exc.strerror or exc)) from None
        return
    if low in ("", "off", "none", "false", "0", "spawn"):
        return
    try:
        from otel_proofscope.rerun.target import parse_target
    except ImportError:  # rerun-sdk missing: the Rerun builder says so
        return
    try:
        parse_target(target)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


@dataclass(frozen=True)
class Options:
    """Everything configure() builds from, parsed once (see :meth:`resolve`)."""

    service_name: str | None
    resource_attributes: Mapping[str, str]
    out_dir: Path
    rerun_target: str
    prometheus_port: int | None
    capture_witness: bool
    export_witness: bool
    metric_interval_s: float
    shutdown_timeout_s: float
    max_events_per_span: int
    max_queue_size: int
    handle_sigterm: bool
    set_global: bool
    trace_exporters: tuple[str, ...]
    metric_exporters: tuple[str, ...]
    span_exporters: tuple[tuple[str, SpanExporter], ...] = field(default=())
    metric_readers: tuple[MetricReader, ...] = field(default=())
    #: Mapping rules for every span sink (``map=`` or ``PROOFSCOPE_MAP``), or None.
    mapper: Mapper | None = None
    #: Estimated bytes queued per sink before new spans are dropped and counted.
    max_queue_bytes: int = DEFAULT_MAX_QUEUE_BYTES
    #: OTLP span export in the export process (``export_process=`` or
    #: ``PROOFSCOPE_EXPORT_PROCESS``); None: the variable decides, else there exactly
    #: when Rerun is on (the Rerun view is always drawn there).
    export_process: bool | None = None

    @property
    def rerun_on(self) -> bool:
        return self.rerun_target.lower() not in ("", "off", "none")

    @classmethod
    def resolve(
        cls,
        *,
        service_name: str | None = None,
        resource_attributes: Mapping[str, str] | None = None,
        out_dir: str | Path | None = None,
        rerun: str | None = None,
        rerun_process: bool | None = None,
        prometheus_port: int | None = None,
        capture_witness: bool | None = None,
        export_witness: bool | None = None,
        metric_interval_s: float | None = None,
        shutdown_timeout_s: float | None = None,
        max_events_per_span: int | None = None,
        max_queue_size: int | None = None,
        handle_sigterm: bool = True,
        span_exporters: Sequence[tuple[str, SpanExporter]] = (),
        metric_readers: Sequence[MetricReader] = (),
        set_global: bool = True,
        map: Any = None,  # configure(map=...): a preset name, rule file, RuleSet, Mapper
        max_queue_bytes: int | None = None,
        export_process: bool | None = None,
    ) -> Options:
        """configure()'s arguments merged with the environment; raises ValueError for a
        value that cannot be meant, naming where it came from."""
        check_environment()
        _retired_rerun_process(rerun_process)
        # One validation for the bound, shared with the Rerun worker (pipeline/deadline):
        # finite, positive, at most a day. None and 0 mean "not given", as always.
        bound = (parse_timeout(shutdown_timeout_s, name="shutdown_timeout_s")
                 if shutdown_timeout_s else parse_timeout(
                     os.environ.get(ENV_SHUTDOWN_TIMEOUT), default=DEFAULT_SHUTDOWN_TIMEOUT_S))
        if metric_interval_s is not None:
            interval = positive_float("metric_interval_s", metric_interval_s)
        else:
            interval = env_float("OTEL_METRIC_EXPORT_INTERVAL",
                                 DEFAULT_METRIC_INTERVAL_MS) / 1000
        capture = capture_witness if capture_witness is not None else bool(
            env_bool("PROOFSCOPE_CAPTURE_WITNESS"))
        export_w = export_witness if export_witness is not None else bool(
            env_bool("PROOFSCOPE_EXPORT_WITNESS"))
        target = (rerun if rerun is not None
                  else os.environ.get("PROOFSCOPE_RERUN", "off")).strip()
        if prometheus_port is not None:
            port: int | None = _port("prometheus_port", prometheus_port)
        elif raw_port := os.environ.get("PROOFSCOPE_PROMETHEUS_PORT"):
            port = _port("PROOFSCOPE_PROMETHEUS_PORT", raw_port)
        else:
            port = None
        max_events = (positive_int("max_events_per_span", max_events_per_span)
                      if max_events_per_span else positive_int(
                          "PROOFSCOPE_MAX_EVENTS_PER_SPAN",
                          os.environ.get("PROOFSCOPE_MAX_EVENTS_PER_SPAN")
                          or DEFAULT_MAX_EVENTS_PER_SPAN))
        queue_size = (positive_int("max_queue_size", max_queue_size)
                      if max_queue_size else positive_int(
                          "PROOFSCOPE_MAX_QUEUE",
                          os.environ.get("PROOFSCOPE_MAX_QUEUE") or DEFAULT_MAX_QUEUE))
        queue_bytes = (positive_int("max_queue_bytes", max_queue_bytes)
                       if max_queue_bytes else positive_int(
                           "PROOFSCOPE_MAX_QUEUE_BYTES",
                           os.environ.get("PROOFSCOPE_MAX_QUEUE_BYTES")
                           or DEFAULT_MAX_QUEUE_BYTES))
        directory = Path(out_dir or os.environ.get("PROOFSCOPE_OUT_DIR") or DEFAULT_OUT_DIR)
        out_source = ("out_dir" if out_dir else "PROOFSCOPE_OUT_DIR"
                      if os.environ.get("PROOFSCOPE_OUT_DIR") else "out_dir (default)")
        _check_rerun_target(target, "rerun" if rerun is not None else "PROOFSCOPE_RERUN")
        mapper = _mapper(map)

        rerun_on = target.lower() not in ("", "off", "none")
        trace_names = env_list("OTEL_TRACES_EXPORTER")
        if trace_names is None:
            trace_names = ["otlp" if otlp_endpoint_configured("traces") else "file"]
            if rerun_on:
                trace_names.append("rerun")
        metric_names = env_list("OTEL_METRICS_EXPORTER")
        if metric_names is None:
            metric_names = ["otlp" if otlp_endpoint_configured("metrics") else "file"]
            if rerun_on:
                metric_names.append("rerun")
        if "prometheus" in metric_names and not port:
            port = DEFAULT_PROMETHEUS_PORT
        file_names = [f for f, names in (("traces.jsonl", trace_names),
                                         ("metrics.jsonl", metric_names)) if "file" in names]
        if file_names:
            _check_outputs(directory, out_source, file_names)

        return cls(
            service_name=service_name, resource_attributes=dict(resource_attributes or {}),
            out_dir=directory, rerun_target=target,
            prometheus_port=port, capture_witness=capture, export_witness=export_w,
            metric_interval_s=interval, shutdown_timeout_s=bound,
            max_events_per_span=max_events, max_queue_size=queue_size,
            handle_sigterm=handle_sigterm, set_global=set_global,
            trace_exporters=tuple(trace_names), metric_exporters=tuple(metric_names),
            span_exporters=tuple(span_exporters), metric_readers=tuple(metric_readers),
            mapper=mapper, max_queue_bytes=queue_bytes,
            export_process=export_process)


_RETIRED_WARNED: set[str] = set()


def _retired_rerun_process(argument: bool | None) -> None:
    """``rerun_process=`` / ``PROOFSCOPE_RERUN_PROCESS`` chose between a Rerun-only child
    and a thread; retired (issue 29): the export process is the one route. Ignored, with
    one warning per process naming what was set (a bad value is still refused by
    :func:`check_environment`)."""
    import logging

    said = []
    if argument is not None:
        said.append("configure(rerun_process=...)")
    if os.environ.get("PROOFSCOPE_RERUN_PROCESS", "").strip():
        said.append("PROOFSCOPE_RERUN_PROCESS")
    for name in said:
        if name not in _RETIRED_WARNED:
            _RETIRED_WARNED.add(name)
            logging.getLogger("otel_proofscope.setup").warning(
                "%s is retired and ignored: configure() always draws the Rerun view in "
                "the export process (PROOFSCOPE_EXPORT_PROCESS / export_process= only "
                "decide where OTLP spans are exported)", name)


def _mapper(spec: Any) -> Mapper | None:
    """``map=`` or ``PROOFSCOPE_MAP`` as a Mapper; an error names which one."""
    from otel_proofscope.mapping.rules import RuleError

    try:
        return mapper_for(spec)
    except RuleError as exc:
        if spec is None:
            raise RuleError(f"PROOFSCOPE_MAP={os.environ.get('PROOFSCOPE_MAP', '')!r}: "
                            f"{exc}") from None
        raise
