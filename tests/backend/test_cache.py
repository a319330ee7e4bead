"""CachedSource against real ticket servers: order, tiers, bursts, outages, budgets, exhaustion."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import (
    CachedSource,
    ExhaustedError,
    TicketsError,
    TicketServer,
    TicketServerUnavailable,
)
from support.proxy import TcpProxy


class Clock:
    """A clock the test moves by hand: rates are measured in simulated time."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def server(database_url: str) -> Iterator[TicketServer]:
    server = TicketServer(database_url)
    yield server
    server.close()


@pytest.mark.backend("postgresql", "mysql")
def test_hundred_thousand_ids_in_order_with_few_round_trips(server: TicketServer) -> None:
    with CachedSource(server) as cache:
        ids = [cache.next_id("photos") for _ in range(100_000)]
        stats = cache.stats()
    assert ids == sorted(ids)
    assert len(set(ids)) == 100_000
    assert stats["issued"] == 100_000
    assert stats["round_trips"] <= 100_000 / 100
    assert server.stats()["round_trips"] <= 100_000 / 100 + 3  # + first contact


def test_child_caches_over_one_parent_never_share_an_id(server: TicketServer) -> None:
    parent = CachedSource(server, max_block=5_000)
    children = [CachedSource(parent, min_block=8, max_block=500) for _ in range(2)]
    drawn: list[list[int]] = [[] for _ in range(8)]

    def work(k: int) -> None:
        child = children[k % 2]
        for i in range(3_000):
            if i % 100 == 0:
                got = 0
                while got < 25:  # a cache may return fewer than asked; ask again
                    block = child.next_block("photos", 25 - got)
                    assert 1 <= len(block) <= 25 - got
                    drawn[k].extend(block)
                    got += len(block)
            else:
                drawn[k].append(child.next_id("Photos"))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for chunk in drawn for i in chunk]
    assert len(every) == 8 * (2_970 + 30 * 25)
    assert len(set(every)) == len(every)
    # The children drew from the parent, not from the server.
    assert parent.stats()["issued"] >= len(every)
    assert server.stats()["issued"] == parent.stats()["issued"] + parent.stats()["in_hand"]
    for cache in (*children, parent):
        cache.close()


