"""The hot path never raises into the prover: arbitrary objects, raising callables and
raising field types are recorded as rejected and counted; numpy input is accepted like
Python numbers and lists; ``verified`` must be a bool."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_proofscope import instrumentation
from otel_proofscope.instrumentation import ActivationStats
from otel_proofscope.ledger import REJECTIONS
from otel_proofscope.semconv import Attr, EventName

pytestmark = pytest.mark.chaos


class Boom(Exception):
    pass


def _raise(*_: Any, **__: Any) -> Any:
    raise ZeroDivisionError("division by zero")


class RaisingField:
    def __proofscope_field__(self) -> str:
        raise Boom("field")


class RaisingToList:
    def tolist(self) -> Any:
        raise Boom("tolist")


class HostileStr:
    def __repr__(self) -> str:
        raise Boom("repr")

    __str__ = __repr__


class Weird:
    def __getattr__(self, name: str) -> Any:
        raise Boom(name)


objects = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
    st.binary(max_size=5), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.just(_raise), st.just(lambda: 1 / 0), st.builds(RaisingField),
    st.builds(RaisingToList), st.builds(HostileStr), st.builds(Weird),
    st.just(np.float32(0.5)), st.just(np.int64(3)), st.just(np.array([1.0, 2.0])),
    st.just(np.array([[1, 2], [3, 4]])), st.just(np.nan), st.just(object()),
    st.lists(st.one_of(st.integers(), st.builds(RaisingField), st.none()), max_size=3),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=objects, b=objects, c=objects, d=objects, e=objects, f=objects)
def test_no_hot_path_entry_raises(pipeline: Any, a: Any, b: Any, c: Any, d: Any, e: Any,
                                  f: Any) -> None:
    t = pipeline.tracer
    instrumentation.set_capture_witness(True)
    with t.proof(system="gkr") as proof, t.layer(index=0, kind="MatMul", rounds=4) as layer:
        t.sumcheck_round(a, b, c, d)
        instrumentation.sumcheck_round(b, a, d, c)
        t.layer_activation(a)
        t.layer_activation(lambda: a)
        t.layer_activation(ActivationStats(a, b, c, d, e, f))
        t.attention_heatmap(a, b, c)
        t.attention_heatmap(0, 1, lambda: d)
        layer.set_final_claim(e)
        proof.set_result(layer_proofs=a, weight_openings=b, size=c, verified=d)
    with t.verify() as v:
        v.set_verified(f)


def _events(pipeline: Any, name: str) -> list[Any]:
    return [ev for s in pipeline.finished() for ev in s.events if ev.name == name]


@pytest.mark.parametrize("call", [
    lambda t: t.sumcheck_round(0, lambda: 1 / 0, 3),
    lambda t: t.sumcheck_round(0, [RaisingField()], 3),
    lambda t: t.sumcheck_round(0, [1, 2], lambda: 1 / 0),
    lambda t: t.layer_activation({"mean": 1}),
    lambda t: t.layer_activation(ActivationStats(1.0, 0.1, 0.0, 2.0, 0.0, sample=5)),
    lambda t: t.layer_activation(_raise),
    lambda t: t.attention_heatmap(0, 1, RaisingToList()),
    lambda t: t.attention_heatmap(0, 1, _raise),
], ids=["poly-raises", "field-raises", "claim-raises", "dict-stats", "scalar-sample",
        "stats-callable-raises", "tolist-raises", "scores-callable-raises"])
def test_each_reported_crash_is_recorded_and_counted(pipeline: Any, call: Any) -> None:
    instrumentation.set_capture_witness(True)
    t = pipeline.tracer
    with t.proof(system="gkr"), t.layer(index=0, kind="Attention", rounds=2):
        call(t)  # must not raise
    assert REJECTIONS.total() == 1
    errors = [ev for s in pipeline.finished() for ev in s.events
              if Attr.ERROR_TYPE in (ev.attributes or {})]
    assert len(errors) == 1, errors


def test_numpy_inputs_are_accepted(pipeline: Any) -> None:
    instrumentation.set_capture_witness(True)
    t = pipeline.tracer
    with t.proof(system="gkr") as proof, t.layer(index=0, kind="Attention", rounds=2):
        t.sumcheck_round(np.int64(1), np.array([1, 2, 3]), np.uint32(7), degree=np.int64(2))
        t.layer_activation(ActivationStats(np.float32(0.5), np.float64(0.1), np.float32(0),
                                           np.float32(1), np.float32(0.25),
                                           sample=np.array([0.1, 0.2], dtype=np.float32)))
        t.attention_heatmap(np.int64(0), np.int64(2), np.eye(2, dtype=np.float32))
        proof.set_result(layer_proofs=np.int64(3), size=np.uint64(10),
                         verified=np.bool_(True))
    assert REJECTIONS.total() == 0
    (round_,) = _events(pipeline, EventName.SUMCHECK_ROUND)
    assert round_.attributes[Attr.SUMCHECK_ROUND] == 1
    assert round_.attributes[Attr.SUMCHECK_DEGREE] == 2
    assert list(round_.attributes[Attr.SUMCHECK_POLY]) == ["1", "2", "3"]
    (act,) = _events(pipeline, EventName.LAYER_ACTIVATION)
    assert act.attributes[Attr.ACTIVATION_MEAN] == 0.5
    assert list(act.attributes[Attr.ACTIVATION_SAMPLE]) == pytest.approx([0.1, 0.2])
    (heat,) = _events(pipeline, EventName.ATTENTION_HEATMAP)
    assert heat.attributes[Attr.ATTENTION_SEQ_LEN] == 2
    root = next(s for s in pipeline.finished() if s.name == "proof")
    assert root.attributes[Attr.PROOF_VERIFIED] is True
    assert root.attributes[Attr.PROOF_LAYER_PROOFS] == 3


@pytest.mark.parametrize("bad", ["no", 1, None.__class__, 0.0, "False"])
def test_verified_must_be_a_bool(pipeline: Any, bad: Any) -> None:
    t = pipeline.tracer
    with t.proof(system="gkr") as proof:
        proof.set_result(verified=bad, size=5)
    root = next(s for s in pipeline.finished() if s.name == "proof")
    assert Attr.PROOF_VERIFIED not in root.attributes
    assert root.attributes[Attr.PROOF_SIZE] == 5
    assert REJECTIONS.total() == 1


@pytest.mark.parametrize("degree", ["abc", float("nan"), object(), -1, True])
def test_bad_degree_is_rejected_and_counted(pipeline: Any, degree: Any) -> None:
    t = pipeline.tracer
    with t.proof(system="gkr"), t.layer(index=0, kind="MatMul", rounds=2):
        t.sumcheck_round(0, [1, 2, 3], 4, degree=degree)
    (round_,) = _events(pipeline, EventName.SUMCHECK_ROUND)
    assert round_.attributes[Attr.SUMCHECK_DEGREE] == 2  # from the polynomial
    assert REJECTIONS.snapshot() == {("degree", "invalid"): 1}
