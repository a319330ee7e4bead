"""A PostgreSQL ticket server with a synchronous standby, failed over for real.

Every commit on the primary waits for the standby (``synchronous_standby_names``), so an id
a client was given is on the standby before the client has it. The primary is SIGKILLed with
clients drawing ids, the standby promoted, and the clients follow through a multi-host URL
(``host=a&host=b&target_session_attrs=read-write``, libpq's own failover): no id twice, and
the promotion (a new timeline, the same cluster and table) is recognised as a failover that
lost nothing — no margin jump, no ``RewindError`` in a fresh process. An asynchronous replica
promoted the same way is a rewind (see ``test_rewind.py``).

What the library trusts is the replication as it was when the primary failed, not as it was
when a table was first seen: synchronous replication turned off at run time (what Patroni's
non-strict synchronous mode does when its standby fails), a quorum, or replication made
synchronous after the table was first seen, each tried here against a real promotion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from sqlalchemy_tickets import CachedSource, RewindError, TicketServer
from sqlalchemy_tickets.sources import _server_guard
from support.rewind import PgPair, pg_connect, postgresql_pair

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

#: Threads drawing ids through the failover.
THREADS = 4


@pytest.fixture
def pair() -> Iterator[PgPair]:
    """A primary and its streaming standby, asynchronous until a test says otherwise, with
    database ``tickets``."""
    with postgresql_pair() as started:
        yield started


def _recorded(url: str) -> tuple[int, int | None, int]:
    """The stamp row of sequence ``photos``: ``(synchronous, lease or None, the clock)``."""
    with pg_connect(url) as conn:
        row = conn.execute(
            "SELECT synchronous, last_id, "
            "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT) "
            "FROM tickets_stamps WHERE name = 'tickets__photos'"
        ).fetchone()
    assert row is not None
    synchronous, last_id, clock = row
    return synchronous, -last_id if last_id is not None and last_id < 0 else None, clock


def test_failover_to_a_synchronous_standby_issues_no_id_twice(pair: PgPair) -> None:
    pair.set_standbys("{}")
    url = pair.multi_host_url("tickets")
    server = TicketServer(url, timeout=2.0)
    got: list[int] = []
    errors: list[str] = []
    gaps: list[float] = []
    lock = threading.Lock()
    stop = threading.Event()
    drawn = [0]

    def draw(k: int) -> None:
        mine: list[int] = []
        last_ok = time.monotonic()
        while not stop.is_set():
            try:
                mine.extend(server.next_block("photos", 1 + k))
            except Exception as error:  # noqa: BLE001 - counted; the failover window
                with lock:
                    errors.append(type(error).__name__)
                continue
            now = time.monotonic()
            with lock:
                gaps.append(now - last_ok)
                drawn[0] += 1
            last_ok = now
        with lock:
            got.extend(mine)

    def traffic(blocks: int) -> None:
        target = drawn[0] + blocks
        deadline = time.monotonic() + 60
        while drawn[0] < target:
            assert time.monotonic() < deadline, f"only {drawn[0]} blocks drawn"
            time.sleep(0.02)

    server.next_block("photos", 1)  # created, and its identity recorded, before traffic
    threads = [threading.Thread(target=draw, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    try:
        traffic(200)
        pair.crash_primary()
        failed_at = time.monotonic()
        pair.promote()
        traffic(200)
        recovered = time.monotonic() - failed_at
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    try:
        assert len(got) == len(set(got))
        # A failover that lost nothing: no heal, so no jump of a margin.
        assert server.stats()["rewinds"] == 0
        assert max(got) < 1_000_000
        window = max(gaps)
        print(f"synchronous failover: {len(got)} ids, longest wait {window:.2f} s, "
              f"{len(errors)} caller errors ({sorted(set(errors))}), traffic back after "
              f"{recovered:.2f} s")
        # Errors only while no server answered: each a TicketServerUnavailable.
        assert set(errors) <= {"TicketServerUnavailable"}
    finally:
        server.close()
    # A process started after the failover trusts the promoted standby: nothing lost.
    fresh = TicketServer(url)
    try:
        after = fresh.next_block("photos", 10)
        assert after.start > max(got)
    finally:
        fresh.close()


#: The lease where a test waits out a hold (ms): short, so that the hold ends within the test.
#: Elsewhere the tests keep the library's: a promotion on a loaded machine takes seconds, and a
#: failover noticed after the lease ran out is rightly treated as a possible rewind.
LEASE_MS = 4_000


def _fresh_processes_refuse(url: str) -> None:
    """A process started now, uncached or cached, knows no id in use: ``RewindError``."""
    for fresh in (TicketServer(url), CachedSource(TicketServer(url))):
        try:
            with pytest.raises(RewindError):
                fresh.next_id("photos")
        finally:
            fresh.close()


@pytest.fixture
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_server_guard, "SYNC_LEASE_MS", LEASE_MS)


@pytest.mark.usefixtures("short_lease")
def test_synchronous_replication_turned_off_holds_ids_until_its_lease_ran_out(
    pair: PgPair,
) -> None:
    """Patroni's non-strict synchronous mode, by hand: the standby goes, the primary stops
    waiting for it, ids go on; the primary dies and the lagging standby is promoted. The ids
    issued after the standby went are not on it, and its record still says synchronous: the
    process that issued them held them until that record's lease ran out, so the promotion,
    noticed after it, is a possible rewind — healed above what that process issued, refused
    (``RewindError``) by fresh processes, which know of no id in use. Never 101 again."""
    pair.set_standbys("{}")
    url = pair.multi_host_url("tickets")
    primary_url, replica_url = pair.database_urls("tickets")
    server = TicketServer(url, timeout=3 * LEASE_MS / 1000)
    try:
        assert list(server.next_block("photos", 100)) == list(range(1, 101))
        synchronous, lease, _ = _recorded(primary_url)
        assert synchronous == 1 and lease is not None

        pair.cut_replication()
        pair.set_standbys("", wait_sync=False)
        _, lease_now, before = _recorded(primary_url)
        assert lease_now is not None and lease_now >= lease
        started = time.monotonic()
        later = server.next_block("photos", 500)
        waited = time.monotonic() - started
        assert list(later) == list(range(101, 601))
        # Not one of them went out before the lease ran out, by the primary's clock.
        assert waited >= (lease_now - before) / 1000
        synchronous, _, _ = _recorded(primary_url)
        assert synchronous == 0

        pair.crash_primary()
        pair.promote()
        assert _recorded(replica_url)[0] == 1  # the standby never saw the change

        _fresh_processes_refuse(url)
        healed = server.next_block("photos", 5)
        assert healed.start > 600
        assert server.stats()["rewinds"] == 1
    finally:
        server.close()


def test_a_quorum_is_not_trusted_to_have_lost_nothing(pair: PgPair) -> None:
    """``ANY 1 (standby, other)``: a commit waits for one of two standbys; the one promoted
    may not be it. The library records the replication as not protecting its commits, and the
    promotion is a possible rewind (here the standby did have every commit: a margin is the
    price of not knowing)."""
    pair.set_standbys("ANY 1 ({}, other)")
    url = pair.multi_host_url("tickets")
    primary_url, _ = pair.database_urls("tickets")
    server = TicketServer(url, timeout=10.0)
    try:
        ids = list(server.next_block("photos", 100))
        assert _recorded(primary_url)[:2] == (0, None)
        pair.crash_primary()
        pair.promote()
        _fresh_processes_refuse(url)
        assert server.next_id("photos") > max(ids)
        assert server.stats()["rewinds"] == 1
    finally:
        server.close()


def test_replication_made_synchronous_while_a_process_runs_is_trusted_at_the_next_failover(
    pair: PgPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process first saw the table with asynchronous replication (as a new primary is
    right after a failover); the standby is made synchronous since. The process notices and
    records it, so a failover after that loses nothing and is trusted: no heal, no margin."""
    monkeypatch.setattr(_server_guard, "SYNC_RECHECK", 0.0)
    url = pair.multi_host_url("tickets")
    primary_url, _ = pair.database_urls("tickets")
    server = TicketServer(url, timeout=10.0)
    try:
        first = list(server.next_block("photos", 10))
        assert _recorded(primary_url)[:2] == (0, None)
        pair.set_standbys("{}")
        more = list(server.next_block("photos", 10))
        synchronous, lease, clock = _recorded(primary_url)
        assert synchronous == 1 and lease is not None and lease > clock
        pair.crash_primary()
        pair.promote()
        after = list(server.next_block("photos", 10))
        assert after[0] == more[-1] + 1 or after[0] > more[-1]
        assert after[-1] < 1_000_000, "healed: the failover was not trusted"
        assert server.stats()["rewinds"] == 0
        assert not set(after) & set(first + more)
    finally:
        server.close()
