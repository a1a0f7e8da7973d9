"""Semantic conventions: every span, event, attribute and metric name of the contract.

This module is the single source of truth. Dashboards, the Rerun translation, the
bridges and the tests all import names from here; ``docs/semantic-conventions.md`` is
generated from it (``scripts/gen-semconv-doc``) and a test fails if the two
differ, so the document cannot drift from the code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.metrics import Counter, Histogram, Meter

TRACER_NAME = "otel_proofscope"
METER_NAME = "otel_proofscope"


# ── attribute names ──────────────────────────────────────────────────────────────────


class Attr:
    """Attribute keys (spans, events and metric points)."""

    PROOF_SYSTEM = "proof.system"
    PROOF_BACKEND = "proof.backend"
    PROOF_MODEL_NAME = "proof.model.name"
    PROOF_LAYERS = "proof.layers"
    PROOF_INPUT_SHAPE = "proof.input.shape"
    PROOF_OUTPUT_SHAPE = "proof.output.shape"
    PROOF_LAYER_PROOFS = "proof.layer_proofs"
    PROOF_WEIGHT_OPENINGS = "proof.weight_openings"
    PROOF_SIZE = "proof.size"
    PROOF_VERIFIED = "proof.verified"

    CIRCUIT_NODE_INDEX = "proof.circuit.node.index"
    CIRCUIT_NODE_KIND = "proof.circuit.node.kind"
    CIRCUIT_NODE_TRACE_COST = "proof.circuit.node.trace_cost"
    CIRCUIT_EDGE_FROM = "proof.circuit.edge.from"
    CIRCUIT_EDGE_TO = "proof.circuit.edge.to"

    LAYER_INDEX = "proof.layer.index"
    LAYER_KIND = "proof.layer.kind"
    LAYER_PROOF_KIND = "proof.layer.proof_kind"
    LAYER_TRACE_COST = "proof.layer.trace_cost"
    LAYER_INPUT_SHAPE = "proof.layer.input.shape"
    LAYER_OUTPUT_SHAPE = "proof.layer.output.shape"
    SUMCHECK_ROUNDS = "proof.sumcheck.rounds"
    CLAIM_INITIAL = "proof.claim.initial"
    CLAIM_FINAL = "proof.claim.final"

    SUMCHECK_ROUND = "proof.sumcheck.round"
    SUMCHECK_DEGREE = "proof.sumcheck.degree"
    SUMCHECK_POLY = "proof.sumcheck.poly"
    SUMCHECK_CHALLENGE = "proof.sumcheck.challenge"
    CLAIM = "proof.claim"

    WEIGHT_NODE_ID = "proof.weight.node_id"
    WEIGHT_EVAL_POINT_LENGTH = "proof.weight.eval_point.length"
    WEIGHT_COMMITMENT = "proof.weight.commitment"

    BINDING_CLAIMS = "proof.binding.claims"
    BINDING_MATRICES = "proof.binding.matrices"
    BINDING_CALLDATA_FELTS = "proof.binding.calldata_felts"

    STARK_ACTIVATION_LAYERS = "proof.stark.activation_layers"
    STARK_ADD_LAYERS = "proof.stark.add_layers"
    STARK_LAYERNORM_LAYERS = "proof.stark.layernorm_layers"

    # witness data (privacy-gated events)
    ACTIVATION_MEAN = "proof.activation.mean"
    ACTIVATION_STD_DEV = "proof.activation.std_dev"
    ACTIVATION_MIN = "proof.activation.min"
    ACTIVATION_MAX = "proof.activation.max"
    ACTIVATION_SPARSITY = "proof.activation.sparsity"
    ACTIVATION_SAMPLE = "proof.activation.sample"
    ATTENTION_HEAD = "proof.attention.head"
    ATTENTION_HEADS = "proof.attention.heads"
    ATTENTION_SEQ_LEN = "proof.attention.seq_len"
    ATTENTION_SCORES = "proof.attention.scores"

    # OTel hardware semconv
    HW_ID = "hw.id"
    HW_TYPE = "hw.type"
    HW_NAME = "hw.name"
    HW_VENDOR = "hw.vendor"
    HW_DRIVER_VERSION = "hw.driver_version"
    HW_STATE = "hw.state"
    ERROR_TYPE = "error.type"
    NETWORK_IO_DIRECTION = "network.io.direction"

    GPU_BACKEND = "gpu.backend"
    GPU_CAPABILITY = "gpu.capability"
    GPU_CAPABILITY_REASON = "gpu.capability.reason"
    GPU_CAPABILITY_DETAIL = "gpu.capability.detail"
    GPU_PCI_VENDOR_ID = "gpu.pci.vendor_id"
    GPU_PCI_DEVICE_ID = "gpu.pci.device_id"
    GPU_FAULT_KIND = "gpu.fault.kind"
    GPU_RETRY_ATTEMPT = "gpu.retry.attempt"
    GPU_RECOVERY_ROUTE = "gpu.recovery.route"

    # GPU cost of one phase span (attached at the span's end; see GPU_COST_ATTRIBUTES).
    # Same names as the dispatch metrics where the quantity is the same.
    GPU_KERNEL_TIME = "gpu.kernel.time"
    GPU_DISPATCH_COUNT = "gpu.dispatch.count"
    GPU_UPLOAD_SIZE = "gpu.upload.size"
    GPU_READBACK_SIZE = "gpu.readback.size"
    GPU_BUSY_RATIO = "gpu.busy.ratio"
    GPU_KERNEL_TIMED_DISPATCHES = "gpu.kernel.timed_dispatches"
    GPU_ENERGY = "gpu.energy"
    GPU_ENERGY_SOURCE = "gpu.energy.source"
    GPU_ENERGY_HW_IDS = "gpu.energy.hw_ids"
    #: What a figure covers: ``device`` (the whole device, every process on it) or
    #: ``process`` (filtered to the prover's process tree).
    GPU_SCOPE = "gpu.scope"
    #: The phase (span name) a per-phase metric point belongs to.
    PROOF_PHASE = "proof.phase"
    #: Parent device of a MIG instance (OTel hardware semconv ``hw.parent``).
    HW_PARENT = "hw.parent"
    PROCESS_PID = "process.pid"

    PROOFSCOPE_SIGNAL = "proofscope.signal"
    PROOFSCOPE_SINK = "proofscope.sink"
    # Not namespaced on the wire (dashboards and alerts select on it); the Python name
    # says so instead of pretending it is a proofscope.* key.
    REASON = "reason"
    PROOFSCOPE_FIELD = "proofscope.field"

    # proof.log events (a prover's or a bridged producer's log lines on the active span)
    LOG_LEVEL = "proof.log.level"
    LOG_MESSAGE = "proof.log.message"
    LOG_LOGGER = "proof.log.logger"

    # Provenance of values that are not what their name suggests (bridge input).
    PROOFSCOPE_NOTE = "proofscope.note"
    #: How a span's times were taken when they are not in-process timings; see
    #: :class:`Timing` for the values.
    PROOFSCOPE_TIMING = "proofscope.timing"

    # Mapping rules (docs/mapping.md): a foreign span renamed onto the contract keeps
    # its own name here, and the rule file (preset name or path) that renamed it.
    MAPPING_SOURCE_NAME = "proofscope.mapping.source_name"
    MAPPING_RULES = "proofscope.mapping.rules"


# ── integrations: names beyond the core contract ─────────────────────────────────────


class StreamAttr:
    """Attributes for what the stream carries beyond the contract (bridge provenance).
    """

    DURATION = "proofscope.stream.duration"
    #: "live" (span times are arrival times of a live stream) or "replay" (span times
    #: are when a recording was replayed: only proofscope.stream.duration is real).
    TIMING = "proofscope.stream.timing"
    CLAIM_A_NORMALIZED = "proofscope.stream.claim_a_normalized"
    FINAL_CLAIM_A_NORMALIZED = "proofscope.stream.final_claim_a_normalized"
    ROUNDS_COMPLETED = "proofscope.stream.rounds_completed"
    GPU_DEVICE = "proofscope.stream.gpu_device"
    WEIGHT_BINDING_MODE = "proofscope.stream.weight_binding_mode"
    UNTERMINATED = "proofscope.stream.unterminated"
    CIRCUIT_TOTAL_LAYERS = "proofscope.stream.circuit.total_layers"
    CIRCUIT_NODE_ID = "proofscope.stream.circuit.node.node_id"
    CIRCUIT_HAS_SIMD = "proofscope.stream.circuit.has_simd"
    CIRCUIT_SIMD_BLOCKS = "proofscope.stream.circuit.simd_num_blocks"
    DEVICE_ID = "proofscope.stream.device.id"
    DEVICE_NAME = "proofscope.stream.device.name"
    LAYER_PROGRESS = "proofscope.stream.layer_progress"
    DEVICE_MEMORY = "proofscope.stream.device.memory_bytes"
    MATMUL_DONE = "proofscope.stream.matmul_done"
    MATMUL_TOTAL = "proofscope.stream.matmul_total"
    LAYERS_DONE = "proofscope.stream.layers_done"
    LAYERS_TOTAL = "proofscope.stream.layers_total"
    LOG_LEVEL = Attr.LOG_LEVEL
    LOG_MESSAGE = Attr.LOG_MESSAGE


class StreamEvent:
    GPU_STATUS = "proofscope.stream.gpu_status"


class Timing:
    """Values of ``proofscope.timing``."""

    #: The span's start/end are when the wrapper (``proofscope run --map``) read the
    #: prover's output line from a pipe: the prover's own flushing bounds the resolution,
    #: and lines that arrive in one read share one time.
    LOG_ARRIVAL = "log_arrival"
    #: Rebuilt from a Rust tracing ``FmtSpan::CLOSE`` line: the end is the line's own
    #: timestamp (else its arrival), the start is end − (time.busy + time.idle), both
    #: printed to three significant digits.
    LOG_CLOSE = "log_close"
    #: Rebuilt from a tracing-forest tree: the length is the time the span was entered;
    #: the start is its printed open time, else it is placed after its previous sibling
    #: (``proofscope.rust.packed``), the root ending when its tree arrived.
    LOG_TREE = "log_tree"


class LineAttr:
    """Names the log-line rules of ``proofscope run --map`` add (mapping/lines.py)."""

    TIMING = Attr.PROOFSCOPE_TIMING
    MAPPING_RULES = Attr.MAPPING_RULES
    #: Phases keep their own names (``layer = true`` adds ``proof.layer.index`` and
    #: ``proof.layer.kind``), so no ``proofscope.mapping.source_name`` here.
    #: A phase whose end line never came: ended when the prover exited.
    UNTERMINATED = "proofscope.line.unterminated"
    #: Progress of a chunked step, from lines like ``QAP AB: 512/1002``.
    PROGRESS_CHUNK = "proofscope.line.chunk"
    PROGRESS_CHUNKS = "proofscope.line.chunks"
    #: On the ``proof`` root at exit: the output lines read, and how each was taken.
    LINES = "proofscope.line.lines"
    MATCHED = "proofscope.line.matched"
    UNMATCHED = "proofscope.line.unmatched"
    MALFORMED = "proofscope.line.malformed"
    DROPPED = "proofscope.line.dropped"


class RustAttr:
    """Attributes of spans rebuilt from a Rust prover's tracing close lines
    (``proofscope run``, mapping/rust_console.py); the span's own fields keep their names.
    The names are tracing-opentelemetry's, so rules written for its spans apply."""

    BUSY_NS = "busy_ns"
    IDLE_NS = "idle_ns"
    LEVEL = "level"
    THREAD_ID = "thread.id"
    THREAD_NAME = "thread.name"
    TARGET = "code.namespace"
    #: Placed by time between two open parents with the same path and fields.
    AMBIGUOUS_PARENT = "proofscope.rust.ambiguous_parent"
    #: tracing-forest tree without open times: the span's position is not measured.
    PACKED = "proofscope.rust.packed"
    #: Close line without a timestamp, read together with a later sibling's: moved to end
    #: where that sibling starts (its length is measured, its position is not).
    PLACED_BY_CLOSE_ORDER = "proofscope.rust.placed_by_close_order"
    #: A tracing-forest event's tag (``info``, ``security.critical``…).
    FOREST_TAG = "tracing_forest.tag"


