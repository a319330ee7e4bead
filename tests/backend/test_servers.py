"""Dedicated ticket servers: one, many processes, odd/even pairs, failures, Flickr's table."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import (
    ExhaustedError,
    StrideMismatchError,
    TicketServer,
    TicketServers,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from support.processes import WORKERS
from support.proxy import TcpProxy

NETWORK_BACKENDS = ["postgresql", "mysql"]


def _draw(url: str, threads: int, calls: int) -> list[int]:
    """Run in a child process: ``threads`` threads each take ``calls`` ids (singles and blocks)."""
    server = TicketServer(url)
    out: list[int] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        mine: list[int] = []
        for i in range(calls):
            if (i + k) % 5 == 0:
                mine.extend(server.next_block("shared", 7))
            else:
                mine.append(server.next_id("shared"))
        with lock:
            out.extend(mine)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    server.close()
    return out


@pytest.mark.backend(*NETWORK_BACKENDS)
def test_four_processes_by_four_threads_never_share_an_id(make_database, backend: str) -> None:
    url = make_database(backend)
    TicketServer(url).create("shared")
    ctx = WORKERS
    with concurrent.futures.ProcessPoolExecutor(4, mp_context=ctx) as pool:
        results = list(pool.map(_draw, [url] * 4, [4] * 4, [50] * 4))
    ids = [i for chunk in results for i in chunk]
    expected = 4 * 4 * (40 * 1 + 10 * 7)
    assert len(ids) == expected
    assert len(set(ids)) == expected
    assert set(ids) == set(range(1, expected + 1))  # nothing lost either: no gaps


@pytest.fixture
def pair(make_database) -> Iterator[tuple[str, str]]:
    yield make_database("mysql"), make_database("mysql")


def test_two_servers_issue_odd_and_even_ids_in_balance(pair: tuple[str, str]) -> None:
    servers = TicketServers(list(pair))
    ids = [servers.next_id("photos") for _ in range(100)]
    assert len(set(ids)) == 100
    odd = [i for i in ids if i % 2 == 1]
    even = [i for i in ids if i % 2 == 0]
    assert len(odd) == len(even) == 50
    assert odd == sorted(odd) and even == sorted(even)
    block = servers.next_block("photos", 10)
    assert block.step == 2 and len(block) == 10
    servers.close()


def test_a_server_whose_stride_disagrees_issues_nothing(make_database) -> None:
    first, second = make_database("postgresql"), make_database("postgresql")
    TicketServer(first).create("photos", increment=2, offset=1)
    TicketServer(second).create("photos", increment=2, offset=1)  # should be offset 2
    servers = TicketServers([first, second])
    assert servers.next_id("photos") == 1
    with pytest.raises(StrideMismatchError, match="offset=2"):
        servers.next_id("photos")
    # The misconfigured server's table was not advanced.
    assert TicketServer(second).describe("photos").last_id == -1  # type: ignore[union-attr]


def test_swapped_servers_are_refused(make_database) -> None:
    a, b = make_database("mysql"), make_database("mysql")
    TicketServers([a, b]).next_block("photos", 1)
    TicketServers([a, b]).next_block("photos", 1)
    swapped = TicketServers([b, a])
    with pytest.raises(StrideMismatchError):
        swapped.next_block("photos", 1)
        swapped.next_block("photos", 1)


class _Clock:
    """A clock the test moves by hand, so back-off needs no waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.backend(*NETWORK_BACKENDS)
def test_failover_when_a_server_is_down_hung_and_back(make_database, backend: str) -> None:
    direct, behind = make_database(backend), make_database(backend)
    target = sa.engine.make_url(behind)
    clock = _Clock()
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        servers = TicketServers([direct, proxy.url(behind)], timeout=2.0, clock=clock)
        ids = [servers.next_id("photos") for _ in range(4)]
        assert sorted(i % 2 for i in ids) == [0, 0, 1, 1]

        proxy.refuse()  # down: connections refused
        down = [servers.next_id("photos") for _ in range(6)]
        assert all(i % 2 == 1 for i in down)
        assert servers.status()[1]["up"] is False

        clock.now += 60
        proxy.hang()  # hung: accepts, never answers
        started = time.monotonic()
        hung = [servers.next_id("photos") for _ in range(4)]
        waited = time.monotonic() - started
        assert all(i % 2 == 1 for i in hung)
        assert waited < 2.0 * 2 + 4  # one timeout, not one per call
        assert servers.status()[1]["failures"] >= 1

        clock.now += 120
        proxy.forward()  # back
        back = [servers.next_id("photos") for _ in range(4)]
        assert any(i % 2 == 0 for i in back)
        assert servers.status()[1]["up"] is True
        every = ids + down + hung + back
        assert len(set(every)) == len(every)
        servers.close()


