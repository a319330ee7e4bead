"""Correctness at scale: thousands of sequences over a datacenter tier in several processes, a
hung sequence among busy ones, first contact by many processes at once, the one-statement take,
tier tables of the previous release, and what a young cache holds and rides out.

What is checked is that ids stay unique, that the bounds hold (threads, blocking waits, ids
held), and that nothing waits on what it should not; not how fast it goes (see
``benchmarks/bench_scale.py``). Every wait for something to happen is a condition polled with
a deadline; ``time.sleep`` only paces a workload.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    TicketsError,
    TicketServer,
    TicketServerUnavailable,
)
from sqlalchemy_tickets.sources.datacenter import describe_datacenter
from support.processes import SPAWN, run_processes

#: The name prefixes of the library's threads: the refill schedulers of caches and tiers, and
#: the watchdog that bounds every round trip.
LIBRARY_THREADS = ("tickets-refill", "tickets-dc-refill", "sqlalchemy-tickets-watchdog")

#: What the library may run at most in a process with one cache over one tier, however many
#: sequences: the cache's ``max_workers`` (4) + the tier's ``workers`` (3) + the watchdog.
MAX_LIBRARY_THREADS = 4 + 3 + 1

#: The timeouts of the sources in the tests at scale. What these tests check is correctness, and
#: a batched unit of work over thousands of sequences (a first contact, a give-back of every lane
#: at close) is bounded as a whole by one ``timeout``: on a loaded machine it takes seconds (see
#: ``test_a_give_back_of_many_lanes_is_not_bounded_as_one_round_trip``).
AT_SCALE_TIMEOUT = 30.0


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail the test with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        threading.Event().wait(0.02)


class _Threads:
    """The threads started since it was made (the library's, and those a test names
    ``draw-...``, which do not count), sampled to find the most at once."""

    def __init__(self) -> None:
        self.before = {t.ident for t in threading.enumerate()}
        self.peak: list[str] = []
        self.peak_active = 0

    def sample(self) -> list[str]:
        now = threading.enumerate()
        new = sorted(
            t.name for t in now if t.ident not in self.before and not t.name.startswith("draw-")
        )
        if len(new) > len(self.peak):
            self.peak = new
        self.peak_active = max(self.peak_active, len(now))
        return new


def _quietly(call: Callable[..., object], *args: Any) -> None:
    """``call(*args)``, a ``TicketsError`` it raises expected (in a background thread)."""
    try:
        call(*args)
    except TicketsError:
        pass


def _duplicates(ids: list[int]) -> list[int]:
    seen: set[int] = set()
    return sorted({i for i in ids if i in seen or seen.add(i)})  # type: ignore[func-returns-value]


# -- 1. thousands of sequences over a tier, across processes -----------------------------------


def _tier_worker(
    dc_url: str, global_url: str, names: list[str], threads: int, passes: int, barrier: Any
) -> dict[str, Any]:
    """One process of a datacenter: a cache over a tier over the global server. Prepares every
    sequence (the processes together), then, once all are prepared, ``threads`` threads each
    draw ``passes`` rounds over all of them, and the cache is closed."""
    watched = _Threads()
    upstream = TicketServer(global_url, timeout=AT_SCALE_TIMEOUT)
    tier = DatacenterTier(dc_url, upstream=upstream, timeout=AT_SCALE_TIMEOUT)
    cache = CachedSource(tier, timeout=AT_SCALE_TIMEOUT)
    barrier.wait(120)
    started = time.monotonic()
    cache.prepare(names)
    prepared_in = time.monotonic() - started
    watched.sample()
    # Drawing starts once every process is prepared: the refills of first contact are over.
    barrier.wait(600)
    drawn: list[dict[str, list[int]]] = []
    errors: list[str] = []
    lock = threading.Lock()

    def draw(k: int) -> None:
        mine: dict[str, list[int]] = {name: [] for name in names}
        offset = k * len(names) // threads
        try:
            for _ in range(passes):
                for i in range(len(names)):
                    name = names[(offset + i) % len(names)]
                    mine[name].append(cache.next_id(name))
                watched.sample()
        except Exception as error:  # reported to the parent, which fails the test
            errors.append(repr(error))
        with lock:
            drawn.append(mine)

    pool = [threading.Thread(target=draw, args=(k,), name=f"draw-{k}") for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    watched.sample()
    cache_stats = {k: v for k, v in cache.stats().items() if k != "sequences"}
    tier_stats = {k: v for k, v in tier.stats().items() if k != "sequences"}
    burned = cache.close()
    tier.close()
    upstream.close()
    return {
        "ids": {name: [i for d in drawn for i in d[name]] for name in names},
        "errors": errors,
        "library_threads": watched.peak,
        "peak_active": watched.peak_active,
        "cache": cache_stats,
        "tier": tier_stats,
        "burned": burned,
        "prepared_in": prepared_in,
        "took": time.monotonic() - started,
    }


def _drop_database_now(url: str) -> None:
    """Drop a database of thousands of tables here, without the fixture's short read timeout
    (MariaDB takes longer than that to drop them under load); the fixture's drop is then a
    no-op."""
    target = sa.engine.make_url(url)
    engine = sa.create_engine(target.set(database=""), isolation_level="AUTOCOMMIT",
                              poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            quoted = engine.dialect.identifier_preparer.quote(target.database or "")
            force = " WITH (FORCE)" if engine.dialect.name == "postgresql" else ""
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.backend("postgresql", "mysql")
def test_thousands_of_sequences_over_a_tier_across_processes(
    backend: str, make_database: Callable[[str], str]
) -> None:
    sequences, processes, threads, passes = 2_000, 3, 3, 3
    names = [f"s{i:04d}" for i in range(sequences)]
    dc_url, global_url = make_database(backend), make_database(backend)
    try:
        setup = TicketServer(global_url, timeout=AT_SCALE_TIMEOUT)
        try:
            assert len(setup.create_tables(names)) == sequences
        finally:
            setup.close()
        barrier = SPAWN.Barrier(processes)
        results = run_processes(
            _tier_worker,
            [(dc_url, global_url, names, threads, passes, barrier)] * processes,
            timeout=900,
        )
    finally:
        _drop_database_now(global_url)
    for k, result in enumerate(results):
        print(
            f"process {k}: prepared in {result['prepared_in']:.1f} s, done in "
            f"{result['took']:.1f} s, {result['peak_active']} threads at most, the library's: "
            f"{result['library_threads']}\n  cache {result['cache']}\n  tier {result['tier']}"
        )
    for result in results:
        assert result["errors"] == []
        assert result["cache"]["issued"] == sequences * threads * passes
        # A fixed number of threads, whatever the number of sequences.
        assert len(result["library_threads"]) <= MAX_LIBRARY_THREADS, result["library_threads"]
        assert all(name.startswith(LIBRARY_THREADS) for name in result["library_threads"])
        assert result["burned"] == 0  # a clean close gives every id held back to the tier
    status = {s.sequence: s for s in describe_datacenter(dc_url)}
    assert set(status) == set(names)
    for name in names:
        ids = [i for result in results for i in result["ids"][name]]
        assert len(ids) == processes * threads * passes
        assert not _duplicates(ids), f"{name}: ids issued twice: {_duplicates(ids)[:10]}"
        s = status[name]
        assert s.refills >= 1, f"{name} was never refilled"
        # The tier issued what the caches drew, plus what they held and gave back at close.
        assert s.issued == len(ids) + s.given_back, (name, s)
        assert s.stock == s.refilled - s.issued + s.given_back, (name, s)


# -- 2. one sequence hung upstream, the others busy --------------------------------------------


@contextmanager
def _row_locked(url: str, table: str) -> Iterator[None]:
    """Hold the lock of every row of ``table`` (a ticket row) from a connection of the test's
    own, as a long transaction of another client would: a take of that table waits."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            transaction = conn.begin()
            conn.execute(sa.text(f"SELECT * FROM {table} FOR UPDATE")).all()
            try:
                yield
            finally:
                transaction.rollback()
    finally:
        engine.dispose()