class CliProverAttr:
    """Attributes of the shipped CLI-prover presets (snarkjs, circom)."""

    GROTH16_POLY = "groth16.poly"
    GROTH16_INVERSE = "groth16.inverse"
    GROTH16_MSM_GROUP = "groth16.msm.group"
    GROTH16_READ_SECTION = "groth16.read.section"
    GROTH16_QAP_PART = "groth16.qap.part"
    PLONK_ROUND = "plonk.round"
    PLONK_POLY = "plonk.poly"
    PLONK_INVERSE = "plonk.inverse"
    PLONK_MSM_GROUP = "plonk.msm.group"
    PLONK_STEP = "plonk.step"
    CIRCOM_TEMPLATE_INSTANCES = "circom.template_instances"
    CIRCOM_CONSTRAINTS_NONLINEAR = "circom.constraints.nonlinear"
    CIRCOM_CONSTRAINTS_LINEAR = "circom.constraints.linear"
    CIRCOM_INPUTS_PUBLIC = "circom.inputs.public"
    CIRCOM_INPUTS_PRIVATE = "circom.inputs.private"
    CIRCOM_OUTPUTS_PUBLIC = "circom.outputs.public"
    CIRCOM_WIRES = "circom.wires"
    CIRCOM_LABELS = "circom.labels"