@pytest.mark.backend(*NETWORK_BACKENDS)
def test_a_hung_server_is_an_error_after_its_timeout(make_database, backend: str) -> None:
    url = make_database(backend)
    target = sa.engine.make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=1.0)
        server.next_id("photos")  # connected and warm
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(TicketServerUnavailable):
            server.next_id("photos")
        assert time.monotonic() - started < 8
        server.close()


def test_all_servers_down_is_a_clear_error() -> None:
    servers = TicketServers(
        ["postgresql+psycopg://postgres@127.0.0.1:1/x", "mysql+pymysql://root@127.0.0.1:1/x"],
        timeout=1.0,
    )
    with pytest.raises(TicketServerUnavailable, match="no ticket server answered"):
        servers.next_id("photos")


def test_killing_a_real_second_server(private_mariadb_factory, make_database) -> None:
    first = make_database("mysql")
    process = private_mariadb_factory()
    engine = sa.create_engine(process.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE DATABASE tickets")
    engine.dispose()
    second = process.url.rstrip("/") + "/tickets"
    servers = TicketServers([first, second], timeout=2.0)
    before = [servers.next_id("photos") for _ in range(10)]
    assert {i % 2 for i in before} == {0, 1}
    process.kill()
    after = [servers.next_id("photos") for _ in range(10)]
    assert all(i % 2 == 1 for i in after)
    assert len(set(before + after)) == 20
    servers.close()


@pytest.mark.parametrize("storage_engine", ["InnoDB", "MyISAM"])
def test_flickr_table_shared_with_legacy_replace_into(mysql_url: str, storage_engine: str) -> None:
    server = TicketServer(mysql_url, storage_engine=storage_engine)
    server.create(None)
    legacy = sa.create_engine(mysql_url, isolation_level="AUTOCOMMIT")

    def legacy_id() -> int:
        with legacy.connect() as conn:
            conn.exec_driver_sql("REPLACE INTO Tickets64 (stub) VALUES ('a')")
            return int(conn.exec_driver_sql("SELECT LAST_INSERT_ID()").scalar_one())

    with legacy.connect() as conn:
        engine_name = conn.exec_driver_sql(
            "SELECT ENGINE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'Tickets64'"
        ).scalar_one()
    assert engine_name == storage_engine
    issued: list[int] = []
    for _ in range(5):
        issued.append(legacy_id())
        issued.extend(server.next_block(None, 10))
        issued.append(server.next_id())
        issued.append(legacy_id())
    assert len(issued) == len(set(issued)) == 5 * 13
    assert issued == sorted(issued)
    legacy.dispose()
    server.close()


def test_flickr_tables_take_the_servers_stride(private_mariadb_factory) -> None:
    process = private_mariadb_factory(
        extra_args=["--auto-increment-increment=2", "--auto-increment-offset=2"]
    )
    engine = sa.create_engine(process.url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE DATABASE tickets")
    engine.dispose()
    url = process.url.rstrip("/") + "/tickets"
    server = TicketServer(url)
    ids = [server.next_id() for _ in range(3)] + list(server.next_block(None, 3))
    assert all(i % 2 == 0 for i in ids) and ids == sorted(ids) and len(set(ids)) == 6
    with pytest.raises(StrideMismatchError):
        TicketServers([url, url]).next_id()  # position 0 needs offset 1
    server.close()


def test_32_bit_sequence_stops_at_its_limit(make_database, backend: str) -> None:
    url = make_database(backend)
    server = TicketServer(url)
    server.create("small", bits=32, start=2**31 - 5)
    assert list(server.next_block("small", 3, bits=32)) == [2**31 - 5, 2**31 - 4, 2**31 - 3]
    with pytest.raises(ExhaustedError, match="2 left"):
        server.next_block("small", 3, bits=32)
    assert list(server.next_block("small", 2, bits=32)) == [2**31 - 2, 2**31 - 1]
    with pytest.raises(ExhaustedError, match="0 left"):
        server.next_id("small", bits=32)
    assert server.describe("small").last_id == 2**31 - 1  # type: ignore[union-attr]
    server.close()


def test_unknown_sequence_without_create(make_database, backend: str) -> None:
    server = TicketServer(make_database(backend), create_missing=False)
    with pytest.raises(UnknownSequenceError, match="sqlalchemy-tickets init"):
        server.next_id("nothere")
    server.close()


def test_sqlite_embedded_tickets_live_in_a_sibling_file(tmp_path: Path) -> None:
    from sqlalchemy_tickets.sources.default import embedded_source

    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    cache = embedded_source(engine)
    try:
        assert isinstance(cache.source, TicketServer)
        assert cache.source.url.database == str(tmp_path / "app.db-tickets")
    finally:
        cache.close()
        cache.source.close()  # type: ignore[attr-defined]
        engine.dispose()
