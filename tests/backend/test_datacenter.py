"""DatacenterTier: a stock of ids in a datacenter database, shared by processes, refilled from
upstream in the background; given-back ids first; the stock outlives processes and upstream."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    ExhaustedError,
    TicketsError,
    TicketServer,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from sqlalchemy_tickets.sources.datacenter import (
    create_datacenter_tables,
    describe_datacenter,
)
from support.proxy import TcpProxy

#: Options that keep the stock at exactly ``min_block`` ids: no rate can grow the target.
STEADY: dict[str, Any] = {"supply": 0.001, "min_block": 100, "timeout": 2.0}


def _status(url: str, sequence: str = "photos") -> Any:
    return next(s for s in describe_datacenter(url) if s.sequence == sequence)


def _drain(tier: DatacenterTier, sequence: str, count: int, per: int | None = None) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        ids.extend(tier.next_block(sequence, min(per or count, count - len(ids))))
    return ids


@pytest.fixture
def upstream(backend: str, make_database: Callable[[str], str]) -> Iterator[TicketServer]:
    server = TicketServer(make_database(backend))
    yield server
    server.close()


@pytest.fixture
def proxied_upstream(make_database: Callable[[str], str]) -> Iterator[tuple[TcpProxy, str]]:
    """A PostgreSQL ticket database behind a TCP proxy the test can cut or hang."""
    url = make_database("postgresql")
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        yield proxy, proxy.url(url)


def test_ids_are_unique_and_the_stock_refills_in_the_background(
    database_url: str, upstream: TicketServer
) -> None:
    with DatacenterTier(database_url, upstream, **STEADY) as tier:
        ids = _drain(tier, "Photos", 1_000, per=10)
        assert len(set(ids)) == 1_000
        assert ids == sorted(ids)  # one process over one upstream server: increasing
        assert tier.wait_idle(10)
        stats = tier.stats()
        assert stats["issued"] == 1_000
        assert stats["upstream_round_trips"] >= 10  # min_block=100 at a time
        status = _status(database_url)
        assert status.issued == 1_000
        assert status.stock == status.refilled - 1_000 >= 50  # topped up above low water
        assert status.claim_owner is None  # released


def test_ids_given_back_come_out_first(database_url: str, upstream: TicketServer) -> None:
    with DatacenterTier(database_url, upstream, **STEADY) as tier:
        first = tier.next_block("photos", 30)
        later = tier.next_block("photos", 5)
        assert tier.give_back("photos", first[10:20]) == 10
        assert tier.give_back("photos", first[10:20]) == 0  # twice: refused
        assert tier.give_back("photos", first[25:27]) == 2
        again = _drain(tier, "photos", 12)
        assert again == list(first[10:20]) + list(first[25:27])
        after = tier.next_block("photos", 1)
        assert after.start > later[-1]
        status = _status(database_url)
        assert status.given_back == 12
        assert status.given_back_in_stock == 0


def test_a_range_given_back_keeps_its_stride(backend: str, make_database: Any) -> None:
    up = TicketServer(make_database(backend), stride=(2, 2))
    try:
        with DatacenterTier(make_database(backend), up, **STEADY) as tier:
            block = tier.next_block("photos", 10)
            assert block.step == 2 and all(i % 2 == 0 for i in block)
            assert tier.give_back("photos", block[3:7]) == 4
            assert tier.next_block("photos", 10) == block[3:7]
    finally:
        up.close()


def test_bad_input_is_refused_before_anything_is_written(
    database_url: str, upstream: TicketServer
) -> None:
    with pytest.raises(TicketsError, match="not a ticket source"):
        DatacenterTier(database_url, object())  # type: ignore[arg-type]
    with pytest.raises(TicketsError, match="supply"):
        DatacenterTier(database_url, upstream, supply=0)
    with pytest.raises(TicketsError, match="prefix"):
        DatacenterTier(database_url, upstream, table_prefix="tickets__x")
    with DatacenterTier(database_url, upstream, **STEADY) as tier:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(TicketsError, match="count"):
                tier.next_block("photos", bad)  # type: ignore[arg-type]
        with pytest.raises(ExhaustedError):
            tier.next_block("photos", 2**31, bits=32)
        with pytest.raises(TicketsError, match="bits"):
            tier.next_block("photos", 1, bits=16)
        with pytest.raises(TicketsError, match="sequence name"):
            tier.next_block("no spaces", 1)
        with pytest.raises(TicketsError, match="range"):
            tier.give_back("photos", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(TicketsError, match="increasing"):
            tier.give_back("photos", range(10, 0, -1))
        with pytest.raises(TicketsError, match="increasing"):
            tier.give_back("small", range(2**31 - 5, 2**31 + 5), bits=32)
    # Nothing was written: not even the tables.
    engine = sa.create_engine(database_url)
    try:
        assert not sa.inspect(engine).has_table("tickets_dc__state")
    finally:
        engine.dispose()


def test_tables_created_once_described_and_apart_from_sequence_tables(
    database_url: str, upstream: TicketServer
) -> None:
    create_datacenter_tables(database_url)
    create_datacenter_tables(database_url)  # again: nothing happens
    assert describe_datacenter(database_url) == []
    with DatacenterTier(database_url, upstream, **STEADY, create_missing=False) as tier:
        tier.next_block("photos", 10)
        tier.next_block(None, 10, bits=32)  # Flickr's Tickets32 upstream
        assert tier.wait_idle(10)
    described = {(s.sequence, s.bits): s for s in describe_datacenter(database_url)}
    assert set(described) == {("photos", 64), (None, 32)}
    assert described["photos", 64].issued == 10
    # A sequence named like the tier's tables gets a table of its own on a server there.
    server = TicketServer(database_url)
    try:
        assert server.next_id("dc__stock") == 1
    finally:
        server.close()
    engine = sa.create_engine(database_url)
    try:
        names = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert {"tickets_dc__stock", "tickets_dc__state", "tickets__dc__stock"} <= names


def test_missing_tables_without_create_missing(database_url: str, upstream: TicketServer) -> None:
    with DatacenterTier(database_url, upstream, create_missing=False) as tier:
        with pytest.raises(UnknownSequenceError, match="init"):
            tier.next_block("photos", 1)
    with pytest.raises(UnknownSequenceError):
        describe_datacenter(database_url)


def test_under_a_cache_ids_stay_unique(database_url: str, upstream: TicketServer) -> None:
    tier = DatacenterTier(database_url, upstream, min_block=500)
    cache = CachedSource(tier)
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [cache.next_id("photos") for _ in range(2_000)]
        mine.extend(cache.next_block("photos", 50))
        with lock:
            seen.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.close()
    tier.close()
    assert len(seen) == len(set(seen)) >= 4 * 2_001  # a block may be short, never empty


def test_upstream_exhausted_and_stock_empty_is_exhausted(
    database_url: str, upstream: TicketServer
) -> None:
    limit = 2**31 - 1
    upstream.create("small", bits=32, start=limit - 149)  # 150 ids left upstream
    with DatacenterTier(database_url, upstream, supply=0.001, min_block=100) as tier:
        ids = []
        with pytest.raises(ExhaustedError):
            while True:
                ids.extend(tier.next_block("small", 40, bits=32))
        # Every id below the limit came out once, the last ones too.
        assert sorted(ids) == list(range(limit - 149, limit + 1))


def test_threads_of_one_process_never_share_an_id(
    database_url: str, upstream: TicketServer
) -> None:
    with DatacenterTier(database_url, upstream, **STEADY) as tier:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            results = list(pool.map(lambda _: _drain(tier, "photos", 300, 7), range(6)))
    ids = [i for chunk in results for i in chunk]
    assert len(ids) == len(set(ids)) == 1_800


# -- the stock outlives processes and upstream --------------------------------------------------


def _draw_until_empty(url: str, upstream_url: str, queue: Any) -> None:
    """In a new process: a new tier over an unreachable upstream takes what the stock holds."""
    upstream = TicketServer(upstream_url, timeout=1.0)
    tier = DatacenterTier(url, upstream, supply=0.001, min_block=100, timeout=1.0)
    ids: list[int] = []
    waits: list[float] = []
    try:
        while True:
            started = time.monotonic()
            ids.extend(tier.next_block("photos", 7))
            waits.append(time.monotonic() - started)
    except TicketServerUnavailable:
        empty_after = time.monotonic() - started
    queue.put((ids, max(waits), empty_after, tier.stats()["upstream_round_trips"]))
    tier.close()


def test_the_stock_serves_a_new_process_with_upstream_down(
    backend: str, make_database: Any, proxied_upstream: tuple[TcpProxy, str]
) -> None:
    proxy, upstream_url = proxied_upstream
    url = make_database(backend)
    upstream = TicketServer(upstream_url, timeout=1.0)
    with DatacenterTier(url, upstream, supply=0.001, min_block=200) as tier:
        before = tier.next_block("photos", 1)
        assert tier.wait_idle(10)
    upstream.close()
    held = _status(url).stock
    assert held >= 100
    proxy.refuse()  # the global tier is down
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_draw_until_empty, args=(url, upstream_url, queue))
    child.start()
    try:
        ids, slowest, empty_after, upstream_trips = queue.get(timeout=120)
    finally:
        child.join(30)
    assert len(ids) == len(set(ids)) == held  # every id in stock, once
    assert before.start not in ids
    assert upstream_trips == 0  # upstream never answered: all came from the stock
    assert slowest < 0.5  # no call waited on the dead upstream
    assert 0.9 <= empty_after < 5  # empty: an error after the tier's timeout


def test_callers_never_wait_on_a_hung_upstream(
    backend: str, make_database: Any, proxied_upstream: tuple[TcpProxy, str]
) -> None:
    proxy, upstream_url = proxied_upstream
    url = make_database(backend)
    upstream = TicketServer(upstream_url, timeout=2.0)
    tier = DatacenterTier(url, upstream, supply=0.001, min_block=400, timeout=1.0)
    try:
        tier.next_block("photos", 1)
        assert tier.wait_idle(10)
        proxy.hang()
        ids: list[int] = []
        slowest = 0.0
        with pytest.raises(TicketServerUnavailable):
            while True:
                started = time.monotonic()
                ids.extend(tier.next_block("photos", 10))
                slowest = max(slowest, time.monotonic() - started)
        waited = time.monotonic() - started
        assert len(ids) == len(set(ids)) == 399
        assert slowest < 0.5  # the refiller hung on upstream, callers did not
        assert tier.stats()["claims"] >= 2  # a refill was under way, hung on upstream
        assert 0.9 <= waited < 4
        proxy.forward()  # back: refills resume, callers get ids again
        more = tier.next_block("photos", 10)
        assert not set(more) & set(ids)
    finally:
        proxy.forward()
        tier.close()
        upstream.close()
