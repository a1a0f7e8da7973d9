"""EZKL integration pieces that need no prover: the log bridge and the file readers."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_proofscope.integrations.ezkl import files
from otel_proofscope.integrations.ezkl.logs import LogAttr, LogBridge, level_name
from otel_proofscope.semconv import Attr, EventName, EzklAttr


class _Collect(logging.Handler):
    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def console() -> Iterator[_Collect]:
    """A handler on the root logger, standing for the user's console at WARNING."""
    handler = _Collect(logging.NOTSET)
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_log_lines_become_events_and_the_console_is_unchanged(console: _Collect) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    ezkl_logger = logging.getLogger("ezkl.pfsys")
    before = (logging.getLogger("ezkl").level, logging.getLogger("ezkl").propagate)
    bridge = LogBridge(logging.INFO, loggers=("ezkl", "halo2_proofs"))
    bridge.install()
    try:
        with tracer.start_as_current_span("phase"):
            ezkl_logger.info("proof started...")
            ezkl_logger.debug("not captured below INFO")
            logging.getLogger("halo2_proofs.plonk").warning("max gate degree: %d", 6)
    finally:
        bridge.uninstall()
    (span,) = exporter.get_finished_spans()
    got = [(e.attributes[LogAttr.LEVEL], e.attributes[LogAttr.MESSAGE],
            e.attributes[LogAttr.LOGGER]) for e in span.events if e.name == EventName.LOG]
    assert got == [("Info", "proof started...", "ezkl.pfsys"),
                   ("Warn", "max gate degree: 6", "halo2_proofs.plonk")]
    # The console saw exactly what it would have seen without the bridge: the warning.
    assert [r.getMessage() for r in console.records] == ["max gate degree: 6"]
    assert (logging.getLogger("ezkl").level, logging.getLogger("ezkl").propagate) == before
    console.records.clear()
    logging.getLogger("ezkl.pfsys").warning("after uninstall")
    assert [r.getMessage() for r in console.records] == ["after uninstall"]


def test_a_console_at_info_still_gets_info(console: _Collect) -> None:
    logging.getLogger().setLevel(logging.INFO)
    bridge = LogBridge(logging.DEBUG)
    bridge.install()
    try:
        logging.getLogger("ezkl.x").info("shown")
        logging.getLogger("ezkl.x").debug("hidden")
    finally:
        bridge.uninstall()
    assert [r.getMessage() for r in console.records] == ["shown"]


def test_lines_from_threads_without_context_land_on_the_running_phase() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    phase = provider.get_tracer("t").start_span("ezkl.prove")
    bridge = LogBridge(logging.INFO, fallback_span=lambda: phase)
    bridge.install()
    try:
        worker = threading.Thread(target=logging.getLogger("ezkl.worker").info,
                                  args=("from a rayon thread",))
        worker.start()
        worker.join(5)
    finally:
        bridge.uninstall()
        phase.end()
    (span,) = exporter.get_finished_spans()
    assert [e.attributes[LogAttr.MESSAGE] for e in span.events] == ["from a rayon thread"]


@pytest.mark.parametrize(("levelno", "name"), [
    (5, "Trace"), (logging.DEBUG, "Debug"), (logging.INFO, "Info"),
    (logging.WARNING, "Warn"), (logging.ERROR, "Error"), (logging.CRITICAL, "Error")])
def test_levels_use_the_proof_stream_vocabulary(levelno: int, name: str) -> None:
    assert level_name(levelno) == name


SETTINGS = {
    "run_args": {"input_scale": 7, "param_scale": 8, "logrows": 15, "num_inner_cols": 2,
                 "input_visibility": "Public", "output_visibility": "Public",
                 "param_visibility": {"Hashed": {"hash_is_public": True, "outlets": []}}},
    "num_rows": 1234, "total_assignments": 2468, "total_const_size": 3,
    "model_instance_shapes": [[1, 3, 8, 8], [1, 10]],
    "model_input_scales": [7], "model_output_scales": [7],
    "required_lookups": [{"Div": {"denom": 2.0}}, "ReLU"],
    "required_range_checks": [[-1, 1], [0, 16383], [0, 3]],
    "check_mode": "SAFE", "version": "23.0.5",
}


def test_settings_attributes() -> None:
    attrs = files.settings_attributes(SETTINGS)
    assert attrs[EzklAttr.LOGROWS] == 15
    assert attrs[EzklAttr.INPUT_SCALE] == 7 and attrs[EzklAttr.PARAM_SCALE] == 8
    assert attrs[EzklAttr.PARAM_VISIBILITY] == "Hashed"
    assert attrs[EzklAttr.NUM_ROWS] == 1234 and attrs[EzklAttr.NUM_INNER_COLS] == 2
    assert attrs[EzklAttr.REQUIRED_LOOKUPS] == ['{"Div":{"denom":2.0}}', "ReLU"]
    assert attrs[EzklAttr.REQUIRED_RANGE_CHECKS] == 3
    assert attrs[EzklAttr.CHECK_MODE] == "SAFE"
    assert files.io_shapes(SETTINGS) == {Attr.PROOF_INPUT_SHAPE: [1, 3, 8, 8],
                                         Attr.PROOF_OUTPUT_SHAPE: [1, 10]}


def test_shapes_are_not_guessed_when_instances_do_not_pin_them() -> None:
    private_in = json.loads(json.dumps(SETTINGS))
    private_in["run_args"]["input_visibility"] = "Private"
    private_in["model_instance_shapes"] = [[1, 10]]
    assert files.io_shapes(private_in) == {}
    two_inputs = dict(SETTINGS, model_input_scales=[7, 7])
    assert files.io_shapes(two_inputs) == {}


def test_odd_settings_give_no_attributes() -> None:
    assert files.settings_attributes({}) == {}
    assert files.settings_attributes({"run_args": "x", "num_rows": "many",
                                      "logrows": True}) == {}


def test_proof_size_from_file_list_or_hex(tmp_path: Path) -> None:
    assert files.proof_size({"proof": [1, 2, 3, 255]}) == 4
    assert files.proof_size({"proof": "0x0a0b0c"}) == 3
    assert files.proof_size({"proof": None, "hex_proof": "0xabcd"}) == 2
    assert files.proof_size({"proof": [1, 300]}) is None
    assert files.proof_size({"proof": "0xzz"}) is None
    assert files.proof_size({}) is None
    path = tmp_path / "proof.json"
    path.write_text(json.dumps({"proof": list(range(10))}))
    doc = files.load_json(path)
    assert doc is not None and files.proof_size(doc) == 10
    assert files.load_json(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("[1, 2")
    assert files.load_json(tmp_path / "bad.json") is None
    (tmp_path / "list.json").write_text("[1, 2]")
    assert files.load_json(tmp_path / "list.json") is None
