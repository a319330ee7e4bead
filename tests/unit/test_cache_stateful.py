"""``CachedSource`` as a state machine: hypothesis drives random sequences of ``next_id``,
``next_block`` and clock jumps on an in-memory upstream and an injected clock, and after every
step (refills awaited) checks what must always hold:

* no id is issued twice in a lane, and every id came from the upstream for that lane;
* ``next_id`` hands a lane's ids out in increasing order (and so does ``next_block``);
* nothing is lost: what the upstream gave = what the cache issued + what it holds;
* what it holds stays within the waste budget (plus, at most, the shortfall of a ``next_block``
  caller it was asked to cover);
* ``stats()`` agrees with what the callers saw.
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sqlalchemy_tickets import CachedSource
from support.memory_source import MemorySource

LANES = [("a", 64), ("b", 64), ("a", 32)]


class Clock:
    """A monotonic clock the test moves by hand: the rate estimate sees only these jumps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        budget=st.integers(2, 5_000),
        min_block=st.integers(1, 64),
        supply=st.floats(0.01, 60.0),
        max_upstream_block=st.none() | st.integers(1, 300),
    )
    def start(self, budget: int, min_block: int, supply: float, max_upstream_block: Any) -> None:
        self.clock = Clock()
        self.upstream = MemorySource(max_block=max_upstream_block)
        self.budget = budget
        self.cache = CachedSource(
            self.upstream,
            min_block=min_block,
            max_block=100_000,
            supply=supply,
            window=30.0,
            waste_budget=budget,
            clock=self.clock,
            timeout=5.0,
        )
        self.singles: dict[tuple[str, int], list[int]] = {lane: [] for lane in LANES}
        self.blocks: dict[tuple[str, int], list[range]] = {lane: [] for lane in LANES}
        self.asked: dict[tuple[str, int], int] = {lane: 0 for lane in LANES}

    def teardown(self) -> None:
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.close()

    @rule(lane=st.sampled_from(LANES), times=st.integers(1, 200))
    def next_ids(self, lane: tuple[str, int], times: int) -> None:
        sequence, bits = lane
        self.singles[lane].extend(self.cache.next_id(sequence, bits=bits) for _ in range(times))
        self.cache.wait_idle(5.0)

    @rule(lane=st.sampled_from(LANES), count=st.integers(1, 500))
    def next_block(self, lane: tuple[str, int], count: int) -> None:
        sequence, bits = lane
        block = self.cache.next_block(sequence, count, bits=bits)
        assert 1 <= len(block) <= count
        self.blocks[lane].append(block)
        self.asked[lane] = max(self.asked[lane], count)
        self.cache.wait_idle(5.0)

    @rule(seconds=st.floats(0.0, 120.0))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    def _from_upstream(self, lane: tuple[str, int]) -> list[int]:
        return [i for c in self.upstream.calls if (c.sequence, c.bits) == lane for i in c.ids]

    @invariant()
    def ids_unique_ordered_and_accounted_for(self) -> None:
        if not hasattr(self, "cache"):
            return
        stats = self.cache.stats()["sequences"]
        for lane in LANES:
            singles = self.singles[lane]
            carved = [i for block in self.blocks[lane] for i in block]
            issued = singles + carved
            assert len(set(issued)) == len(issued), f"{lane}: an id was issued twice"
            assert all(a < b for a, b in zip(singles, singles[1:], strict=False)), (
                f"{lane}: next_id out of order"
            )
            starts = [b.start for b in self.blocks[lane]]
            assert starts == sorted(starts), f"{lane}: blocks out of order"
            upstream = self._from_upstream(lane)
            assert set(issued) <= set(upstream), f"{lane}: an id the upstream never gave"
            seen = stats.get(f"{lane[0]}/{lane[1]}")
            if seen is None:
                assert not issued and not upstream
                continue
            assert seen["issued"] == len(issued)
            assert len(upstream) == len(issued) + seen["in_hand"], f"{lane}: ids lost"
            limit = max(self.budget, self.budget // 2 + self.asked[lane])
            assert seen["in_hand"] <= limit, (
                f"{lane}: {seen['in_hand']} ids held, over the budget of {self.budget}"
            )


TestCachedSourceStateMachine = CacheMachine.TestCase
TestCachedSourceStateMachine.settings = settings(
    max_examples=60, stateful_step_count=25, deadline=None
)