class CliProverSpanName:
    """Phase names of the shipped CLI-prover presets. A phase marked ``layer = true`` keeps
    its name and carries ``proof.layer.index`` and ``proof.layer.kind`` (MSM, FFT), which
    is what makes the Rerun walk and ``proof.layer.duration`` treat it as a layer."""

    GROTH16_READ = "groth16.read"
    GROTH16_QAP = "groth16.qap"
    GROTH16_FFT = "groth16.fft"
    GROTH16_JOIN = "groth16.join"
    GROTH16_MSM = "groth16.msm"
    PLONK_READ = "plonk.read"
    PLONK_ROUND = "plonk.round"
    PLONK_STEP = "plonk.step"
    PLONK_FFT = "plonk.fft"
    PLONK_MSM = "plonk.msm"


class CliProverEvent:
    GROTH16_PROGRESS = "groth16.progress"


class EzklAttr:
    """EZKL-specific attribute names (``ezkl.`` prefix), beside the contract's ``proof.*``."""

    FUNCTION = "ezkl.function"
    LOGROWS = "ezkl.logrows"
    INPUT_SCALE = "ezkl.input_scale"
    PARAM_SCALE = "ezkl.param_scale"
    INPUT_VISIBILITY = "ezkl.input_visibility"
    OUTPUT_VISIBILITY = "ezkl.output_visibility"
    PARAM_VISIBILITY = "ezkl.param_visibility"
    NUM_ROWS = "ezkl.num_rows"
    NUM_INNER_COLS = "ezkl.num_inner_cols"
    TOTAL_ASSIGNMENTS = "ezkl.total_assignments"
    TOTAL_CONST_SIZE = "ezkl.total_const_size"
    REQUIRED_LOOKUPS = "ezkl.required_lookups"
    REQUIRED_RANGE_CHECKS = "ezkl.required_range_checks"
    MODEL_INPUT_SCALES = "ezkl.model.input_scales"
    MODEL_OUTPUT_SCALES = "ezkl.model.output_scales"
    CHECK_MODE = "ezkl.check_mode"
    VERSION = "ezkl.version"
    CALIBRATION_TARGET = "ezkl.calibration.target"
    PROOF_FILE_SIZE = "ezkl.proof.file_size"
    RESULT = "ezkl.result"


class ImportAttr:
    """What ``proofscope import`` keeps of a Chrome trace-event file beside the event's args.

    ``process.pid``, ``thread.id`` and ``thread.name`` are OTel's own names; the others
    have no OTel equivalent.
    """

    PROCESS_PID = "process.pid"
    THREAD_ID = "thread.id"
    THREAD_NAME = "thread.name"
    PROCESS_NAME = "chrome.process_name"
    CATEGORY = "chrome.category"
    #: ``ph`` of the source event (X, B, i, …), so a round trip can tell them apart.
    PHASE = "chrome.phase"
    #: Set on a ``B`` (or async ``b``) event the file never closed: ended at the last
    #: timestamp of the file.
    UNTERMINATED = "chrome.unterminated"
    #: The counter series (a key of a ``C`` event's args) of a counter data point.
    COUNTER_SERIES = "chrome.counter.series"
    SOURCE_FILE = "proofscope.import.file"


class EzklSpanName:
    """Span names of the EZKL phases that have no contract name."""

    GEN_SETTINGS = "ezkl.gen_settings"
    CALIBRATE_SETTINGS = "ezkl.calibrate_settings"
    GEN_SRS = "ezkl.gen_srs"
    GEN_WITNESS = "ezkl.gen_witness"
    MOCK = "ezkl.mock"
    SETUP = "ezkl.setup"
    PROVE = "ezkl.prove"


# ── spans and events ─────────────────────────────────────────────────────────────────


class SpanName:
    PROOF = "proof"
    CIRCUIT_COMPILE = "proof.circuit.compile"
    LAYER = "proof.layer"
    WEIGHT_OPENING = "proof.weight_opening"
    AGGREGATED_BINDING = "proof.aggregated_binding"
    STARK = "proof.stark"
    VERIFY = "proof.verify"
    WITNESS = "proof.witness"


class EventName:
    SUMCHECK_ROUND = "proof.sumcheck.round"
    LAYER_ACTIVATION = "proof.layer.activation"
    ATTENTION_HEATMAP = "proof.attention.heatmap"
    GPU_ADAPTER_ACQUIRED = "gpu.adapter.acquired"
    GPU_CAPABILITY_UNSUPPORTED = "gpu.capability.unsupported"
    GPU_FAULT = "gpu.fault"
    GPU_RETRY = "gpu.retry"
    GPU_RECOVERY = "gpu.recovery"
    LOG = "proof.log"


