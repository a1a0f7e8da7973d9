"""One bound on the bytes several queues of a process hold together.

Why: the export process has three queues (the OTLP stage's, the Rerun sink's and the
packed backlog in front of it), each bounded on its own. Their bounds added up to
~220 MiB (128 MiB for the Rerun sink's queue alone), past issue 29's decision 6 (at
most +64 MB, prover and export process together, against a dead collector). With one
budget, what one queue does not hold another may use: a healthy collector leaves the
view's backlog most of it, a dead one can take no more than its own cap, and a reserve
keeps the view's queue fed.

Each queue keeps counting its own bytes (the counts it already had); the budget reads
them when a queue admits something. The reads take no lock, so two queues admitting at
the same instant may overshoot by what each admitted then: a bound on an estimate, not
an accounting.
"""

from __future__ import annotations

from collections.abc import Callable


class ByteBudget:
    """Bytes held by several queues, bounded together."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a byte budget must be >= 1 byte, not {limit}")
        self.limit = limit
        self._shares: list[BudgetShare] = []

    def share(self, held: Callable[[], int], *, reserve: int = 0) -> BudgetShare:
        """A queue whose bytes (``held()``) count against the budget; ``reserve``: bytes
        kept for it that the others may not take, though it holds less."""
        if not 0 <= reserve <= self.limit:
            raise ValueError(f"a reserve must be within the budget (0..{self.limit}), "
                             f"not {reserve}")
        share = BudgetShare(self, held, reserve)
        self._shares.append(share)
        return share

    def held(self) -> int:
        return sum(s.held() for s in self._shares)

    def _room_for(self, me: BudgetShare) -> int:
        others = sum(max(s.held(), s.reserve) for s in self._shares if s is not me)
        mine = me.held()
        # An overshoot by the others (two queues admitting at once) never eats a reserve.
        return max(self.limit - others - mine, me.reserve - mine)


class BudgetShare:
    """One queue's part of a :class:`ByteBudget`."""

    def __init__(self, budget: ByteBudget, held: Callable[[], int], reserve: int) -> None:
        self._budget = budget
        self.held = held
        self.reserve = reserve

    def room(self) -> int:
        """Bytes this queue may still admit (negative after an overshoot)."""
        return self._budget._room_for(self)
