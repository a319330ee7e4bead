"""The rewind helpers (``support.rewind``) really move real databases back in time.

Each test asserts an effect a client can observe on a real server -- new table OIDs / table
ids and old rows after an in-place restore, a counter handing out a number again, a promoted
replica on a new timeline without the writes it missed -- so a helper that silently did
nothing would fail here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pymysql
import pytest

from support.rewind import (
    FollowingProxy,
    MariaDbPair,
    PgPair,
    checkpoint_timeline,
    dump,
    mariadb_connect,
    pg_connect,
    restore,
    start_mariadb_pair,
    start_postgresql_pair,
    system_identifier,
    timeline,
)
from support.servers import ServerProcess

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow


def _execute(conn: Any, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a raw psycopg or PyMySQL connection; rows as tuples."""
    if isinstance(conn, psycopg.Connection):
        cur = conn.execute(sql)
        return list(cur.fetchall()) if cur.description else []
    with conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(row) for row in cur.fetchall()]


def _connect(backend: str, url: str) -> Any:
    return pg_connect(url) if backend == "postgresql" else mariadb_connect(url)


def _table_identity(backend: str, conn: Any) -> Any:
    """What changes when table ``t`` is dropped and recreated (not merely emptied)."""
    if backend == "postgresql":
        return _execute(conn, "SELECT 't'::regclass::oid")[0][0]
    return _execute(
        conn,
        "SELECT TABLE_ID FROM information_schema.INNODB_SYS_TABLES "
        "WHERE NAME = CONCAT(DATABASE(), '/t')",
    )[0][0]


# --------------------------------------------------------------------------------------------
# dump / restore in place
# --------------------------------------------------------------------------------------------


