"""Giving ids back: ``CachedSource.close()`` returns what it holds to a source that takes ids back,
nested caches take ids back into their lane, and every deadline reads the injected clock.

All on :class:`MemorySource` (a real source that re-issues given-back ids first) and a clock the
test moves by hand.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sqlalchemy_tickets import CachedSource, TicketsError
from sqlalchemy_tickets.sources.base import GivesBack, coalesce, give_back_to
from support.memory_source import MemorySource


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Gated(MemorySource):
    """A MemorySource whose blocks after the first ``free`` wait for ``release``: a refill the
    test holds on its way."""

    def __init__(self, free: int = 1, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.free = free
        self.release = threading.Event()
        self.waiting = threading.Event()

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        with self._lock:
            gated = len(self.calls) >= self.free
        if gated:
            self.waiting.set()
            assert self.release.wait(30), "the test never released the block"
        return super().next_block(sequence, count, bits=bits)


def wait_until(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def held(cache: CachedSource) -> int:
    cache.wait_idle(10)
    return int(cache.stats()["in_hand"])


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def caches() -> Iterator[list[CachedSource]]:
    made: list[CachedSource] = []
    yield made
    for cache in made:
        cache.close()


def test_protocol_and_helpers() -> None:
    assert isinstance(MemorySource(), GivesBack)
    assert isinstance(CachedSource(MemorySource()), GivesBack)
    assert not isinstance(object(), GivesBack)
    assert give_back_to(object(), "a", range(1, 5)) == 0  # cannot take back: 0, no error
    assert give_back_to(MemorySource(), "a", range(0)) == 0
    assert coalesce([range(11, 21), range(1, 6), range(6, 11), range(2, 10, 2)]) == [
        range(2, 10, 2),
        range(1, 21),
    ]
    with pytest.raises(TicketsError, match="range"):
        CachedSource(MemorySource()).give_back("a", [1, 2])  # type: ignore[arg-type]
    with pytest.raises(TicketsError, match="increasing"):
        CachedSource(MemorySource()).give_back("a", range(10, 0, -1))


def test_close_gives_back_everything_held(clock: Clock) -> None:
    source = MemorySource()
    cache = CachedSource(source, clock=clock, min_block=50)
    drawn = [cache.next_id("a") for _ in range(120)]
    drawn += list(cache.next_block("a", 7))
    holding = held(cache)
    assert holding > 0
    assert cache.close() == 0
    stats = cache.stats()
    assert stats["burned"] == 0 and stats["given_back"] == holding and stats["in_hand"] == 0
    # Every id the cache held comes out of the source again, before any new one.
    again = source.next_block("a", holding + 5)
    assert list(again)[:holding] == [i for i in range(drawn[-1] + 1, drawn[-1] + holding + 1)]
    assert not set(again) & set(drawn)


def test_close_burns_what_a_source_cannot_take_back(clock: Clock) -> None:
    source = MemorySource(takes_back=False)
    cache = CachedSource(source, clock=clock, min_block=50)
    for _ in range(30):
        cache.next_id("a")
    holding = held(cache)
    assert holding > 0
    assert cache.close() == holding
    assert cache.stats()["burned"] == holding and cache.stats()["given_back"] == 0
    assert source.next_id("a") == 30 + holding + 1


def test_close_gives_back_a_block_still_on_its_way(clock: Clock) -> None:
    # The cache's deadlines read the injected clock: frozen, close() waits for the block,
    # however long the real wait (timeout is 0.05 s of the clock, never reached).
    source = Gated(free=1)
    cache = CachedSource(source, clock=clock, min_block=20, timeout=0.05)
    first = cache.next_id("a")
    while cache.stats()["in_flight"] == 0:
        cache.next_id("a")  # under the low-water mark: the next refill waits at the gate
    wait_until(source.waiting.is_set)
    result: list[int] = []
    closing = threading.Thread(target=lambda: result.append(cache.close()))
    closing.start()
    closing.join(0.5)
    assert closing.is_alive(), "close() gave up on the real clock, not the injected one"
    source.release.set()
    closing.join(10)
    assert result == [0]
    stats = cache.stats()
    assert stats["burned"] == 0 and stats["in_flight"] == 0
    assert stats["given_back"] == sum(len(call.ids) for call in source.given_back)
    # The block that was in flight is among what went back, and is issued again first.
    late = source.calls[1].ids
    assert any(set(late) <= set(call.ids) for call in source.given_back)
    assert first == 1 and source.next_id("a") == stats["issued"] + 1


def test_a_block_landing_after_the_wait_is_counted_then_given_back(clock: Clock) -> None:
    source = Gated(free=1)
    cache = CachedSource(source, clock=clock, min_block=20, timeout=0.5)
    cache.next_id("a")
    while cache.stats()["in_flight"] == 0:
        cache.next_id("a")
    wait_until(source.waiting.is_set)
    result: list[int] = []
    closing = threading.Thread(target=lambda: result.append(cache.close()))
    closing.start()
    wait_until(cache._closed.is_set)
    clock.now += 60  # past close()'s deadline: it stops waiting at its next wake-up
    closing.join(10)
    assert not closing.is_alive()
    assert len(source.calls) == 1  # the gated block has not been given yet
    # The block on its way counts as burned: close() could not give it back.
    assert result[0] == cache.stats()["in_flight"] > 0
    source.release.set()
    wait_until(lambda: cache.stats()["given_back"] > 0 and cache.stats()["in_flight"] == 0)
    late = source.calls[1].ids
    assert any(call.ids == late for call in source.given_back)
    assert cache.stats()["burned"] == 0  # it went back after all
    # Nobody got it from the closed cache, and the source issues it again.
    assert source.next_block("a", len(late)) == late


def test_nested_caches_give_back_through_every_tier(clock: Clock) -> None:
    source = MemorySource()
    inner = CachedSource(source, clock=clock, min_block=100)
    outer = CachedSource(inner, clock=clock, min_block=10)
    drawn = [outer.next_id("a") for _ in range(25)]
    outer_held = held(outer)
    inner_held = held(inner)
    assert outer_held > 0 and inner_held > 0
    assert outer.close() == 0
    assert inner.stats()["taken_back"] == outer_held
    assert held(inner) == inner_held + outer_held
    # Given-back ids come out of the inner cache first, and its lane keeps increasing.
    after = [inner.next_id("a") for _ in range(outer_held + 5)]
    assert after == sorted(after)
    assert after[0] == drawn[-1] + 1
    assert not set(after) & set(drawn)
    assert inner.close() == 0
    assert source.next_id("a") == max(after) + 1  # everything the inner held went back


def test_a_closed_inner_cache_passes_ids_on_to_its_source(clock: Clock) -> None:
    source = MemorySource()
    inner = CachedSource(source, clock=clock, min_block=100)
    outer = CachedSource(inner, clock=clock, min_block=10)
    drawn = [outer.next_id("a") for _ in range(25)]
    outer_held = held(outer)
    assert inner.close() == 0
    assert outer.close() == 0
    assert inner.stats()["given_back"] >= outer_held
    assert outer.stats()["given_back"] == outer_held and outer.stats()["burned"] == 0
    # Both tiers' ids are back at the source, lowest first.
    assert source.next_id("a") == drawn[-1] + 1


def test_a_closed_inner_over_a_source_that_cannot_take_back(clock: Clock) -> None:
    inner = CachedSource(MemorySource(takes_back=False), clock=clock, min_block=100)
    outer = CachedSource(inner, clock=clock, min_block=10)
    for _ in range(25):
        outer.next_id("a")
    outer_held = held(outer)
    inner.close()
    assert outer.close() == outer_held
    assert outer.stats()["burned"] == outer_held


def test_stats_fields(clock: Clock) -> None:
    cache = CachedSource(MemorySource(), clock=clock)
    cache.next_id("a")
    cache.next_id("b", bits=32)
    stats = cache.stats()
    for key in ("issued", "in_hand", "burned", "given_back", "taken_back"):
        assert key in stats
        for lane in stats["sequences"].values():
            assert key in lane
    cache.close()
    after = cache.stats()
    assert after["burned"] == 0 and after["given_back"] == stats["in_hand"] + stats["in_flight"]


def test_taken_back_ids_keep_a_lane_in_order(clock: Clock) -> None:
    # An inner cache holding ready ids, the rest of a block and blocks ahead takes back a run
    # from below them: it is handed out first, then the rest in order, next_id and next_block.
    source = MemorySource(max_block=40)
    inner = CachedSource(source, clock=clock, min_block=40)
    given = inner.next_block("a", 10)
    out = [inner.next_id("a") for _ in range(3)]
    assert inner.give_back("a", given) == 10
    got: list[int] = []
    for i in range(60):
        if i % 9 == 0:
            got.extend(inner.next_block("a", 4))
        else:
            got.append(inner.next_id("a"))
    assert got[:10] == list(given)
    assert got == sorted(got) and not set(got[10:]) & set(out)
    inner.close()


def _draw(cache: CachedSource, k: int, got: list[int], start: threading.Barrier) -> None:
    """Draw until the cache is closed under us: singles in even threads, blocks in odd ones."""
    start.wait()
    try:
        while True:
            if k % 2:
                got.extend(cache.next_block("a", 3))
            else:
                got.append(cache.next_id("a"))
    except TicketsError:
        return  # closed


def test_racing_callers_and_close_never_duplicate(clock: Clock) -> None:
    # Threads draw while close() runs: every id a thread got, and every id the source issues
    # again afterwards, is unique.
    for _ in range(20):
        source = MemorySource()
        cache = CachedSource(source, clock=clock, min_block=64)
        got: list[list[int]] = [[] for _ in range(4)]
        start = threading.Barrier(5)
        threads = [
            threading.Thread(target=_draw, args=(cache, k, got[k], start)) for k in range(4)
        ]
        for t in threads:
            t.start()
        start.wait()
        wait_until(lambda got=got: sum(map(len, got)) >= 500)  # type: ignore[misc]
        cache.close()
        for t in threads:
            t.join(10)
        issued = [i for chunk in got for i in chunk]
        again = list(source.next_block("a", 10_000))
        every = issued + again
        assert len(set(every)) == len(every)
