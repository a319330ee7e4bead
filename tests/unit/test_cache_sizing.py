"""How much a cache holds, and when it refills: the promises that replaced the ``waste_ratio``
cap. On :class:`MemorySource` (a real source in memory) and a clock the test moves by hand, so
rates are exact and nothing waits on a real clock.

- A lane holds ``supply`` seconds of ids at its rate and refills at half of that: it rides out
  an outage of ``supply / 2`` seconds. What it holds (what a crash burns; a clean exit gives it
  back) is never more than it has issued (or ``min_block``), than one and a half blocks of
  ``max_block``, nor than the budget.
- A lane refills before it runs dry: no ``next_id`` waits after the first block, one busy
  lane or thousands of quiet ones.
- A quiet lane stays on the fast path: the slow path runs about twice per block, not per id.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sqlalchemy_tickets import CachedSource
from support.memory_source import MemorySource


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.002)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def caches() -> Iterator[list[CachedSource]]:
    made: list[CachedSource] = []
    yield made
    for cache in made:
        cache.close()


def held(cache: CachedSource, sequence: str) -> int:
    cache.wait_idle(10)
    lane = cache.stats()["sequences"][f"{sequence}/64"]
    return int(lane["in_hand"] + lane["in_flight"])


def draw(cache: CachedSource, clock: Clock, sequence: str, rate: float, seconds: float) -> None:
    """``rate`` ids per second for ``seconds``, in steps of 1 ms of the test's clock, each
    step's refills landed before the next (a source that answers within a millisecond)."""
    per_step = rate / 1000
    owed = 0.0
    for _ in range(int(seconds * 1000)):
        clock.now += 0.001
        owed += per_step
        while owed >= 1:
            cache.next_id(sequence)
            owed -= 1
        cache.wait_idle(10)


def test_what_a_lane_holds_is_bounded_by_what_it_issued_max_block_and_the_budget(
    clock: Clock, caches: list
) -> None:
    young = CachedSource(MemorySource(), clock=clock, supply=30.0, min_block=16)
    capped = CachedSource(MemorySource(), clock=clock, supply=30.0, max_block=5_000)
    budgeted = CachedSource(MemorySource(), clock=clock, supply=30.0, waste_budget=3_000)
    caches.extend([young, capped, budgeted])
    for cache in (young, capped, budgeted):
        draw(cache, clock, "busy", rate=2_000, seconds=3)  # 60,000 ids of supply at this rate
        assert cache.stats()["blocking_waits"] == 1  # the first block only
    issued = young.stats()["issued"]
    assert issued == 6_000
    assert held(young, "busy") <= issued  # a crash burns at most what it used
    assert held(capped, "busy") <= 1.5 * 5_000
    assert held(budgeted, "busy") <= 3_000


def test_an_old_lane_holds_supply_seconds_and_rides_out_half_of_them(
    clock: Clock, caches: list
) -> None:
    source = MemorySource()
    cache = CachedSource(source, clock=clock, supply=10.0, min_block=16)
    caches.append(cache)
    draw(cache, clock, "steady", rate=1_000, seconds=25)  # issued more than it holds
    holding = held(cache, "steady")
    assert 0.5 * 10 * 1_000 <= holding <= 1.6 * 10 * 1_000
    # The source goes away: the lane keeps issuing for supply / 2 seconds at the same rate.
    source.max_block = 1

    def down(sequence: str | None, count: int, *, bits: int = 64) -> range:
        raise AssertionError("the cache asked its source during the outage window")

    waits = cache.stats()["blocking_waits"]
    stats = cache.stats()["sequences"]["steady/64"]
    runway = stats["in_hand"] / 1_000
    assert runway >= 10.0 / 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(source, "next_block", down)
        for _ in range(int(10.0 / 2 * 1_000) - 50):
            cache.next_id("steady")
    assert cache.stats()["blocking_waits"] == waits


def test_a_burst_in_a_young_process_never_waits(clock: Clock, caches: list) -> None:
    source = MemorySource()
    cache = CachedSource(source, clock=clock, supply=30.0, min_block=16)
    caches.append(cache)
    draw(cache, clock, "bursty", rate=100, seconds=3)
    draw(cache, clock, "bursty", rate=1_000, seconds=3)  # ten times the rate, at once
    assert cache.stats()["blocking_waits"] == 1


def test_quiet_lanes_stay_on_the_fast_path(clock: Clock, caches: list) -> None:
    source = MemorySource()
    cache = CachedSource(source, clock=clock, min_block=16)
    caches.append(cache)
    names = [f"q{i}" for i in range(300)]
    cache.prepare(names)
    slow = 0
    real = cache._next_id_slow

    def counting(sequence: str | None, bits: int) -> int:
        nonlocal slow
        slow += 1
        return real(sequence, bits)

    cache._next_id_slow = counting  # type: ignore[method-assign]
    for _ in range(40):  # 12,000 ids over 300 lanes, one second apart per round
        clock.now += 1.0
        for name in names:
            cache.next_id(name)
        cache.wait_idle(10)
    # Once per chunk, twice per block (down to the low-water mark, then the rest of it): the
    # slow path follows the refills, not the ids (before, a lane's chunks were a quarter of
    # its low-water mark, a couple of ids for a quiet lane).
    refills = sum(lane["refills"] for lane in cache.stats()["sequences"].values())
    assert slow <= 2 * refills + 2 * len(names)
    assert slow < 12_000 / 4
    assert cache.stats()["blocking_waits"] == 0  # prepare's first blocks are no caller's wait


class Batching(MemorySource):
    """Takes and gives back many sequences per call, recording how many each call carried."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[int] = []

    def next_blocks(self, requests: list) -> list:
        self.batches.append(len(requests))
        return [self.next_block(s, c, bits=b) for s, c, b in requests]

    def give_back_many(self, items: list) -> list:
        self.batches.append(len(items))
        return [self.give_back(s, ids, bits=b) for s, ids, b in items]


def test_prepare_takes_every_first_block_in_one_call_where_the_source_takes_many(
    clock: Clock, caches: list
) -> None:
    source = Batching()
    cache = CachedSource(source, clock=clock)
    caches.append(cache)
    cache.prepare([f"p{i}" for i in range(700)])
    assert source.batches == [700]
    assert cache.stats()["in_hand"] == 700 * 16
    ids = {cache.next_id(f"p{i}") for i in range(700)}
    assert ids == {1}  # every sequence its own first id
    assert cache.stats()["blocking_waits"] == 0


def test_close_gives_every_lane_back_in_one_call_where_the_source_takes_many(
    clock: Clock, caches: list
) -> None:
    source = Batching()
    cache = CachedSource(source, clock=clock)
    for i in range(500):
        cache.next_id(f"g{i}")
    source.batches.clear()  # the refills' batches: only close()'s are counted
    assert cache.close() == 0
    assert source.batches == [500]


def test_free_threaded_builds_take_the_lock_on_every_id(
    clock: Clock, caches: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sqlalchemy_tickets import _process

    monkeypatch.setattr(_process, "gil_enabled", lambda: False)
    cache = CachedSource(MemorySource(), clock=clock, min_block=64)
    caches.append(cache)
    got: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [cache.next_id("locked") for _ in range(2_000)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(got) == len(set(got)) == 8_000
    assert cache._next64 == {}  # no lock-free path was installed