class LayerKind(StrEnum):
    """Layer kinds of the proof-stream contract, with their display colours."""

    MATMUL = "MatMul"
    ACTIVATION = "Activation"
    LAYERNORM = "LayerNorm"
    RMSNORM = "RMSNorm"
    ADD = "Add"
    MUL = "Mul"
    ATTENTION = "Attention"
    EMBEDDING = "Embedding"
    DEQUANTIZE = "Dequantize"
    QUANTIZE = "Quantize"
    INPUT = "Input"
    #: Phases of a CLI prover's log (docs/provers.md): multi-scalar multiplications and
    #: (inverse) FFTs, so per-kind time tells them apart from each other and from layers.
    MSM = "MSM"
    FFT = "FFT"
    UNKNOWN = "Unknown"


LAYER_KIND_COLOURS: dict[LayerKind, int] = {
    LayerKind.MATMUL: 0x429BF5,
    LayerKind.ACTIVATION: 0xF5A542,
    LayerKind.LAYERNORM: 0x4CC671,
    LayerKind.RMSNORM: 0x38B2AC,
    LayerKind.ADD: 0xA0A0A0,
    LayerKind.MUL: 0xA855D4,
    LayerKind.ATTENTION: 0xF5D042,
    LayerKind.EMBEDDING: 0xEC6EAD,
    LayerKind.DEQUANTIZE: 0xFF8C00,
    LayerKind.QUANTIZE: 0xFF4C4C,
    LayerKind.INPUT: 0x8080FF,
    LayerKind.MSM: 0xE0563B,
    LayerKind.FFT: 0x3BC9E0,
    LayerKind.UNKNOWN: 0x606060,
}


class LayerProofKind(StrEnum):
    SUMCHECK = "Sumcheck"
    LOGUP = "LogUp"
    LINEAR = "Linear"
    SKIPPED = "Skipped"
    DEFERRED = "Deferred"


class GpuCapability(StrEnum):
    """Capabilities a GPU backend may be unable to expose (capability-gap keys)."""

    KERNEL_TIMESTAMPS = "kernel_timestamps"
    OCCUPANCY = "occupancy"
    UTILIZATION = "utilization"
    STALL_COUNTERS = "stall_counters"
    MEMORY_USAGE = "memory_usage"
    MEMORY_LIMIT = "memory_limit"
    PCIE_IO = "pcie_io"
    ERRORS = "errors"
    POWER = "power"
    ENERGY = "energy"
    TEMPERATURE = "temperature"
    CLOCKS = "clocks"
    PROCESS_UTILIZATION = "process_utilization"
    PROCESS_MEMORY = "process_memory"


class GapReason(StrEnum):
    UNSUPPORTED = "unsupported"
    PERMISSION_DENIED = "permission-denied"
    DRIVER_ERROR = "driver-error"
    NOT_INITIALIZED = "not-initialized"
    COLLECTOR_DISABLED = "collector-disabled"
    UNAVAILABLE = "unavailable"


class EnergySource(StrEnum):
    """Where a phase's ``gpu.energy`` came from."""

    #: Deltas of the device's cumulative energy counter (NVML
    #: ``nvmlDeviceGetTotalEnergyConsumption``) read at the phase's boundaries.
    COUNTER = "counter"
    #: Power samples (``nvmlDeviceGetPowerUsage``) integrated over the phase (trapezoids).
    SAMPLED = "sampled"


class GpuScope(StrEnum):
    DEVICE = "device"
    PROCESS = "process"


class DropReason(StrEnum):
    QUEUE_FULL = "queue_full"
    EXPORT_FAILED = "export_failed"
    SHUTDOWN = "shutdown"
    SIZE_CAP = "size_cap"
    SPAN_LIMIT = "span_limit"
    INVALID = "invalid"
    SINK_UNAVAILABLE = "sink_unavailable"
    UNAUTHENTICATED = "unauthenticated"
    #: A client that did not finish its request within the receiver's deadline.
    TIMEOUT = "timeout"
    #: Handed to a child process (the Rerun worker, the export process) that was stopped
    #: at the shutdown deadline before it confirmed them: an upper bound, some of these
    #: may have been delivered. Counted as dropped because nothing says they were.
    UNCONFIRMED = "unconfirmed"
    #: Not a loss: a view draws only so many of something that is complete elsewhere.
    #: Counted apart from drops and reported as "not drawn" (see DISPLAY_CAPS).
    DISPLAY_CAP = "display_cap"


#: What a drop reason means where a bare word would mislead (the exit summary says it).
DROP_REASON_NOTES: dict[str, str] = {
    DropReason.UNCONFIRMED: "handed to a child process stopped at the shutdown deadline "
                            "before it confirmed them; some may have been delivered",
}

#: Items a view caps for legibility, and where every one of them still is.
DISPLAY_CAPS: dict[str, str] = {
    "round_bars": "every round is in the claim and timing series",
    # Counted per point / row that went to the shared entity instead of its own.
    "trace_duration_series": "span names beyond the first 1,024 are drawn in the shared "
                             "series trace/durations/_other/_other",
    "trace_log_services": "services beyond the first 1,024 are logged in the shared "
                          "entity trace/logs/_other",
}


# ── metrics ──────────────────────────────────────────────────────────────────────────


class InstrumentKind(StrEnum):
    COUNTER = "counter"
    UP_DOWN_COUNTER = "updowncounter"
    HISTOGRAM = "histogram"
    GAUGE = "gauge"
    OBSERVABLE_COUNTER = "observable_counter"
    OBSERVABLE_UP_DOWN_COUNTER = "observable_updowncounter"
    OBSERVABLE_GAUGE = "observable_gauge"