@pytest.mark.backend("postgresql", "mysql")
def test_restore_in_place_recreates_tables_and_rewinds_rows_under_a_live_connection(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    url = make_database(backend)
    auto = "serial" if backend == "postgresql" else "INT AUTO_INCREMENT"
    setup = _connect(backend, url)
    _execute(setup, f"CREATE TABLE t (id {auto} PRIMARY KEY, v INT)")
    _execute(setup, "INSERT INTO t (v) VALUES (1), (2)")
    setup.close()

    bystander = _connect(backend, url)  # stays connected, idle, through the restore
    assert _execute(bystander, "SELECT id, v FROM t ORDER BY id") == [(1, 1), (2, 2)]
    identity = _table_identity(backend, bystander)
    if backend == "mysql":
        created = _execute(
            bystander,
            "SELECT CREATE_TIME FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't'",
        )[0][0]

    path = dump(url, tmp_path / "db.dump")
    assert path.stat().st_size > 0
    writer = _connect(backend, url)
    _execute(writer, "UPDATE t SET v = v + 10")
    _execute(writer, "INSERT INTO t (v) VALUES (3)")  # id 3 handed out after the dump
    writer.close()

    restore(url, path)

    assert _execute(bystander, "SELECT id, v FROM t ORDER BY id") == [(1, 1), (2, 2)]
    assert _table_identity(backend, bystander) != identity  # dropped and recreated
    if backend == "mysql":
        # CREATE_TIME has 1 s resolution: within the same second it may not move at all.
        recreated = _execute(
            bystander,
            "SELECT CREATE_TIME FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 't'",
        )[0][0]
        assert recreated >= created
    # The counter went back too: id 3 is handed out a second time.
    if backend == "postgresql":
        assert _execute(bystander, "INSERT INTO t (v) VALUES (4) RETURNING id") == [(3,)]
    else:
        _execute(bystander, "INSERT INTO t (v) VALUES (4)")
        assert _execute(bystander, "SELECT LAST_INSERT_ID()") == [(3,)]
    bystander.close()


@pytest.mark.backend("postgresql", "mysql")
def test_restore_fails_with_the_tools_error_instead_of_hanging_on_a_lock(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    url = make_database(backend)
    setup = _connect(backend, url)
    _execute(setup, "CREATE TABLE t (v INT)")
    _execute(setup, "INSERT INTO t VALUES (1)")
    setup.close()
    path = dump(url, tmp_path / "db.dump")

    # A client inside a transaction that read t holds a lock DROP TABLE must wait for.
    holder = _connect(backend, url)
    if backend == "postgresql":
        holder.autocommit = False
    else:
        holder.autocommit(False)
    _execute(holder, "SELECT * FROM t")
    with pytest.raises(RuntimeError, match="(?i)lock"):
        restore(url, path, lock_timeout=1)
    holder.rollback()
    holder.close()

    with pytest.raises(RuntimeError, match="(?i)unknown database|does not exist"):
        restore(f"{url}_missing", path)


# --------------------------------------------------------------------------------------------
# PostgreSQL primary + asynchronous replica
# --------------------------------------------------------------------------------------------


@pytest.fixture
def pg_pair(backend_servers: Any) -> Iterator[PgPair]:
    pair = start_postgresql_pair(backend_servers.postgres_workdir())
    try:
        yield pair
    finally:
        pair.primary.kill()
        pair.replica.kill()


def _pg_rows(url: str) -> list[tuple[Any, ...]]:
    with pg_connect(url) as conn:
        return list(conn.execute("SELECT v FROM t ORDER BY v").fetchall())


def test_postgresql_pair_promotes_a_replica_that_missed_the_last_write(pg_pair: PgPair) -> None:
    pair = pg_pair
    with pg_connect(pair.primary.url) as conn:
        conn.execute("CREATE DATABASE rewind")
    primary_url, replica_url = pair.database_urls("rewind")
    with pg_connect(primary_url) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t VALUES (1)")
    pair.wait_caught_up()
    assert _pg_rows(replica_url) == [(1,)]
    assert timeline(primary_url) == timeline(replica_url) == 1
    sysid = system_identifier(primary_url)

    proxy = FollowingProxy.for_url(primary_url)
    try:
        via_proxy = proxy.url(primary_url)
        client = pg_connect(via_proxy)
        assert _execute(client, "SELECT inet_server_port()") == [(pair.primary.port,)]

        pair.cut_replication()
        with pg_connect(primary_url) as conn:
            conn.execute("INSERT INTO t VALUES (2)")  # never reaches the replica
        assert _pg_rows(primary_url) == [(1,), (2,)]
        pair.crash_primary()
        assert not pair.primary.is_running()
        pair.promote()

        assert _pg_rows(replica_url) == [(1,)]  # the acknowledged write 2 is gone
        assert timeline(replica_url) == 2
        assert checkpoint_timeline(replica_url) == 2
        assert system_identifier(replica_url) == sysid
        with pg_connect(replica_url) as conn:
            assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
            conn.execute("INSERT INTO t VALUES (3)")  # writable now

        proxy.follow(replica_url)
        with pytest.raises(psycopg.OperationalError):
            _execute(client, "SELECT 1")
        client.close()
        with pg_connect(via_proxy) as conn:
            assert _execute(conn, "SELECT inet_server_port()") == [(pair.replica.port,)]
            assert _execute(conn, "SELECT v FROM t ORDER BY v") == [(1,), (3,)]
    finally:
        proxy.close()


# --------------------------------------------------------------------------------------------
# MariaDB primary + asynchronous GTID replica
# --------------------------------------------------------------------------------------------


@pytest.fixture
def mariadb_pair(private_mariadb_factory: Callable[..., ServerProcess]) -> Iterator[MariaDbPair]:
    pair = start_mariadb_pair(private_mariadb_factory)
    try:
        yield pair
    finally:
        pair.primary.kill()
        pair.replica.kill()


def _my_rows(url: str, sql: str = "SELECT v FROM t ORDER BY v") -> list[tuple[Any, ...]]:
    conn = mariadb_connect(url)
    try:
        return _execute(conn, sql)
    finally:
        conn.close()


def test_mariadb_pair_promotes_a_replica_that_missed_the_last_write(
    mariadb_pair: MariaDbPair,
) -> None:
    pair = mariadb_pair
    primary_url, replica_url = pair.database_urls("rewind")
    conn = mariadb_connect(pair.primary.url)
    _execute(conn, "CREATE DATABASE rewind")
    _execute(conn, "CREATE TABLE rewind.t (v INT PRIMARY KEY)")
    _execute(conn, "INSERT INTO rewind.t VALUES (1)")
    conn.close()
    pair.wait_caught_up()
    assert _my_rows(replica_url) == [(1,)]
    assert _my_rows(primary_url, "SELECT @@server_id") == [(1,)]
    assert _my_rows(replica_url, "SELECT @@server_id, @@read_only") == [(2, 1)]

    # Re-pointing the proxy cuts a connection to a primary that is still up (only the proxy
    # can have closed it) and sends new connections to the other server.
    proxy = FollowingProxy.for_url(primary_url)
    try:
        via_proxy = proxy.url(primary_url)
        client = mariadb_connect(via_proxy)
        assert _execute(client, "SELECT @@port") == [(pair.primary.port,)]
        proxy.follow(replica_url)
        with pytest.raises(pymysql.err.OperationalError):
            _execute(client, "SELECT 1")
        client.close()
        assert pair.primary.is_running()

        pair.cut_replication()
        status = pair.slave_status()
        assert (status["Slave_IO_Running"], status["Slave_SQL_Running"]) == ("No", "No")
        _my_rows(primary_url, "INSERT INTO t VALUES (2)")  # never reaches the replica
        assert _my_rows(primary_url) == [(1,), (2,)]
        pair.crash_primary()
        assert not pair.primary.is_running()
        pair.promote()

        assert pair.slave_status() == {}
        assert _my_rows(replica_url) == [(1,)]  # the acknowledged write 2 is gone
        assert _my_rows(replica_url, "SELECT @@server_id, @@read_only") == [(2, 0)]
        _my_rows(replica_url, "INSERT INTO t VALUES (3)")  # writable now

        conn = mariadb_connect(via_proxy)
        try:
            assert _execute(conn, "SELECT @@port, @@server_id") == [(pair.replica.port, 2)]
            assert _execute(conn, "SELECT v FROM t ORDER BY v") == [(1,), (3,)]
        finally:
            conn.close()
    finally:
        proxy.close()
