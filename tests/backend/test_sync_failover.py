"""A PostgreSQL ticket server with a synchronous standby, failed over for real.

Every commit on the primary waits for the standby (``synchronous_standby_names``), so an id
a client was given is on the standby before the client has it. The primary is SIGKILLed with
clients drawing ids, the standby promoted, and the clients follow through a multi-host URL
(``host=a&host=b&target_session_attrs=read-write``, libpq's own failover): no id twice, and
the promotion (a new timeline, the same cluster and table) is recognised as a failover that
lost nothing — no margin jump, no ``RewindError`` in a fresh process. An asynchronous replica
promoted the same way is a rewind (see ``test_rewind.py``).
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sqlalchemy_tickets import TicketServer
from support.rewind import PgPair, pg_connect, start_postgresql_pair

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

#: Threads drawing ids through the failover.
THREADS = 4


@pytest.fixture
def pair() -> Iterator[PgPair]:
    workdir = Path(tempfile.mkdtemp(prefix="tickets-sync-"))
    shutil.chown(workdir, "postgres", "postgres")
    try:
        with start_postgresql_pair(workdir) as started:
            with pg_connect(started.primary.url) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
                deadline = time.monotonic() + 30
                while conn.execute(
                    "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
                ).fetchone() != (1,):
                    assert time.monotonic() < deadline, "the standby never became synchronous"
                    time.sleep(0.05)
                conn.execute("CREATE DATABASE tickets")
            yield started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _multi_host_url(pair: PgPair) -> str:
    return (
        "postgresql+psycopg://postgres@/tickets"
        f"?host=127.0.0.1:{pair.primary.port}&host=127.0.0.1:{pair.replica.port}"
        "&target_session_attrs=read-write"
    )


def test_failover_to_a_synchronous_standby_issues_no_id_twice(pair: PgPair) -> None:
    url = _multi_host_url(pair)
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