#: Histogram bucket boundaries in seconds: 100 µs … 10 min. The SDK default
#: (0…10000) assumes milliseconds and would put every second-valued sample in one bucket.
SECONDS_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: InstrumentKind
    unit: str
    description: str
    attributes: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None

    def histogram(self, meter: Meter) -> Histogram:
        """This histogram on ``meter``, with the contract's unit, description and
        buckets. Every caller creates it through here, so the definitions are identical
        and the SDK hands back one instrument, not a conflicting duplicate."""
        return meter.create_histogram(
            self.name, unit=self.unit, description=self.description,
            explicit_bucket_boundaries_advisory=list(self.buckets) if self.buckets else None)

    def counter(self, meter: Meter) -> Counter:
        """This counter on ``meter``, with the contract's unit and description."""
        return meter.create_counter(self.name, unit=self.unit, description=self.description)


@dataclass(frozen=True)
class SpanDef:
    name: str
    description: str
    attributes: tuple[str, ...]
    end_attributes: tuple[str, ...] = ()


@dataclass(frozen=True)
class EventDef:
    name: str
    description: str
    attributes: tuple[str, ...]
    witness: bool = False




# hw.parent only on MIG instances (their physical GPU's hw.id).
_HW = (Attr.HW_ID, Attr.HW_TYPE, Attr.HW_NAME, Attr.HW_VENDOR, Attr.HW_DRIVER_VERSION,
       Attr.HW_PARENT)
_DISPATCH = (Attr.GPU_BACKEND, Attr.HW_ID)
_K = InstrumentKind