class _Drawer:
    """Threads drawing ids of their sequences from ``source`` at ``rate`` ids per second per
    sequence (paced by the clock: it is the workload), each call timed, until stopped."""

    def __init__(
        self, source: CachedSource, groups: list[list[str]], rate: float, name: str
    ) -> None:
        self.source = source
        self.rate = rate
        self.ids: dict[str, list[int]] = {n: [] for group in groups for n in group}
        self.errors: list[tuple[float, str, str]] = []
        #: Per sequence, the calls that took longer than a round trip should: (start, seconds).
        self.slow: dict[str, list[tuple[float, float]]] = {n: [] for n in self.ids}
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._run, args=(group,), name=f"draw-{name}-{k}")
            for k, group in enumerate(groups)
        ]

    def start(self) -> _Drawer:
        for t in self.threads:
            t.start()
        return self

    def _run(self, names: list[str]) -> None:
        began = time.monotonic()
        rounds = 0
        while not self.stop.is_set():
            due = int((time.monotonic() - began) * self.rate)
            while rounds < due and not self.stop.is_set():
                rounds += 1
                for name in names:
                    started = time.monotonic()
                    try:
                        self.ids[name].append(self.source.next_id(name))
                    except Exception as error:  # counted; the test decides what is allowed
                        self.errors.append((started, name, repr(error)))
                    took = time.monotonic() - started
                    if took > 0.05:
                        self.slow[name].append((started, took))
            time.sleep(1 / self.rate)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)
            assert not t.is_alive(), f"{t.name} did not stop"


