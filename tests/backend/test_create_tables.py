"""``TicketServer.create_tables``: many sequences' tables at once, on real servers -- every table
created and seeded once, existing ones left alone, bad input refused with nothing written,
several processes creating overlapping lists at the same moment, PgBouncer, and the bounds on a
batch that takes longer than the timeout."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from queue import Empty
from typing import Any

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import TicketsError, TicketServer, TicketServerUnavailable
from sqlalchemy_tickets.dialects.base import TableInfo
from support.pgbouncer import PgBouncer, pgbouncer  # noqa: F401 - the fixture
from support.processes import WORKERS
from support.proxy import TcpProxy
from support.tables import drop_ticket_tables_one_by_one, ticket_tables

SEQUENCES = [f"seq{i:03d}" for i in range(300)]
TABLES = [f"tickets__{name}" for name in SEQUENCES]



@pytest.fixture
def database_url(database_url: str) -> Iterator[str]:
    """A fresh database on each backend, its hundreds of ticket tables dropped one by one."""
    yield database_url
    drop_ticket_tables_one_by_one(database_url)


def rows_of(url: str, tables: list[str]) -> dict[str, list[tuple[int, int, int]]]:
    """Every row of each named ticket table: ``(id, increment, offset)``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    found: dict[str, list[tuple[int, int, int]]] = {}
    try:
        with engine.connect() as conn:
            for name in tables:
                t = sa.table(name, sa.column("id"), sa.column("increment"), sa.column("offset"))
                found[name] = [tuple(row) for row in conn.execute(sa.select(t))]  # type: ignore[misc]
    finally:
        engine.dispose()
    return found


def test_creates_and_seeds_every_table_once(database_url: str) -> None:
    server = TicketServer(database_url)
    try:
        assert server.create_tables(SEQUENCES) == TABLES
        assert ticket_tables(database_url) == set(TABLES)
        # Each with its one seed row: the id before the first, stride 1/1.
        assert rows_of(database_url, TABLES) == {name: [(0, 1, 1)] for name in TABLES}
        assert server.next_id(SEQUENCES[0]) == 1
        assert server.next_block(SEQUENCES[-1], 3) == range(1, 4)

        # Again: nothing to create, nothing changed.
        assert server.create_tables(SEQUENCES) == []
        assert server.create_tables([name.upper() for name in SEQUENCES[:10]]) == []
        assert server.next_id(SEQUENCES[0]) == 2
        assert server.next_id(SEQUENCES[-1]) == 4
    finally:
        server.close()


def test_an_existing_table_is_left_as_it_is(database_url: str) -> None:
    server = TicketServer(database_url)
    try:
        server.create("photos")
        assert server.next_block("photos", 5) == range(1, 6)
        # Another stride asked, a repeat in another case: photos is not touched.
        created = server.create_tables(["a", "Photos", "b", "A"], increment=2, offset=2)
        assert created == ["tickets__a", "tickets__b"]
        assert server.describe("photos") == TableInfo(1, 1, 5)
        assert server.next_id("photos") == 6
        assert server.next_block("a", 2) == range(2, 6, 2)
        # create() is the one-sequence case: also leaves it alone.
        server.create("photos", increment=3, offset=1)
        assert server.describe("photos") == TableInfo(1, 1, 6)
        # None is Flickr's table.
        assert server.create_tables([None, "photos"], bits=32) == ["Tickets32"]
        assert server.next_id(bits=32) == 1
    finally:
        server.close()


@pytest.mark.parametrize(
    ("sequences", "kwargs"),
    [
        ([*SEQUENCES[:150], "bad-name", *SEQUENCES[150:]], {}),
        ([*SEQUENCES[:299], "x" * 41], {}),
        ([*SEQUENCES[:10], 42, *SEQUENCES[10:20]], {}),
        (SEQUENCES, {"bits": 16}),
        (SEQUENCES, {"increment": 2, "offset": 3}),
        (SEQUENCES, {"start": 0}),
        ("photos", {}),  # one string, not a list of names
        # Flickr's table has no stride of its own (MySQL/MariaDB: not the server's, 1/1).
        ([*SEQUENCES, None], {"increment": 2, "offset": 1}),
    ],
)
def test_bad_input_anywhere_writes_nothing(
    database_url: str, sequences: Any, kwargs: dict[str, int]
) -> None:
    server = TicketServer(database_url)
    try:
        with pytest.raises(TicketsError) as raised:
            server.create_tables(sequences, **kwargs)
        assert isinstance(raised.value, ValueError)
    finally:
        server.close()
    assert ticket_tables(database_url) == set()


def _create_in_child(url: str, names: list[str], barrier: Any, queue: Any) -> None:
    """In a spawned process: wait for the others, then create ``names``; report what this
    process created, or its error."""
    server = TicketServer(url, timeout=20.0)
    try:
        barrier.wait(timeout=120)
        queue.put(("created", server.create_tables(names)))
    except BaseException as error:  # reported to the parent, which fails the test
        queue.put(("error", f"{type(error).__name__}: {error}"))
    finally:
        server.close()