class Metric:
    """Every metric of the contract."""

    # device (OTel hardware semconv; observable, sampled off the hot path)
    HW_GPU_UTILIZATION = MetricDef("hw.gpu.utilization", _K.OBSERVABLE_GAUGE, "1",
                                   "Fraction of time a kernel was running on the GPU (device-wide: "
                                   "every process; not SM occupancy)", _HW)
    HW_GPU_MEMORY_USAGE = MetricDef("hw.gpu.memory.usage", _K.OBSERVABLE_UP_DOWN_COUNTER, "By",
                                    "GPU memory in use (device-wide: every process)", _HW)
    HW_GPU_MEMORY_LIMIT = MetricDef("hw.gpu.memory.limit", _K.OBSERVABLE_UP_DOWN_COUNTER, "By",
                                    "GPU memory size", _HW)
    HW_GPU_MEMORY_UTILIZATION = MetricDef("hw.gpu.memory.utilization", _K.OBSERVABLE_GAUGE, "1",
                                          "Fraction of GPU memory in use", _HW)
    HW_GPU_IO = MetricDef("hw.gpu.io", _K.OBSERVABLE_COUNTER, "By",
                          "Bytes over the GPU's host link (PCIe)",
                          (*_HW, Attr.NETWORK_IO_DIRECTION))
    HW_ERRORS = MetricDef("hw.errors", _K.OBSERVABLE_COUNTER, "{error}",
                          "Hardware errors reported by the device", (*_HW, Attr.ERROR_TYPE))
    HW_STATUS = MetricDef("hw.status", _K.OBSERVABLE_UP_DOWN_COUNTER, "1",
                          "1 for the device's current state (hw.state), 0 otherwise",
                          (*_HW, Attr.HW_STATE))
    HW_POWER = MetricDef("hw.power", _K.OBSERVABLE_GAUGE, "W",
                         "Instantaneous power draw (device-wide)", _HW)
    HW_ENERGY = MetricDef("hw.energy", _K.OBSERVABLE_COUNTER, "J",
                          "Energy consumed since driver load (device-wide)", _HW)
    HW_GPU_TEMPERATURE = MetricDef("hw.gpu.temperature", _K.OBSERVABLE_GAUGE, "Cel",
                                   "GPU die temperature (extension)", _HW)
    HW_GPU_CLOCK_SM = MetricDef("hw.gpu.clock.sm", _K.OBSERVABLE_GAUGE, "Hz",
                                "Streaming-multiprocessor clock (extension)", _HW)
    HW_GPU_CLOCK_MEMORY = MetricDef("hw.gpu.clock.memory", _K.OBSERVABLE_GAUGE, "Hz",
                                    "Memory clock (extension)", _HW)

    # dispatch accounting
    GPU_DISPATCH_COUNT = MetricDef("gpu.dispatch.count", _K.COUNTER, "{dispatch}",
                                   "Kernel dispatches", _DISPATCH)
    GPU_UPLOAD_SIZE = MetricDef("gpu.upload.size", _K.COUNTER, "By",
                                "Bytes uploaded host→device", _DISPATCH)
    GPU_UPLOAD_DURATION = MetricDef("gpu.upload.duration", _K.HISTOGRAM, "s",
                                    "Host→device upload time", _DISPATCH, SECONDS_BUCKETS)
    GPU_READBACK_SIZE = MetricDef("gpu.readback.size", _K.COUNTER, "By",
                                  "Bytes read back device→host", _DISPATCH)
    GPU_READBACK_DURATION = MetricDef("gpu.readback.duration", _K.HISTOGRAM, "s",
                                      "Device→host readback time", _DISPATCH, SECONDS_BUCKETS)
    GPU_SUBMIT_DURATION = MetricDef("gpu.submit.duration", _K.HISTOGRAM, "s",
                                    "Submit-to-complete time", _DISPATCH, SECONDS_BUCKETS)
    GPU_KERNEL_DURATION = MetricDef("gpu.kernel.duration", _K.HISTOGRAM, "s",
                                    "Kernel time from device timestamps", _DISPATCH,
                                    SECONDS_BUCKETS)
    GPU_QUEUE_WAIT_DURATION = MetricDef("gpu.queue.wait.duration", _K.HISTOGRAM, "s",
                                        "Submit-to-complete minus kernel time", _DISPATCH,
                                        SECONDS_BUCKETS)
    GPU_ALLOC_COUNT = MetricDef("gpu.alloc.count", _K.COUNTER, "{allocation}",
                                "Device allocations", _DISPATCH)
    GPU_ALLOC_SIZE = MetricDef("gpu.alloc.size", _K.COUNTER, "By", "Bytes allocated", _DISPATCH)
    GPU_FREE_SIZE = MetricDef("gpu.free.size", _K.COUNTER, "By", "Bytes freed", _DISPATCH)
    GPU_MEMORY_RESIDENT = MetricDef("gpu.memory.resident", _K.OBSERVABLE_UP_DOWN_COUNTER, "By",
                                    "Bytes resident on the device (exact)", _DISPATCH)
    GPU_MEMORY_RESIDENT_PEAK = MetricDef("gpu.memory.resident.peak", _K.OBSERVABLE_GAUGE, "By",
                                         "High-water mark of resident bytes", _DISPATCH)
    GPU_FAULT_COUNT = MetricDef("gpu.fault.count", _K.COUNTER, "{fault}", "Device faults",
                                (*_DISPATCH, Attr.GPU_FAULT_KIND))
    GPU_RETRY_COUNT = MetricDef("gpu.retry.count", _K.COUNTER, "{retry}", "Dispatch retries",
                                _DISPATCH)
    GPU_RECOVERY_COUNT = MetricDef("gpu.recovery.count", _K.COUNTER, "{recovery}",
                                   "Work finished by another route", _DISPATCH)
    GPU_RESIDUAL_BATCH_COUNT = MetricDef("gpu.residual_batch.count", _K.COUNTER, "{batch}",
                                         "Batches re-done on the CPU", _DISPATCH)
    GPU_CAPABILITY_UNSUPPORTED = MetricDef("gpu.capability.unsupported", _K.COUNTER,
                                           "{capability}",
                                           "Capabilities a backend cannot expose",
                                           (Attr.GPU_BACKEND, Attr.GPU_CAPABILITY,
                                            Attr.GPU_CAPABILITY_REASON))

    # GPU cost per phase (the span attributes, summed; for dashboards)
    GPU_PHASE_KERNEL_TIME = MetricDef("gpu.phase.kernel.time", _K.COUNTER, "s",
                                      "Kernel time (device timestamps) spent inside a proof "
                                      "phase, by phase and layer kind",
                                      (Attr.PROOF_PHASE, Attr.LAYER_KIND, Attr.PROOF_BACKEND))
    GPU_PHASE_ENERGY = MetricDef("gpu.phase.energy", _K.COUNTER, "J",
                                 "Device-wide GPU energy during a proof phase, by phase, layer "
                                 "kind and source (counter or sampled)",
                                 (Attr.PROOF_PHASE, Attr.LAYER_KIND, Attr.GPU_ENERGY_SOURCE,
                                  Attr.GPU_SCOPE))
    GPU_PHASE_TRANSFER_SIZE = MetricDef("gpu.phase.transfer.size", _K.COUNTER, "By",
                                        "Bytes uploaded and read back inside a proof phase",
                                        (Attr.PROOF_PHASE, Attr.LAYER_KIND,
                                         Attr.NETWORK_IO_DIRECTION))
    # per process (NVML running-process and process-utilization queries)
    GPU_PROCESS_UTILIZATION = MetricDef("gpu.process.utilization", _K.OBSERVABLE_GAUGE, "1",
                                        "SM utilization of one watched process (the prover "
                                        "and the children `proofscope run` wraps) over the "
                                        "last sampling interval", (Attr.HW_ID, Attr.PROCESS_PID,
                                                                   Attr.GPU_SCOPE))
    GPU_PROCESS_MEMORY_USAGE = MetricDef("gpu.process.memory.usage",
                                         _K.OBSERVABLE_UP_DOWN_COUNTER, "By",
                                         "Device memory used by one watched process",
                                         (Attr.HW_ID, Attr.PROCESS_PID, Attr.GPU_SCOPE))

    # proof
    PROOF_DURATION = MetricDef("proof.duration", _K.HISTOGRAM, "s",
                               "Wall time of one proof: its `proof` span's duration",
                               (Attr.PROOF_SYSTEM, Attr.PROOF_BACKEND, Attr.PROOF_VERIFIED),
                               SECONDS_BUCKETS)
    PROOF_LAYER_DURATION = MetricDef("proof.layer.duration", _K.HISTOGRAM, "s",
                                     "Wall time of one layer proof: its `proof.layer` "
                                     "span's duration (the same measurement)",
                                     (Attr.PROOF_SYSTEM, Attr.PROOF_BACKEND, Attr.LAYER_KIND),
                                     SECONDS_BUCKETS)
    PROOF_SUMCHECK_ROUND_COUNT = MetricDef("proof.sumcheck.round.count", _K.COUNTER, "{round}",
                                           "Sumcheck rounds completed",
                                           (Attr.PROOF_SYSTEM, Attr.LAYER_KIND))
    PROOF_VERIFY_COUNT = MetricDef("proof.verify.count", _K.COUNTER, "{verification}",
                                   "Verifications, by outcome",
                                   (Attr.PROOF_SYSTEM, Attr.PROOF_VERIFIED))

    # self-telemetry
    PROOFSCOPE_DROPPED = MetricDef("proofscope.dropped", _K.OBSERVABLE_COUNTER, "{item}",
                                   "Telemetry items lost, by signal, sink and reason",
                                   (Attr.PROOFSCOPE_SIGNAL, Attr.PROOFSCOPE_SINK,
                                    Attr.REASON))
    PROOFSCOPE_REJECTED = MetricDef("proofscope.rejected", _K.OBSERVABLE_COUNTER, "{item}",
                                    "Bad input rejected on the hot path, by field",
                                    (Attr.PROOFSCOPE_FIELD, Attr.REASON))

    @classmethod
    def all(cls) -> tuple[MetricDef, ...]:
        return tuple(v for v in vars(cls).values() if isinstance(v, MetricDef))


