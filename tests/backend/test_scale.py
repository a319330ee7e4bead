"""Correctness at scale: thousands of sequences over a datacenter tier in several processes, a
hung sequence among busy ones, first contact by many processes at once, the one-statement take,
tier tables of the previous release, and what a young cache holds and rides out.

What is checked is that ids stay unique, that the bounds hold (threads, blocking waits, ids
held), and that nothing waits on what it should not; not how fast it goes (see
``benchmarks/bench_scale.py``). Every wait for something to happen is a condition polled with
a deadline; ``time.sleep`` only paces a workload.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
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
from sqlalchemy_tickets.sources.datacenter import (
    datacenter_table_statements,
    datacenter_tables,
    describe_datacenter,
)
from support.processes import WORKERS, run_processes
from support.proxy import TcpProxy

#: The name prefixes of the library's threads: the refill schedulers of caches and tiers, and
#: the watchdog that bounds every round trip.
LIBRARY_THREADS = ("tickets-refill", "tickets-dc-refill", "sqlalchemy-tickets-watchdog")

#: What the library may run at most in a process with one cache over one tier, however many
#: sequences: the cache's ``max_workers`` (4) + the tier's ``workers`` (3) + the watchdog.
MAX_LIBRARY_THREADS = 4 + 3 + 1

#: The timeout of the sources where thousands of sequences (or several processes creating
#: tables) are handled at once. These tests check correctness, and such a unit of work (a first
#: contact with 1,000 tables, a give-back of every lane at close, a batch of table creations
#: another creator waits for) is bounded as a whole by one ``timeout``: on a loaded 2-core
#: machine they took 1-3 s, over the 2 s default.
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
        self.before = set(threading.enumerate())
        self.peak: list[str] = []
        self.peak_active = 0

    def sample(self) -> list[str]:
        now = threading.enumerate()
        new = sorted(
            t.name for t in now if t not in self.before and not t.name.startswith("draw-")
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
    return sorted(i for i, n in Counter(ids).items() if n > 1)


# -- 1. thousands of sequences over a tier, across processes -----------------------------------


def _tier_worker(
    dc_url: str, global_url: str, names: list[str], threads: int, passes: int, barrier: Any
) -> dict[str, Any]:
    """One process of a datacenter: a cache over a tier over the global server. Prepares every
    sequence (the processes together), then, once all are prepared, ``threads`` threads each
    draw ``passes`` rounds over all of them, and the cache is closed."""
    watched = _Threads()
    upstream = TicketServer(global_url, timeout=AT_SCALE_TIMEOUT)
    # Stocks of min_block ids (a short supply): prepare fills them, and what the caches take
    # afterwards leaves them above their low-water marks, so no refill claim is taken or
    # released while the caches close. (With the default supply the shared rate of the draws
    # asks for refills of every sequence meanwhile, and on MariaDB a release of claims
    # deadlocks with a closing cache's give-back: see
    # test_releasing_refill_claims_never_deadlocks_with_writers_in_key_order.)
    tier = DatacenterTier(dc_url, upstream=upstream, supply=0.001, timeout=AT_SCALE_TIMEOUT)
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
        barrier = WORKERS.Barrier(processes)
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
    for name in names:
        ids = [i for result in results for i in result["ids"][name]]
        assert not _duplicates(ids), f"{name}: ids issued twice: {_duplicates(ids)[:10]}"
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
    """Whether a session of the database at ``url`` waits for a row lock in a statement that
    matches the ``LIKE`` pattern ``statement``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                         "AND query LIKE :pattern")
            else:
                query = ("SELECT count(*) FROM information_schema.innodb_trx WHERE "
                         "trx_state = 'LOCK WAIT' AND trx_query LIKE :pattern")
            return bool(conn.execute(sa.text(query), {"pattern": statement}).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.backend("postgresql", "mysql")
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
        largest = sorted(groups.values(), key=len)[-1:]
        group[:] = largest[0] if largest else []
        return len(group) >= 2

    try:
        assert upstream.entered.wait(60)  # claimed, and asking upstream (which waits)
        _wait_for(claimed_together, 30, "a refill claiming several sequences at once")
        first, second = sorted(group)[:2]
        with engine.connect() as conn, conn.begin():
            conn.execute(lock, {"name": first}).all()
            upstream.gate.set()  # upstream fails: the claims are released
            # The release's statements, and no other writer's, select the rows by owner.
            _wait_for(lambda: _waiting_on_a_lock(url, "%tickets_dc__state.claim_owner = %"),
                      30, "the release of the claims to wait for the row this test holds")
            # The next row in key order, as every writer of several sequences takes them.
            conn.execute(lock, {"name": second}).all()
        _wait_for(
            lambda: not any(s.sequence in group and s.claim_owner for s in
                            describe_datacenter(url)),
            5, "the claims to be released",
        )
    finally:
        upstream.gate.set()
        engine.dispose()
        tier.close()
        preparing.join(30)


@pytest.mark.backend("postgresql", "mysql")
def test_a_writer_holding_a_state_row_past_the_timeout_does_not_keep_the_claims(
    backend: str, make_database: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    """A release of refill claims that waits on a writer's row lock longer than the tier's
    timeout is cut; it is made again, so the claims are gone soon after the writer commits,
    not after ``claim_timeout`` (every process's refills of those sequences wait until then)."""
    caplog.set_level(logging.DEBUG, logger="sqlalchemy_tickets")
    url = make_database(backend)
    upstream = _FailsAfterGate()
    tier = DatacenterTier(url, upstream, supply=0.001, min_block=10, timeout=1.0,
                          claim_timeout=60.0, backoff=60.0, max_backoff=60.0)
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    lock = sa.text("SELECT sequence_name FROM tickets_dc__state WHERE sequence_name = :name "
                   "FOR UPDATE")
    preparing = threading.Thread(target=_quietly, args=(tier.prepare, ["held"]),
                                 name="draw-prepare")
    preparing.start()

    def claimed() -> bool:
        return any(s.sequence == "held" and s.claim_owner for s in describe_datacenter(url))

    def release_cut() -> bool:
        return any("releasing" in r.getMessage() and "claims" in r.getMessage()
                   and "failed" in r.getMessage() for r in caplog.records)

    try:
        assert upstream.entered.wait(60)
        _wait_for(claimed, 30, "the refill claim")
        with engine.connect() as conn, conn.begin():
            conn.execute(lock, {"name": "held"}).all()
            upstream.gate.set()  # upstream fails: the claim is released, behind this lock
            _wait_for(release_cut, 30, "the release to outlive the timeout and be cut")
        _wait_for(lambda: not claimed(), 10, "the claim to be released")
    finally:
        upstream.gate.set()
        engine.dispose()
        tier.close()
        preparing.join(30)


# -- 3. first contact with new sequences by many processes at once ------------------------------


def _first_contact_worker(
    mode: str, url: str, dc_url: str | None, names: list[str], barrier: Any
) -> dict[str, Any]:
    """One of several processes meeting ``names`` (no tables yet) at the same moment, on the
    batched path: a ticket server's ``prepare`` and ``next_blocks``, a cache's ``prepare`` over
    one, or a cache's over a datacenter tier (its tables and state rows made on first use)."""
    # Creators wait for each other's batches of tables, each up to the timeout: on a loaded
    # machine, six of them at once take longer than the default 2 s (see the report of
    # test_many_processes_meet_new_sequences_at_once); what is checked here is the outcome.
    server = TicketServer(url, timeout=AT_SCALE_TIMEOUT)
    tier = (
        DatacenterTier(dc_url, server, timeout=AT_SCALE_TIMEOUT) if dc_url is not None else None
    )
    ids: dict[str, list[int]] = {name: [] for name in names}
    errors: list[str] = []
    burned = 0
    barrier.wait(120)
    try:
        if mode == "server":
            server.prepare(names)
            for _ in range(2):
                for name, got in zip(names, server.next_blocks([(n, 3, 64) for n in names]),
                                     strict=True):
                    if isinstance(got, range):
                        ids[name].extend(got)
                    else:
                        errors.append(f"{name}: {got!r}")
        else:
            cache = CachedSource(tier if tier is not None else server, timeout=AT_SCALE_TIMEOUT)
            cache.prepare(names)
            for _ in range(3):
                for name in names:
                    ids[name].append(cache.next_id(name))
            burned = cache.close()
    except TicketsError as error:
        errors.append(repr(error))
    finally:
        if tier is not None:
            tier.close()
        server.close()
    return {"ids": ids, "errors": errors, "burned": burned}


def _first_ids_once(results: list[dict[str, Any]], names: list[str]) -> dict[str, list[int]]:
    """Every process's ids per sequence, checked: no error, no id twice, the first id 1."""
    for result in results:
        assert result["errors"] == []
    every: dict[str, list[int]] = {}
    for name in names:
        ids = every[name] = [i for result in results for i in result["ids"][name]]
        assert not _duplicates(ids), f"{name}: ids issued twice: {_duplicates(ids)[:10]}"
        # One table, created and seeded once: its first id went to one of the processes.
        assert min(ids) == 1, f"{name} starts at {min(ids)}"
    return every


def test_many_processes_meet_new_sequences_at_once(
    backend: str, make_database: Callable[[str], str]
) -> None:
    names = [f"fresh{i:03d}" for i in range(100)]
    url = make_database(backend)
    modes = ["server", "cache"] * 3
    barrier = WORKERS.Barrier(len(modes))
    results = run_processes(
        _first_contact_worker, [(mode, url, None, names, barrier) for mode in modes]
    )
    every = _first_ids_once(results, names)
    for name in names:
        # The servers' blocks alone: 3 processes x 2 blocks of 3, one after another.
        assert len(every[name]) == 3 * 2 * 3 + 3 * 3


@pytest.mark.slow
def test_many_processes_meet_new_sequences_at_once_through_a_tier(
    backend: str, make_database: Callable[[str], str]
) -> None:
    names = [f"fresh{i:03d}" for i in range(100)]
    url, dc_url = make_database(backend), make_database(backend)
    processes = 6
    barrier = WORKERS.Barrier(processes)
    results = run_processes(
        _first_contact_worker, [("cache", url, dc_url, names, barrier)] * processes
    )
    every = _first_ids_once(results, names)
    assert [result["burned"] for result in results] == [0] * processes
    described = describe_datacenter(dc_url)
    status = {s.sequence or "": s for s in described}
    # One state row each, seeded once whoever came first.
    assert sorted(s.sequence or "" for s in described) == names
    for name in names:
        assert status[name].refills >= 1
        assert status[name].issued == len(every[name]) + status[name].given_back


# -- 4. a take is one statement -----------------------------------------------------------------


def test_a_take_from_the_stock_is_one_statement(
    backend: str, make_database: Callable[[str], str]
) -> None:
    """What makes a tier scale with processes: a take holds its row's lock for one statement,
    not for a transaction of several round trips."""
    upstream = TicketServer(make_database(backend))
    # No identity check between takes (its interval), and a stock that no take of 10 brings
    # under its low-water mark: what is counted is the take alone.
    tier = DatacenterTier(make_database(backend), upstream, supply=0.001, min_block=1000,
                          identity_interval=3600.0)
    sent: list[str] = []
    me = threading.get_ident()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() == me:  # not the refill threads'
            sent.append(" ".join(statement.split()))

    try:
        tier.next_block("photos", 10)  # tables, state row, first refill, identity
        assert tier.wait_idle(30)
        tier.next_block("photos", 10)
        assert tier.wait_idle(30)
        sa.event.listen(tier.own.engine, "before_cursor_execute", record)
        counted = []
        for _ in range(5):
            sent.clear()
            block = tier.next_block("photos", 10)
            counted.append(list(sent))
            assert len(block) == 10
            assert tier.wait_idle(30)
        sa.event.remove(tier.own.engine, "before_cursor_execute", record)
    finally:
        tier.close()
        upstream.close()
    # PostgreSQL and SQLite: UPDATE ... RETURNING. MariaDB has no RETURNING on UPDATE: the
    # UPDATE keeps the block in session variables, and a SELECT reads them.
    expected = ["UPDATE", "SELECT"] if backend == "mysql" else ["UPDATE"]
    for statements in counted:
        assert [s.split()[0].upper() for s in statements] == expected, statements


# -- 5. tier tables of the previous release ------------------------------------------------------

#: The columns of the state table that 0.3 did not have (the head of the stock, and the count
#: of the latest take): added on first use by a newer tier.
NEW_STATE_COLUMNS = ("head_kind", "head_first", "head_last", "head_step", "last_take")


def _tier_tables_of_0_3(url: str, backend: str) -> None:
    """The tier's tables as 0.3 made them: today's stock and stamp tables, and the state table
    without the columns added since."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        metadata = sa.MetaData()
        stock, state = datacenter_tables(metadata, dialect=backend)
        old = sa.MetaData()
        stock.to_metadata(old)
        sa.Table(
            state.name, old,
            *(
                sa.Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable,
                          autoincrement=False, server_default=c.server_default)
                for c in state.columns if c.name not in NEW_STATE_COLUMNS
            ),
            comment=state.comment,
            **state.dialect_kwargs,
        )
        with engine.begin() as conn:
            old.create_all(conn)
            for statement in datacenter_table_statements(dialect=backend):
                element = getattr(statement, "element", None)
                if element is not None and element.name not in (stock.name, state.name):
                    conn.execute(statement)  # the stamp table
    finally:
        engine.dispose()


def test_tier_tables_of_the_previous_release_are_upgraded_in_place(
    backend: str, make_database: Callable[[str], str]
) -> None:
    url, upstream_url = make_database(backend), make_database(backend)
    _tier_tables_of_0_3(url, backend)
    # As 0.3 left them: 1..1000 brought from upstream, 400 issued, 50 of them (101..150) given
    # back; in stock, those 50 and 401..1000.
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(
                "INSERT INTO tickets_dc__stock (sequence_name, bits, kind, first_id, last_id, "
                "step) VALUES ('photos', 64, 0, 101, 150, 1), ('photos', 64, 1, 401, 1000, 1)"))
            conn.execute(sa.text(
                "INSERT INTO tickets_dc__state (sequence_name, bits, stock, issued, given_back, "
                "refills, refilled) VALUES ('photos', 64, 650, 400, 50, 1, 1000)"))
        assert not set(NEW_STATE_COLUMNS) & {
            c["name"] for c in sa.inspect(engine).get_columns("tickets_dc__state")}
    finally:
        engine.dispose()
    upstream = TicketServer(upstream_url)
    upstream.create("photos", start=1001)  # what upstream issued to the tier is behind it
    tier = DatacenterTier(url, upstream, supply=0.001, min_block=100, timeout=10.0)
    try:
        tier.create_tables()  # as a tier's first use does: the columns added
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            columns = {c["name"] for c in sa.inspect(engine).get_columns("tickets_dc__state")}
        finally:
            engine.dispose()
        assert set(NEW_STATE_COLUMNS) <= columns
        (status,) = tier.describe()
        assert (status.stock, status.given_back_in_stock, status.issued) == (650, 50, 400)
        first = tier.next_block("photos", 30)
        assert first == range(101, 131)  # given back first
        (status,) = tier.describe()
        assert (status.stock, status.given_back_in_stock) == (620, 20)
        ids = list(first)
        while len(ids) < 650:
            ids.extend(tier.next_block("photos", min(70, 650 - len(ids))))
        assert ids == [*range(101, 151), *range(401, 1001)]  # the old stock, in its order
        assert tier.wait_idle(30)
        more: list[int] = []
        while len(more) < 150:
            more.extend(tier.next_block("photos", 50))
        assert min(more) > 1000 and not _duplicates(ids + more)
        assert tier.wait_idle(30)
        (status,) = tier.describe()
        assert status.issued == 400 + 650 + 150
        assert status.stock == status.refilled - status.issued + status.given_back
    finally:
        tier.close()
        upstream.close()


# -- 6. what a young cache holds, and the outage it rides out ----------------------------------


class _Distant:
    """A ticket server far away (another region): every round trip, for one sequence or many,
    answers ``delay`` seconds late."""

    def __init__(self, server: TicketServer, delay: float) -> None:
        self.server = server
        self.delay = delay

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        threading.Event().wait(self.delay)  # the distance, not a synchronization
        return self.server.next_block(sequence, count, bits=bits)

    def next_blocks(self, requests: list[tuple[str | None, int, int]]) -> list[Any]:
        threading.Event().wait(self.delay)
        return self.server.next_blocks(requests)


def _paced(
    cache: CachedSource, sequence: str, rate: float, seconds: float,
    each: Callable[[], None] | None = None, until: Callable[[], bool] | None = None,
) -> tuple[list[int], list[str]]:
    """Draw ``rate * seconds`` ids of ``sequence`` at ``rate`` per second (the workload: paced
    by the clock, catching up after a late wake), or fewer if ``until()`` holds after a batch
    or a call fails; ``each()`` after every batch. Returns the ids and the error met, if any."""
    ids: list[int] = []
    errors: list[str] = []
    total = int(rate * seconds)
    began = time.monotonic()
    while len(ids) + len(errors) < total:
        due = min(total, int((time.monotonic() - began) * rate))
        while len(ids) + len(errors) < due:
            try:
                ids.append(cache.next_id(sequence))
            except TicketsError as error:
                errors.append(repr(error))
                return ids, errors  # each call would wait for the timeout: one is enough
        if each is not None:
            each()
        if until is not None and until():
            break
        time.sleep(0.01)
    return ids, errors


@pytest.fixture
def proxied_server_url(make_database: Callable[[str], str]) -> Iterator[tuple[TcpProxy, str]]:
    """A PostgreSQL ticket database behind a TCP proxy the test can cut or hang."""
    url = make_database("postgresql")
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        yield proxy, proxy.url(url)


@pytest.mark.slow
def test_a_young_cache_rides_out_an_outage_for_half_its_supply(
    proxied_server_url: tuple[TcpProxy, str],
) -> None:
    proxy, url = proxied_server_url
    supply, rate = 4.0, 500
    server = TicketServer(url, timeout=1.0)
    # 0.2 s away: a refill asked is still on its way when the link is cut right after.
    cache = CachedSource(_Distant(server, 0.2), supply=supply)
    try:
        before, errors = _paced(cache, "photos", rate, supply + 1)
        assert errors == []
        # The worst moment to lose the link: the lane just fell to its low-water mark (half a
        # supply of ids at its rate) and asked for a refill, which the cut loses.
        more, errors = _paced(cache, "photos", rate, 5 * supply,
                              until=lambda: cache.stats()["in_flight"] > 0)
        assert errors == []
        proxy.hang()  # the ticket server hangs: every refill waits for its timeout, then fails
        stats = cache.stats()
        assert stats["in_flight"] > 0, "no refill was on its way when the link was cut"
        waits, held = stats["blocking_waits"], stats["in_hand"]
        print(f"at the cut: {held} ids in hand at an estimated {stats['rate']:.0f} ids/s")
        during, errors = _paced(cache, "photos", rate, supply / 2)
        stats = cache.stats()
        assert errors == [], f"{len(errors)} errors; held {held} ids at the cut ({stats})"
        assert stats["blocking_waits"] == waits  # no call waited on the hung server
        assert len(during) == rate * supply / 2
        assert not _duplicates(before + more + during)
    finally:
        proxy.forward()
        cache.close()
        server.close()


@pytest.mark.backend("postgresql")
def test_a_young_cache_holds_no_more_than_it_issued(database_url: str) -> None:
    """So that a process killed early burns at most about what it used (``_sizing.py``: "a young
    lane ... holds no more than it has issued so far")."""
    server = TicketServer(database_url)
    cache = CachedSource(server, supply=4.0)
    worst: list[dict[str, Any]] = []

    def look() -> None:
        lane = cache.stats()["sequences"]["photos/64"]
        held = lane["in_hand"] + lane["in_flight"]
        if held > lane["issued"] + cache.min_block:
            worst.append({k: lane[k] for k in ("issued", "in_hand", "in_flight", "rate")})

    try:
        cache.next_id("photos")
        born = time.monotonic()
        _, errors = _paced(cache, "photos", 500, 3.0, each=look)
        assert time.monotonic() - born < cache.supply  # young all along
        assert errors == []
    finally:
        cache.close()
        server.close()
    assert worst == [], f"held more than issued + min_block {len(worst)} times: {worst[:3]}"


# -- 7. many quiet lanes ------------------------------------------------------------------------


@pytest.mark.backend("postgresql")
def test_round_robin_over_many_quiet_lanes_never_waits_after_the_first_block(
    database_url: str,
) -> None:
    names = [f"quiet{i:03d}" for i in range(500)]
    server = TicketServer(database_url)
    cache = CachedSource(server)
    drawn: dict[str, list[int]] = {name: [] for name in names}
    try:
        cache.prepare(names)
        assert cache.stats()["blocking_waits"] == 0  # prepare's first blocks: no caller waited
        for _ in range(20):
            for name in names:
                drawn[name].append(cache.next_id(name))
            time.sleep(0.1)  # quiet lanes: a pause between passes
        stats = cache.stats()
    finally:
        cache.close()
        server.close()
    assert stats["issued"] == 20 * len(names)
    assert stats["refills"] >= 2 * len(names)  # each lane refilled after its first block
    waited = {name: lane for name, lane in stats["sequences"].items() if lane["blocking_waits"]}
    assert stats["blocking_waits"] == 0, waited
    for name, ids in drawn.items():
        assert ids == sorted(set(ids)), name  # one thread, one server: increasing, no repeat


@pytest.mark.backend("postgresql")
def test_a_lane_behind_a_distant_server_reaches_its_low_water_mark_in_one_refill(
    database_url: str,
) -> None:
    names = [f"far{i}" for i in range(5)]
    server = TicketServer(database_url)
    cache = CachedSource(_Distant(server, 0.5))
    try:
        cache.prepare(names)  # a first block each, in one round trip
        for _ in range(10):  # 50 ids a second of each: four latencies are 100 ids
            for name in names:
                cache.next_id(name)
            time.sleep(0.02)
        assert cache.wait_idle(60)
        lanes = cache.stats()["sequences"]
    finally:
        cache.close()
        server.close()
    trips = {name: lanes[f"{name}/64"]["round_trips"] for name in names}
    held = {name: lanes[f"{name}/64"]["in_hand"] for name in names}
    # The first block, then one refill sized for what the lane needs (a third if the rate
    # rose meanwhile).
    assert max(trips.values()) <= 3, (trips, held)