def _tier_figure(tier: DatacenterTier, name: str, key: str) -> int:
    figures: dict[str, Any] = tier.stats()["sequences"].get(f"{name}/64", {})
    return int(figures.get(key, 0))


@pytest.mark.slow
@pytest.mark.backend("postgresql", "mysql")
def test_a_sequence_hung_upstream_does_not_hold_back_the_others(
    backend: str, make_database: Callable[[str], str]
) -> None:
    busy = [f"busy{i:02d}" for i in range(24)]
    stalled = "stalled"
    hang = 2.0  # each refill of the stalled sequence waits this long on its ticket row
    global_url, dc_url = make_database(backend), make_database(backend)
    watched = _Threads()
    upstream = TicketServer(global_url, timeout=hang)
    # Small stocks and caches: each busy sequence's stock is refilled about once a second.
    tier = DatacenterTier(
        dc_url, upstream, supply=0.001, min_block=40, timeout=1.0, max_backoff=0.5
    )
    cache = CachedSource(tier, min_block=8, max_block=16, supply=0.5)
    drawers: list[_Drawer] = []
    try:
        cache.prepare([*busy, stalled])
        with _row_locked(global_url, f"tickets__{stalled}"):
            # The stalled sequence is drawn until its refills (the tier's, from upstream, and
            # the cache's, from the tier) have failed once: a sequence failing for the first
            # time may share a batch with others, which then wait once (by design); from then
            # on it goes alone, and that is what the busy sequences must not notice.
            drawers.append(_Drawer(cache, [[stalled]], 50, "stalled").start())
            _wait_for(
                lambda: _tier_figure(tier, stalled, "failures") >= 1
                and cache.stats()["sequences"][f"{stalled}/64"]["failures"] >= 1,
                30, "the stalled sequence's refills to fail",
            )
            failed_before = _tier_figure(tier, stalled, "failures")
            before = {name: _tier_figure(tier, name, "refills") for name in busy}
            drawing = _Drawer(cache, [busy[k::3] for k in range(3)], 30, "busy").start()
            drawers.append(drawing)
            window = time.monotonic()
            # Held for several seconds: until the stalled sequence's refill hung twice more,
            # and every busy sequence was refilled twice meanwhile.
            _wait_for(
                lambda: time.monotonic() - window >= 4
                and _tier_figure(tier, stalled, "failures") >= failed_before + 2
                and all(_tier_figure(tier, name, "refills") >= before[name] + 2 for name in busy),
                60, "two hung refills of the stalled sequence, and two refills of each busy one",
            )
            during = {name: _tier_figure(tier, name, "refills") - before[name] for name in busy}
            failed_during = _tier_figure(tier, stalled, "failures") - failed_before
            threads_during = watched.sample()
            refills_of_stalled = _tier_figure(tier, stalled, "refills")
            released = time.monotonic()
        # Released: the stalled sequence is refilled again, and its callers get ids.
        _wait_for(lambda: _tier_figure(tier, stalled, "refills") > refills_of_stalled, 30,
                  "the stalled sequence to be refilled after the lock went")
        got = len(drawers[0].ids[stalled])
        _wait_for(lambda: len(drawers[0].ids[stalled]) > got, 30,
                  "ids of the stalled sequence after the lock went")
    finally:
        for drawer in drawers:
            drawer.finish()
        burned = cache.close()
        tier.close()
        upstream.close()
    slowest = max((took for name in busy for _, took in drawing.slow[name]), default=0.0)
    print(f"refills of each busy sequence during the {released - window:.1f} s hang: {during}; "
          f"failed refills of the stalled one: {failed_during}; slowest busy call: "
          f"{slowest:.3f} s; threads: {threads_during}")
    assert drawing.errors == []
    assert slowest < hang / 2, f"a busy sequence's caller waited {slowest:.2f} s"
    assert all(n >= 2 for n in during.values()), during
    assert failed_during >= 2  # the stalled sequence kept trying, and kept hanging
    assert len(threads_during) <= MAX_LIBRARY_THREADS, threads_during
    assert len(watched.peak) <= MAX_LIBRARY_THREADS, watched.peak
    for drawer in drawers:
        for name, ids in drawer.ids.items():
            assert not _duplicates(ids), f"{name}: ids issued twice"
    assert burned == 0