SPANS: tuple[SpanDef, ...] = (
    SpanDef(SpanName.PROOF, "Root of one proof",
            (Attr.PROOF_SYSTEM, Attr.PROOF_BACKEND, Attr.PROOF_MODEL_NAME, Attr.PROOF_LAYERS,
             Attr.PROOF_INPUT_SHAPE, Attr.PROOF_OUTPUT_SHAPE),
            (Attr.PROOF_LAYER_PROOFS, Attr.PROOF_WEIGHT_OPENINGS, Attr.PROOF_SIZE,
             Attr.PROOF_VERIFIED)),
    SpanDef(SpanName.CIRCUIT_COMPILE, "Circuit compilation; the DAG as parallel arrays",
            (Attr.CIRCUIT_NODE_INDEX, Attr.CIRCUIT_NODE_KIND, Attr.CIRCUIT_NODE_TRACE_COST,
             Attr.CIRCUIT_EDGE_FROM, Attr.CIRCUIT_EDGE_TO)),
    SpanDef(SpanName.LAYER, "One layer's proof (GKR layer walk)",
            (Attr.LAYER_INDEX, Attr.LAYER_KIND, Attr.LAYER_PROOF_KIND, Attr.LAYER_TRACE_COST,
             Attr.LAYER_INPUT_SHAPE, Attr.LAYER_OUTPUT_SHAPE, Attr.SUMCHECK_ROUNDS,
             Attr.CLAIM_INITIAL, Attr.HW_ID),
            (Attr.CLAIM_FINAL,)),
    SpanDef(SpanName.WEIGHT_OPENING, "Opening of a weight commitment",
            (Attr.WEIGHT_NODE_ID, Attr.WEIGHT_EVAL_POINT_LENGTH),
            (Attr.WEIGHT_COMMITMENT,)),
    SpanDef(SpanName.AGGREGATED_BINDING, "Aggregated binding of weight claims",
            (Attr.BINDING_CLAIMS, Attr.BINDING_MATRICES), (Attr.BINDING_CALLDATA_FELTS,)),
    SpanDef(SpanName.STARK, "STARK proof of the non-arithmetic layers",
            (Attr.STARK_ACTIVATION_LAYERS, Attr.STARK_ADD_LAYERS, Attr.STARK_LAYERNORM_LAYERS)),
    SpanDef(SpanName.VERIFY, "Verification of the proof", (), (Attr.PROOF_VERIFIED,)),
    SpanDef(SpanName.WITNESS, "Witness generation (the forward pass the proof is about)", ()),
)

#: GPU cost attributes, set at the end of every phase span that ran GPU work (and of
#: the proof, whose figures are the sums over its phases): (name, unit, description).
GPU_COST_ATTRIBUTES: tuple[tuple[str, str, str], ...] = (
    (Attr.GPU_KERNEL_TIME, "s", "Kernel time summed from device timestamps; absent when "
     "no dispatch of the phase had timestamps"),
    (Attr.GPU_KERNEL_TIMED_DISPATCHES, "{dispatch}", "Dispatches whose kernel time was "
     "measured (≤ `gpu.dispatch.count`)"),
    (Attr.GPU_DISPATCH_COUNT, "{dispatch}", "Dispatches inside the phase"),
    (Attr.GPU_UPLOAD_SIZE, "By", "Bytes copied host → device"),
    (Attr.GPU_READBACK_SIZE, "By", "Bytes copied device → host"),
    (Attr.GPU_BUSY_RATIO, "1", "`gpu.kernel.time` / span duration; only where kernel time "
     "was measured (can exceed 1 with concurrent queues)"),
    (Attr.GPU_ENERGY, "J", "Device-wide energy during the phase (every process on the "
     "device); absent when unmeasurable, with a `gpu.capability.unsupported` event "
     "(`gpu.capability=energy`) instead, never 0"),
    (Attr.GPU_ENERGY_SOURCE, "", "`counter` (NVML energy counter deltas) or `sampled` "
     "(power samples integrated over the span)"),
    (Attr.GPU_ENERGY_HW_IDS, "", "The devices whose energy `gpu.energy` sums"),
    (Attr.GPU_SCOPE, "", "`device`: the figure covers the whole device, not just this "
     "process"),
)

EVENTS: tuple[EventDef, ...] = (
    EventDef(EventName.SUMCHECK_ROUND, "One sumcheck round, emitted live on its layer span. "
             "`proof.sumcheck.poly`: the round polynomial's evaluations g(0)…g(d); "
             "`proof.sumcheck.challenge`: the round's Fiat–Shamir challenge r, in the same "
             "canonical form as claims (absent when the producer does not report it); "
             "`proof.claim`: the claim after the round, g(r) at that challenge (absent when "
             "unknown); so g(0)+g(1) equals the previous round's claim "
             "(`proof.claim.initial` for round 0), and with the challenge a reader can "
             "recompute g(r) from the evaluations by Lagrange interpolation",
             (Attr.SUMCHECK_ROUND, Attr.SUMCHECK_DEGREE, Attr.SUMCHECK_POLY,
              Attr.SUMCHECK_CHALLENGE, Attr.CLAIM)),
    EventDef(EventName.LAYER_ACTIVATION, "Activation statistics of a layer's output",
             (Attr.LAYER_INDEX, Attr.ACTIVATION_MEAN, Attr.ACTIVATION_STD_DEV,
              Attr.ACTIVATION_MIN, Attr.ACTIVATION_MAX, Attr.ACTIVATION_SPARSITY,
              Attr.ACTIVATION_SAMPLE), witness=True),
    EventDef(EventName.ATTENTION_HEATMAP, "Attention scores of one head (seq_len × seq_len)",
             (Attr.LAYER_INDEX, Attr.ATTENTION_HEAD, Attr.ATTENTION_HEADS,
              Attr.ATTENTION_SEQ_LEN, Attr.ATTENTION_SCORES), witness=True),
    EventDef(EventName.LOG, "A log line of the prover (or a bridged producer) on the active "
             "span", (Attr.LOG_LEVEL, Attr.LOG_MESSAGE, Attr.LOG_LOGGER)),
    EventDef(EventName.GPU_ADAPTER_ACQUIRED, "GPU identity, on the first dispatch of a runtime",
             (Attr.GPU_BACKEND, *_HW, Attr.GPU_PCI_VENDOR_ID, Attr.GPU_PCI_DEVICE_ID)),
    EventDef(EventName.GPU_CAPABILITY_UNSUPPORTED, "A metric this backend cannot give, and why",
             (Attr.GPU_BACKEND, Attr.GPU_CAPABILITY, Attr.GPU_CAPABILITY_REASON,
              Attr.GPU_CAPABILITY_DETAIL, Attr.HW_ID)),
    EventDef(EventName.GPU_FAULT, "A device fault", (Attr.GPU_BACKEND, Attr.HW_ID,
                                                     Attr.GPU_FAULT_KIND)),
    EventDef(EventName.GPU_RETRY, "A dispatch retried", (Attr.GPU_BACKEND, Attr.HW_ID,
                                                         Attr.GPU_RETRY_ATTEMPT)),
    EventDef(EventName.GPU_RECOVERY, "Work finished by another route",
             (Attr.GPU_BACKEND, Attr.HW_ID, Attr.GPU_RECOVERY_ROUTE)),
)