def test_processes_creating_overlapping_lists_at_once(database_url: str) -> None:
    """Three processes start together on lists that overlap pairwise, in three orders: no
    error, no deadlock, and every table created (and reported) by exactly one of them and
    seeded once."""
    mixed = SEQUENCES[50:250]
    random.Random(7).shuffle(mixed)
    lists = [SEQUENCES[:200], list(reversed(SEQUENCES[100:])), mixed]
    barrier = WORKERS.Barrier(len(lists))
    queue = WORKERS.Queue()
    children = [
        WORKERS.Process(target=_create_in_child, args=(database_url, names, barrier, queue))
        for names in lists
    ]
    for child in children:
        child.start()
    results: list[tuple[str, Any]] = []
    deadline = time.monotonic() + 300
    try:
        while len(results) < len(children):
            try:
                results.append(queue.get(timeout=0.5))
            except Empty:
                failed = [c.exitcode for c in children if c.exitcode not in (None, 0)]
                assert not failed, f"a child process died (exit codes {failed})"
                assert time.monotonic() < deadline, "the creators did not finish in time"
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
    errors = [detail for kind, detail in results if kind == "error"]
    assert errors == []
    created = [name for _, names in results for name in names]
    assert sorted(created) == sorted(TABLES), "a table created by none, or by two"
    assert ticket_tables(database_url) == set(TABLES)
    assert rows_of(database_url, TABLES) == {name: [(0, 1, 1)] for name in TABLES}
    server = TicketServer(database_url)
    try:
        assert [server.next_id(name) for name in SEQUENCES[::25]] == [1] * 12
    finally:
        server.close()


@pytest.mark.parametrize("pool_mode", ["transaction", "statement"])
def test_behind_pgbouncer(
    pgbouncer: Callable[[str], PgBouncer],  # noqa: F811
    postgresql_url: str,
    pool_mode: str,
) -> None:
    """Transaction pooling: batches are transactions, their advisory locks with them; two
    threads on overlapping lists each create their own share. Statement pooling refuses
    transaction blocks: statement by statement, every table still created and seeded once."""
    url = pgbouncer(pool_mode).url(postgresql_url)
    names = SEQUENCES[:120]
    lists = [names[:80], list(reversed(names[40:]))]
    servers = [TicketServer(url, timeout=10.0) for _ in lists]
    created: list[list[str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(len(lists))

    def create(server: TicketServer, share: list[str]) -> None:
        start.wait()
        try:
            created.append(server.create_tables(share))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [
        threading.Thread(target=create, args=pair) for pair in zip(servers, lists, strict=True)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert errors == []
        tables = [f"tickets__{name}" for name in names]
        made = [name for share in created for name in share]
        if pool_mode == "transaction":
            assert sorted(made) == sorted(tables)
        else:  # without locks, a table made at the same moment may be named by both
            assert set(made) == set(tables)
        assert rows_of(postgresql_url, tables) == {name: [(0, 1, 1)] for name in tables}
        assert servers[0].create_tables(names) == []
        assert [servers[1].next_id(name) for name in names[::20]] == [1] * 6
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def slow_ddl(postgresql_url: str) -> str:
    """A PostgreSQL database where every CREATE TABLE takes 100 ms more (an event trigger)."""
    engine = sa.create_engine(postgresql_url, isolation_level="AUTOCOMMIT",
                              poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION slow_ddl() RETURNS event_trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(0.1); END $$"
        )
        conn.exec_driver_sql(
            "CREATE EVENT TRIGGER slow_ddl ON ddl_command_end WHEN TAG IN ('CREATE TABLE') "
            "EXECUTE FUNCTION slow_ddl()"
        )
    engine.dispose()
    return postgresql_url


def test_a_batch_longer_than_the_timeout_is_not_cut(slow_ddl: str) -> None:
    """Each statement answers well within the timeout; a batch of them does not: the bound is
    per statement, and the batches shrink to the pace they see."""
    # Each statement well within the bound even on a loaded machine (a statement once took
    # 0.4 s there, beside three test runs), the batch far beyond it.
    server = TicketServer(slow_ddl, timeout=1.0)
    names = SEQUENCES[:25]
    try:
        began = time.monotonic()
        assert server.create_tables(names) == [f"tickets__{name}" for name in names]
        assert time.monotonic() - began > 1.0 * 2  # 25 tables x 100 ms: longer than the bound
        assert server.next_id(names[-1]) == 1
    finally:
        server.close()


def test_a_hung_server_is_an_error_not_a_hang(postgresql_url: str) -> None:
    target = sa.engine.make_url(postgresql_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 5432) as proxy:
        server = TicketServer(proxy.url(postgresql_url), timeout=1.0)
        try:
            server.create("first")  # connected, the dialect's first queries done
            proxy.hang()
            began = time.monotonic()
            with pytest.raises(TicketServerUnavailable):
                server.create_tables(SEQUENCES[:50])
            assert time.monotonic() - began < 10
        finally:
            proxy.forward()
            server.close()