# -- refill claims are released in key order ----------------------------------------------------


class _FailsAfterGate:
    """An upstream whose calls wait for ``gate``, then fail as a server that went away does
    (the refiller has claimed its sequences, and releases the claims after the failure)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        self.entered.set()
        assert self.gate.wait(60)
        raise TicketServerUnavailable("the global tier went away (a test's upstream)")


def _waiting_on_a_lock(url: str, statement: str) -> bool:
    """Whether a session of the database at ``url`` waits for a row lock in ``statement``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND query LIKE :pattern")
            else:
                query = ("SELECT count(*) FROM information_schema.innodb_trx WHERE "
                         "trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern")
            return bool(conn.execute(sa.text(query), {"pattern": f"{statement}%"}).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.backend("postgresql", "mysql")
@pytest.mark.xfail(
    strict=True,
    reason="DatacenterTier releases its refill claims (_tier_refill.TierRefills._release) in "
    "the order of the refill's lanes (the most urgent first), not in key order: a writer "
    "locking state rows in key order (a give-back at close, a claim, a store, in another "
    "process) deadlocks with it",
)
def test_releasing_refill_claims_never_deadlocks_with_writers_in_key_order(
    backend: str, make_database: Callable[[str], str]
) -> None:
    """What burned closes at scale on MariaDB: a close's give-back of every lane (locking their
    state rows in key order, as every writer of several sequences does) chosen as the victim of
    a deadlock with another process's release of its refill claims; every id it held burned."""
    url = make_database(backend)
    upstream = _FailsAfterGate()
    tier = DatacenterTier(url, upstream, supply=0.001, min_block=10, claim_timeout=60.0,
                          backoff=60.0, max_backoff=60.0)
    # Woken in descending key order: a refill takes them in that order, most urgent first.
    names = [f"l{i:02d}" for i in reversed(range(30))]
    preparing = threading.Thread(target=_quietly, args=(tier.prepare, names),
                                 name="draw-prepare")
    preparing.start()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    lock = sa.text("SELECT sequence_name FROM tickets_dc__state WHERE sequence_name = :name "
                   "FOR UPDATE")
    group: list[str] = []

    def claimed_together() -> bool:
        # The claims of one refill are written in one transaction: one claim_until.
        groups: dict[tuple[str, float], list[str]] = {}
        for s in describe_datacenter(url):
            if s.claim_owner is not None and s.sequence is not None:
                groups.setdefault((s.claim_owner, s.claim_expires_in or 0.0), []).append(
                    s.sequence)
        group[:] = max(groups.values(), key=len, default=[])
        return len(group) >= 2

    try:
        assert upstream.entered.wait(60)  # claimed, and asking upstream (which waits)
        _wait_for(claimed_together, 30, "a refill claiming several sequences at once")
        first, second = sorted(group)[:2]
        with engine.connect() as conn, conn.begin():
            conn.execute(lock, {"name": first}).all()
            upstream.gate.set()  # upstream fails: the claims are released
            _wait_for(lambda: _waiting_on_a_lock(url, "UPDATE tickets_dc__state SET claim"),
                      30, "the release of the claims to wait for the row this test holds")
            # The next row in key order, as every writer of several sequences takes them.
            conn.execute(lock, {"name": second}).all()
        _wait_for(
            lambda: not any(s.sequence in group and s.claim_owner for s in
                            describe_datacenter(url)),
            20, "the claims to be released",
        )
    finally:
        upstream.gate.set()
        engine.dispose()
        tier.close()
        preparing.join(30)