#: Attributes that carry witness data; never exported over OTLP unless opted in.
WITNESS_EVENTS: frozenset[str] = frozenset(e.name for e in EVENTS if e.witness)


def layer_kind_colour(kind: str) -> int:
    """Colour (0xRRGGBB) for a layer kind; unknown kinds get the Unknown colour."""
    try:
        return LAYER_KIND_COLOURS[LayerKind(kind)]
    except ValueError:
        return LAYER_KIND_COLOURS[LayerKind.UNKNOWN]


# ── documentation ────────────────────────────────────────────────────────────────────


def render_markdown() -> str:
    """The semantic-conventions document, generated from this module."""
    out: list[str] = [
        "# Semantic conventions",
        "",
        "<!-- Generated by `scripts/gen-semconv-doc` from otel_proofscope/semconv.py;",
        "     tests/test_semconv.py fails when this file and the code disagree. -->",
        "",
        f"Tracer name `{TRACER_NAME}`, meter name `{METER_NAME}`. Field elements are",
        "canonical strings: a prime-field element is its integer in [0, p); an extension",
        "element is its limbs in parentheses, e.g. `(1,2,3,4)` for QM31. Shapes are int arrays.",
        "Durations are seconds.",
        "",
        "## Spans",
        "",
        "| span | description | attributes at start | attributes at end |",
        "|---|---|---|---|",
    ]
    for s in SPANS:
        start = ", ".join(f"`{a}`" for a in s.attributes) or "—"
        end = ", ".join(f"`{a}`" for a in s.end_attributes) or "—"
        out.append(f"| `{s.name}` | {s.description} | {start} | {end} |")
    out += ["", "### GPU cost of a phase", "",
            "Set at the end of every phase span that ran GPU work; the `proof` span",
            "carries the totals, equal to the sums over its phases. Energy is set on every",
            "phase while an NVML energy meter runs (device-wide, labelled so).", "",
            "| attribute | unit | description |", "|---|---|---|"]
    for name, unit, desc in GPU_COST_ATTRIBUTES:
        out.append(f"| `{name}` | {f'`{unit}`' if unit else '—'} | {desc} |")
    out += ["", "## Span events", "", "| event | description | attributes | witness data |",
            "|---|---|---|---|"]
    for e in EVENTS:
        attrs = ", ".join(f"`{a}`" for a in e.attributes)
        out.append(f"| `{e.name}` | {e.description} | {attrs} | {'yes' if e.witness else 'no'} |")
    out += ["", "Events marked *witness data* are dropped before OTLP export unless",
            "`PROOFSCOPE_EXPORT_WITNESS=1` (or `configure(export_witness=True)`).", "",
            "## Metrics", "", "| metric | instrument | unit | description | attributes |",
            "|---|---|---|---|---|"]
    for m in Metric.all():
        attrs = ", ".join(f"`{a}`" for a in m.attributes) or "—"
        out.append(f"| `{m.name}` | {m.kind.value} | `{m.unit}` | {m.description} | {attrs} |")
    out += ["", "Histogram buckets (seconds): " + ", ".join(f"{b:g}" for b in SECONDS_BUCKETS)
            + ".", "", "## Layer kinds", "", "| kind | colour |", "|---|---|"]
    for kind, colour in LAYER_KIND_COLOURS.items():
        out.append(f"| `{kind.value}` | `#{colour:06x}` |")
    out += ["", "Layer proof kinds: " + ", ".join(f"`{k.value}`" for k in LayerProofKind) + ".",
            "", "## GPU capabilities and gap reasons", "",
            "Capabilities: " + ", ".join(f"`{c.value}`" for c in GpuCapability) + ".", "",
            "Reasons: " + ", ".join(f"`{r.value}`" for r in GapReason) + ".", "",
            "## Drop reasons (`proofscope.dropped`)", "",
            ", ".join(f"`{r.value}`" for r in DropReason) + ".", ""]
    out += ["## Integration names", "",
            "Beyond the core contract, the bridges add names of their own:", "",
            "| group | names |", "|---|---|"]
    for title, cls in (("proof-stream bridge attributes (`proofscope replay`, `run`)",
                        StreamAttr),
                       ("proof-stream bridge events", StreamEvent),
                       ("log-line rules (`run --map`)", LineAttr),
                       ("`proofscope.timing` values", Timing),
                       ("Rust tracing close lines (`run`)", RustAttr),
                       ("CLI-prover preset attributes", CliProverAttr),
                       ("CLI-prover preset phases", CliProverSpanName),
                       ("CLI-prover preset events", CliProverEvent),
                       ("EZKL attributes", EzklAttr), ("EZKL span names", EzklSpanName),
                       ("`proofscope import` (Chrome trace events)", ImportAttr)):
        names = sorted({v for k, v in vars(cls).items()
                        if k.isupper() and isinstance(v, str)})
        out.append(f"| {title} | " + ", ".join(f"`{n}`" for n in names) + " |")
    out += ["", "Mapping rules (`serve --map`, `PROOFSCOPE_MAP`, `configure(map=...)`, "
            "docs/mapping.md) rename a foreign span onto the contract and keep "
            f"`{Attr.MAPPING_SOURCE_NAME}` (its own name) and `{Attr.MAPPING_RULES}` "
            "(the preset or rule file).", ""]
    return "\n".join(out)


#: ``proofscope.sink`` of the Rerun sink (drop counts, the exit summary).
SINK_RERUN = "rerun"
