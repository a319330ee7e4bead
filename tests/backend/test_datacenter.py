"""DatacenterTier: a stock of ids in a datacenter database, shared by processes, refilled from
upstream in the background; given-back ids first; the stock outlives processes and upstream."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from queue import Empty
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
from support.processes import WORKERS
from support.proxy import TcpProxy

#: Options that keep the stock at exactly ``min_block`` ids: no rate can grow the target.
STEADY: dict[str, Any] = {"supply": 0.001, "min_block": 100, "timeout": 2.0}




def _results_of(target: Callable[..., None], arguments: list[tuple[Any, ...]]) -> list[Any]:
    """Runs ``target(*args, queue)`` in a spawned process per ``args``; what each put on the
    queue, in the order they finished. A child that dies without putting anything fails the
    test at once, with its exit code, instead of leaving the parent waiting on the queue."""
    queue = WORKERS.Queue()
    children = [WORKERS.Process(target=target, args=(*args, queue)) for args in arguments]
    for child in children:
        child.start()
    results: list[Any] = []
    deadline = time.monotonic() + 240
    try:
        while len(results) < len(children):
            try:
                results.append(queue.get(timeout=0.5))
                continue
            except Empty:
                pass
            failed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
            assert not failed, f"a child process failed (exit codes {failed}): see its stderr"
            assert time.monotonic() < deadline, "the child processes did not finish in time"
        return results
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()


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
    ctx = WORKERS
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


# -- refills across processes ------------------------------------------------------------------


class _Recorded:
    """An upstream that records when each of its calls ran (the system-wide monotonic clock,
    comparable across processes), and answers ``delay`` seconds late, as a distant global tier
    does; or, with ``stall``, signals ``entered`` and never answers (until the process is
    killed: a process-local event, since killing a process that waits on a multiprocessing
    Event leaves that Event's ``set()`` waiting for it forever)."""

    def __init__(
        self, source: TicketServer, delay: float = 0.0, entered: Any = None, stall: bool = False
    ) -> None:
        self.source = source
        self.delay = delay
        self.entered = entered
        self.stall = stall
        self.calls: list[tuple[float, float]] = []

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        started = time.monotonic()
        if self.entered is not None:
            self.entered.set()
        if self.stall:
            threading.Event().wait(600)  # a refiller stuck on upstream until it is killed
        block = self.source.next_block(sequence, count, bits=bits)
        threading.Event().wait(self.delay)  # the distant tier's latency
        self.calls.append((started, time.monotonic()))
        return block


def _refill_racer(url: str, upstream_url: str, barrier: Any, queue: Any) -> None:
    recorded = _Recorded(TicketServer(upstream_url), delay=0.03)
    # What is tested is one refill at a time, not how long a caller waits: on SQLite under a
    # loaded machine, the process whose refill just landed drains the stock before the others
    # get the file's write lock (SQLite's busy handler is not fair), for longer than 10 s.
    tier = DatacenterTier(url, recorded, supply=0.001, min_block=50, timeout=60.0)
    barrier.wait(60)
    ids = _drain(tier, "photos", 600, per=10)
    tier.close()
    queue.put((ids, recorded.calls))


def test_one_refill_at_a_time_across_processes(backend: str, make_database: Any) -> None:
    url, upstream_url = make_database(backend), make_database(backend)
    create_datacenter_tables(url)
    n = 4
    barrier = WORKERS.Barrier(n)
    results = _results_of(_refill_racer, [(url, upstream_url, barrier)] * n)
    ids = [i for got, _ in results for i in got]
    assert len(ids) == len(set(ids)) == n * 600
    calls = sorted((start, end, k) for k, (_, mine) in enumerate(results) for start, end in mine)
    assert len({k for *_, k in calls}) >= 2  # the refills did move between processes
    for (_, end, k), (start, _, other) in zip(calls, calls[1:], strict=False):
        assert start >= end, f"process {other} asked upstream while process {k} was refilling"


def _stalled_refiller(url: str, upstream_url: str, entered: Any) -> None:
    recorded = _Recorded(TicketServer(upstream_url), entered=entered, stall=True)
    tier = DatacenterTier(url, recorded, supply=0.001, min_block=50, claim_timeout=3.0)
    try:
        tier.next_block("photos", 1)
    except TicketServerUnavailable:
        pass  # the stock stayed empty: its refill hangs
    threading.Event().wait(600)


def test_a_refiller_killed_mid_refill_blocks_refills_only_until_its_claim_runs_out(
    backend: str, make_database: Any
) -> None:
    url, upstream_url = make_database(backend), make_database(backend)
    ctx = WORKERS
    entered = ctx.Event()
    child = ctx.Process(target=_stalled_refiller, args=(url, upstream_url, entered))
    child.start()
    try:
        assert entered.wait(120)  # it claimed the refill and is inside upstream
        claim = _status(url)
        assert claim.claim_owner is not None and claim.claim_owner.split(":")[1] == str(child.pid)
        child.kill()  # SIGKILL mid-refill: the claim stays in the row
        child.join(30)
        killed_at = time.monotonic()
    finally:
        if child.is_alive():
            child.kill()
            child.join(30)
    upstream = TicketServer(upstream_url)
    try:
        with DatacenterTier(url, upstream, supply=0.001, min_block=50, timeout=20.0) as tier:
            block = tier.next_block("photos", 5)
            waited = time.monotonic() - killed_at
            assert tier.stats()["claims"] >= 1  # its own claim, once the dead one ran out
    finally:
        upstream.close()
    remaining = claim.claim_expires_in or 0.0
    assert waited >= remaining - 0.5  # the live-looking claim was honoured...
    assert waited < remaining + 5  # ...and no longer than its timeout
    assert len(block) == 5


# -- several datacenters, processes, threads; kills ----------------------------------------------


def _datacenter_worker(
    dc_url: str, globals_: list[str], threads: int, per: int, queue: Any
) -> None:
    from sqlalchemy_tickets import TicketServers

    upstream = TicketServers(globals_)
    tier = DatacenterTier(dc_url, upstream, min_block=200)
    cache = CachedSource(tier, min_block=8)
    out: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [cache.next_id("orders") for _ in range(per)]
        mine.extend(tier.next_block("orders", 25))  # straight from the tier too
        with lock:
            out.extend(mine)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    cache.close()
    tier.close()
    queue.put(out)


@pytest.mark.slow
def test_two_datacenters_processes_and_threads_over_one_global_pair(make_database: Any) -> None:
    datacenters = [make_database("postgresql"), make_database("mysql")]
    globals_ = [make_database("mysql"), make_database("postgresql")]
    results = _results_of(
        _datacenter_worker, [(dc, globals_, 3, 400) for dc in datacenters for _ in range(3)]
    )
    ids = [i for got in results for i in got]
    assert len(ids) == len(set(ids)) >= 6 * 3 * 401
    assert {i % 2 for i in ids} == {0, 1}  # both global servers served
    for dc in datacenters:
        status = _status(dc, "orders")
        assert status.refills >= 1 and status.issued > 0


def _taker_until_killed(url: str, upstream_url: str, path: str) -> None:
    """Takes blocks as fast as it can, writing each one down once it has it; gives half of
    every other block back, writing that down first (from then on those ids are not its)."""
    tier = DatacenterTier(
        url, TicketServer(upstream_url), supply=0.001, min_block=40, claim_timeout=1.0
    )
    with open(path, "a") as out:
        turn = 0
        while True:
            try:
                block = tier.next_block("photos", 4)
            except TicketServerUnavailable:
                continue  # SQLite: three processes at full speed on one file; ask again
            out.write(f"T {block.start} {block.stop} {block.step}\n")
            out.flush()
            turn += 1
            if turn % 2 and len(block) > 1:
                back = block[len(block) // 2 :]
                out.write(f"G {back.start} {back.stop} {back.step}\n")
                out.flush()
                while True:
                    try:
                        tier.give_back("photos", back)
                        break
                    except TicketServerUnavailable:
                        continue


def _written(path: Any) -> list[int]:
    """The ids a taker used: taken and not given back (a line cut short by the kill was
    never written whole: a block taken but not written down is burned, never used)."""
    used: list[int] = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "T":
            used.extend(range(*map(int, parts[1:])))
        elif len(parts) == 4 and parts[0] == "G":
            back = set(range(*map(int, parts[1:])))
            used = [i for i in used if i not in back]
    return used


@pytest.mark.slow
def test_processes_killed_mid_take_mid_give_back_and_mid_refill_never_cause_a_duplicate(
    backend: str, make_database: Any, tmp_path: Any
) -> None:
    url, upstream_url = make_database(backend), make_database(backend)
    create_datacenter_tables(url)
    ctx = WORKERS
    files = []
    for round_ in range(3):
        children = []
        for k in range(3):
            path = tmp_path / f"taken-{round_}-{k}.txt"
            path.touch()
            files.append(path)
            child = ctx.Process(target=_taker_until_killed, args=(url, upstream_url, str(path)))
            child.start()
            children.append((child, path))
        try:
            deadline = time.monotonic() + 120
            # Each has taken a few hundred ids (several refills), and is still at it.
            while not all(len(_written(p)) >= 300 + 30 * k for k, (_, p) in enumerate(children)):
                assert time.monotonic() < deadline, "the takers made no progress"
                threading.Event().wait(0.02)
        finally:
            for child, _ in children:
                child.kill()
            for child, _ in children:
                child.join(30)
    taken = [i for path in files for i in _written(path)]
    assert len(taken) == len(set(taken))
    upstream = TicketServer(upstream_url)
    try:
        with DatacenterTier(url, upstream, supply=0.001, min_block=40, timeout=10.0) as tier:
            held = _status(url).stock
            after = _drain(tier, "photos", held + 200, per=9)
    finally:
        upstream.close()
    assert len(after) == len(set(after))
    assert not set(after) & set(taken)


def test_the_stock_survives_a_crash_of_the_datacenter_database(
    private_mariadb_factory: Any, proxied_upstream: tuple[TcpProxy, str]
) -> None:
    proxy, upstream_url = proxied_upstream
    server = private_mariadb_factory()
    engine = sa.create_engine(server.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE DATABASE dc")
    engine.dispose()
    url = server.url.rstrip("/") + "/dc"
    upstream = TicketServer(upstream_url, timeout=1.0)
    try:
        tier = DatacenterTier(url, upstream, supply=0.001, min_block=300, timeout=2.0)
        first = tier.next_block("photos", 10)
        assert tier.wait_idle(10)
        held = _status(url).stock
        server.kill()  # SIGKILL: InnoDB recovers from its log
        with pytest.raises(TicketServerUnavailable):
            tier.next_block("photos", 1)
        server.restart()
        proxy.refuse()  # and the global tier is down too
        after: list[int] = []
        failures = 0
        with pytest.raises(TicketServerUnavailable):
            while True:
                try:
                    after.extend(tier.next_block("photos", 10))
                except TicketServerUnavailable:
                    if after or failures:  # empty (or down twice): done
                        raise
                    failures += 1  # a pooled connection from before the crash
        tier.close()
    finally:
        proxy.forward()
        upstream.close()
    assert len(after) == len(set(after)) == held  # every id in stock, once, after the crash
    assert not set(after) & set(first)


class _Gated:
    """An upstream whose calls wait for ``gate`` (a refiller stalled on a slow global tier)."""

    def __init__(self, source: TicketServer) -> None:
        self.source = source
        self.entered = threading.Event()
        self.gate = threading.Event()

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        self.entered.set()
        assert self.gate.wait(60)
        return self.source.next_block(sequence, count, bits=bits)


def test_a_stalled_refiller_loses_its_claim_and_its_late_block_is_kept(
    database_url: str, upstream: TicketServer
) -> None:
    gated = _Gated(upstream)
    stalled = DatacenterTier(database_url, gated, supply=0.001, min_block=50, claim_timeout=1.0)
    other = DatacenterTier(database_url, upstream, supply=0.001, min_block=50, timeout=10.0)
    try:
        with pytest.raises(TicketServerUnavailable):
            stalled.next_block("photos", 1)  # its refill is stuck upstream, holding the claim
        assert gated.entered.is_set()
        started = time.monotonic()
        taken = _drain(other, "photos", 60, per=10)  # waits for the claim to run out, no more
        assert time.monotonic() - started < 8
        gated.gate.set()  # the stalled refill answers at last: stored, then it stops
        deadline = time.monotonic() + 30
        while stalled.stats()["claims_lost"] < 1:
            assert time.monotonic() < deadline, "the stalled refill never came back"
            threading.Event().wait(0.02)
        assert stalled.stats()["refilled"] == 50
        assert other.wait_idle(10)
        held = _status(database_url).stock
        rest = _drain(other, "photos", held, per=10)
        every = taken + rest
        assert len(every) == len(set(every)) == 60 + held
        # Draining the stock started another refill: the counts compared must both be after it.
        assert other.wait_idle(10) and stalled.wait_idle(10)
        assert _status(database_url).refilled == stalled.stats()["refilled"] + other.stats()[
            "refilled"
        ]
    finally:
        gated.gate.set()
        stalled.close()
        other.close()


@pytest.mark.backend("postgresql", "mysql")
def test_a_young_tier_stocks_its_supply_and_rides_out_an_outage(
    backend: str, make_database: Any, proxied_upstream: tuple[TcpProxy, str]
) -> None:
    """A tier warmed for a few seconds holds about ``supply`` seconds of ids at the rate it
    sees (not the 1,000 ids of its first refill), so callers drawing at that rate keep getting
    ids from the stock through an outage of the global tier shorter than half of it."""
    proxy, upstream_url = proxied_upstream
    supply, per_call, pause = 8.0, 50, 0.05
    upstream = TicketServer(upstream_url, timeout=1.0)
    tier = DatacenterTier(make_database(backend), upstream, supply=supply, timeout=1.0,
                          max_backoff=0.5)
    try:
        started = time.monotonic()
        drawn: list[int] = []

        def draw_for(seconds: float, every: float = pause) -> None:
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                drawn.extend(tier.next_block("photos", per_call))
                threading.Event().wait(every)

        draw_for(3.0)
        rate = len(drawn) / (time.monotonic() - started)
        # The stock reaches supply seconds at the rate the tier measured (its own estimate,
        # sampled once a second from every process's takes), within a refill or two.
        deadline = time.monotonic() + 20
        while True:
            status = tier.describe()[0]
            if status.rate > 0 and status.stock >= 0.8 * supply * status.rate:
                break
            assert time.monotonic() < deadline, (
                f"stock {status.stock} stayed under {supply:g} s at {status.rate:.0f} ids/s")
            draw_for(0.2)
        assert status.rate >= 0.5 * rate, (status.rate, rate)
        proxy.refuse()  # the global tier goes away
        before = len(drawn)
        try:
            # At the rate the tier saw (it cannot know another): no call fails, the stock
            # carries the datacenter.
            draw_for(supply / 2, every=per_call / status.rate)
        except TicketServerUnavailable:
            raise AssertionError(f"stock {status.stock} at {status.rate:.0f} ids/s ran out "
                                 f"after {len(drawn) - before} ids") from None
        assert len(drawn) == len(set(drawn))
    finally:
        proxy.forward()
        tier.close()
        upstream.close()