def test_rate_steps_without_blocking_waits_after_warm_up(server: TicketServer) -> None:
    clock = Clock()
    cache = CachedSource(server, clock=clock, supply=10.0, min_block=16, window=60.0)
    sizes: dict[str, list[int]] = {"base": [], "spike": [], "after": []}
    rates: dict[str, list[float]] = {"base": [], "spike": [], "after": []}
    last = 0
    for phase, per_second, seconds in (("base", 10, 60), ("spike", 100, 60), ("after", 10, 120)):
        for _ in range(seconds * 10):  # steps of 100 ms of simulated time
            for _ in range(per_second // 10):
                new = cache.next_id("photos")
                assert new > last
                last = new
            clock.now += 0.1
            # Wait for the refill a real server takes a few ms for: counted, not timed.
            assert cache.wait_idle(10)
            stats = cache.stats()
            sizes[phase].append(stats["block_size"])
            rates[phase].append(stats["rate"])
    stats = cache.stats()
    assert stats["blocking_waits"] == 1  # the very first id, with an empty cache
    assert max(sizes["spike"]) >= 5 * max(sizes["base"])  # blocks grew with the spike
    assert rates["after"][-1] < max(rates["spike"])  # and the rate fell after it...
    assert rates["after"][10] > 2 * rates["after"][-1] > 2 * 10  # ...slowly
    cache.close()


def test_waste_budget_bounds_what_a_restart_burns(server: TicketServer) -> None:
    cache = CachedSource(server, waste_budget=100, supply=3600.0, min_block=10)
    for _ in range(5_000):
        cache.next_id("photos")
        assert cache.stats()["in_hand"] <= 100
    burned = cache.close()
    assert 0 <= burned <= 100
    last = server.describe("photos").last_id  # type: ignore[union-attr]
    assert last == 5_000 + burned


def test_a_32_bit_sequence_near_its_end_never_overshoots(server: TicketServer) -> None:
    server.create("small", bits=32, start=2**31 - 300)
    cache = CachedSource(server, min_block=64, waste_budget=1_000_000)
    ids = []
    with pytest.raises(ExhaustedError):
        while True:
            ids.append(cache.next_id("small", bits=32))
    assert ids == list(range(2**31 - 300, 2**31))
    assert server.describe("small", bits=32).last_id == 2**31 - 1  # type: ignore[union-attr]
    cache.close()


def test_closed_cache_refuses(server: TicketServer) -> None:
    cache = CachedSource(server)
    cache.next_id("photos")
    cache.close()
    with pytest.raises(TicketsError, match="closed"):
        cache.next_id("photos")


@pytest.mark.parametrize("fault", ["refuse", "hang"])
@pytest.mark.backend("postgresql", "mysql")
def test_an_outage_is_ridden_out_on_what_the_cache_holds(
    make_database, backend: str, fault: str
) -> None:
    url = make_database(backend)
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=1.0)
        cache = CachedSource(server, min_block=2_000, waste_budget=100_000, backoff=0.05)
        first = [cache.next_id("photos") for _ in range(10)]
        assert cache.wait_idle(10)
        held = cache.stats()["in_hand"]
        getattr(proxy, fault)()
        during = [cache.next_id("photos") for _ in range(held - 1)]
        # Refills were tried and failed meanwhile; callers saw nothing of it.
        deadline = time.monotonic() + 10
        while cache.stats()["sequences"]["photos/64"]["failures"] == 0:
            assert time.monotonic() < deadline, "no refill was attempted during the outage"
            threading.Event().wait(0.01)
        proxy.forward()
        after = [cache.next_id("photos") for _ in range(5_000)]
        every = first + during + after
        assert every == sorted(every) and len(set(every)) == len(every)
        cache.close()
        server.close()


@pytest.mark.backend("postgresql", "mysql")
def test_empty_cache_with_no_upstream_fails_within_its_timeout(make_database, backend: str) -> None:
    url = make_database(backend)
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=1.0)
        cache = CachedSource(server, timeout=1.5)
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(TicketServerUnavailable, match="cache is empty"):
            cache.next_id("photos")
        assert time.monotonic() - started < 6
        cache.close()
        server.close()


def test_the_event_loop_keeps_running_while_a_refill_waits(make_database) -> None:
    url = make_database("postgresql")
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=1.0)
        server.create("photos")
        cache = CachedSource(server, timeout=5.0, backoff=0.05)
        proxy.hang()

        async def main() -> tuple[int, int]:
            ticks = 0
            done = asyncio.Event()

            async def heartbeat() -> None:
                nonlocal ticks
                while not done.is_set():
                    ticks += 1
                    await asyncio.sleep(0.01)

            beat = asyncio.create_task(heartbeat())
            loop = asyncio.get_running_loop()
            loop.call_later(1.5, proxy.forward)
            new = await cache.next_id_async("photos")
            done.set()
            await beat
            return new, ticks

        new, ticks = asyncio.run(main())
        assert new >= 1
        assert ticks > 50  # the loop ran all along the wait for the server to come back
        cache.close()
        server.close()


def _child_ids(cache: CachedSource, queue: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    queue.put([cache.next_id("photos") for _ in range(50)])


def test_a_forked_child_does_not_reuse_its_parents_ids(server: TicketServer) -> None:
    cache = CachedSource(server, min_block=1_000)
    parent_first = [cache.next_id("photos") for _ in range(10)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_ids, args=(cache, queue))
    child.start()
    child_ids = queue.get(timeout=60)
    child.join(60)
    parent_rest = [cache.next_id("photos") for _ in range(500)]
    every = parent_first + parent_rest + child_ids
    assert len(set(every)) == len(every)
    cache.close()
