"""span_guard refuses exactly the spans Rerun's int64 timelines cannot hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import SpanContext

from otel_proofscope.rerun import span_guard

CTX = SpanContext(1, 2, is_remote=False)


def _span(event_times: list[int | None]) -> ReadableSpan:
    events = [Event(f"e{i}", {"k": i}, timestamp=t) for i, t in enumerate(event_times)]
    return ReadableSpan("s", CTX, events=events, start_time=1, end_time=2)


@given(st.lists(st.integers(0, 2**64 - 1), max_size=6))
def test_event_times_beyond_int64_are_refused(times: list[int]) -> None:
    why = span_guard.problem(_span(list(times)))
    bad = [i for i, t in enumerate(times) if t > span_guard.MAX_TIME_NS]
    if bad:
        assert why is not None and f"event 'e{bad[0]}'" in why
    else:
        assert why is None


def test_an_unreadable_span_is_refused_not_raised() -> None:
    class Hostile:
        name = "h"
        start_time = 1
        end_time = 2

        @property
        def events(self) -> list[object]:
            raise RuntimeError("boom")

    why = span_guard.problem(Hostile())
    assert why is not None and "unreadable" in why
