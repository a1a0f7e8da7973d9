"""serve's in-flight byte budget (``otlp_receiver.limits.ByteBudget``) for a request that
waits for room (a gRPC request, held until its answer is due): it gets room as soon as
bytes are released, but only within half the budget, so a sender that retries instead
(OTLP/HTTP, a second after its 503) still finds room beside the waiters."""

from __future__ import annotations

import threading
import time

from otel_proofscope.integrations.otlp_receiver.limits import ByteBudget


def test_a_waiter_gets_room_as_soon_as_enough_is_released() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(80)
    took: list[float] = []

    def wait() -> None:
        start = time.monotonic()
        assert budget.reserve(40, wait_until=start + 5.0)
        took.append(time.monotonic() - start)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert not took  # still waiting: 80 + 40 > 100
    budget.release(80)
    waiter.join(5)
    assert took and 0.25 <= took[0] < 2.0
    assert budget.used == 40


def test_a_waiter_leaves_half_the_budget_to_senders_that_retry() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(40) and budget.reserve(40)
    done = threading.Event()

    def wait() -> None:
        if budget.reserve(30, wait_until=time.monotonic() + 5.0):
            done.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.2)  # waiting: 80 + 30 > 100
    budget.release(40)  # 40 used: 40 + 30 fits the budget, not its half
    time.sleep(0.3)
    assert not done.is_set()
    assert budget.reserve(50)  # a sender that does not wait takes what is there
    budget.release(50)
    budget.release(30)  # 10 used: 10 + 30 <= 50
    waiter.join(5)
    assert done.is_set() and budget.used == 40


def test_a_request_that_fits_at_once_never_waits_and_one_alone_always_fits() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(90, wait_until=time.monotonic() + 5.0)  # fits the whole budget
    budget.release(90)
    assert budget.reserve(500, wait_until=time.monotonic())  # nothing in flight: let through
    budget.release(500)


def test_a_waiter_gives_up_at_its_deadline() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(100)
    start = time.monotonic()
    assert not budget.reserve(10, wait_until=start + 0.3)
    assert 0.25 <= time.monotonic() - start < 2.0
    assert not budget.reserve(10)  # no deadline: refused at once
    assert budget.used == 100


def test_stop_waiting_ends_every_wait_and_refuses_new_ones() -> None:
    budget = ByteBudget(100)
    assert budget.reserve(100)
    got: list[bool] = []
    waiter = threading.Thread(
        target=lambda: got.append(budget.reserve(10, wait_until=time.monotonic() + 10.0)))
    waiter.start()
    time.sleep(0.2)
    start = time.monotonic()
    budget.stop_waiting()
    waiter.join(5)
    assert got == [False] and time.monotonic() - start < 1.0
    assert not budget.reserve(10, wait_until=time.monotonic() + 10.0)
    budget.release(100)
    assert budget.reserve(10)  # what fits at once still does (requests in progress)
