"""The library's own connections: made as the application makes its own, fit for PgBouncer,
bounded in time -- for every database client of the library.

PgBouncer is a real one (``support.pgbouncer``) in transaction (and statement) pooling mode in
front of the test PostgreSQL, with a server pool smaller than the number of client threads, so
consecutive transactions of one client run on different server connections. What the
application's engine brings (``connect_args``, a ``do_connect`` hook) is observed on the server
side: ``pg_stat_activity`` / the MariaDB process list.
"""

from __future__ import annotations

import gc
import logging
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqlalchemy_tickets import (
    CachedSource,
    DatabaseUnavailable,
    TicketId,
    TicketsError,
    TicketServer,
    configure,
    retry_session,
)
from sqlalchemy_tickets.admin import sequence_status, table_max
from sqlalchemy_tickets.cli import main as cli_main
from sqlalchemy_tickets.sources.default import embedded_source
from sqlalchemy_tickets.sources.lease import WorkerLease
from support.pgbouncer import PgBouncer, pgbouncer  # noqa: F401 - the fixture
from support.proxy import TcpProxy

THREADS = 6
CALLS = 150


def _hammer(call: Callable[[], Any], threads: int = THREADS, calls: int = CALLS) -> tuple[
    list[Any], list[BaseException]
]:
    """``call()`` ``calls`` times in each of ``threads`` threads; the ids and the errors."""
    ids: list[Any] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(threads)

    def run() -> None:
        start.wait()
        for _ in range(calls):
            try:
                value = call()
            except Exception as error:  # counted, then reported
                with lock:
                    errors.append(error)
            else:
                with lock:
                    ids.append(value)

    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(run) for _ in range(threads)]:
            future.result()
    return ids, errors


def _check(ids: list[Any], errors: list[BaseException], expected: int) -> None:
    assert not errors, f"{len(errors)} of {expected} calls failed, e.g. {errors[0]!r}"
    assert len(ids) == expected
    assert len(set(ids)) == expected, "an id was issued twice"


@pytest.fixture
def bouncer(pgbouncer: Callable[[str], PgBouncer]) -> PgBouncer:  # noqa: F811
    return pgbouncer("transaction")


# -- PgBouncer: every database client of the library -----------------------------------------


def _psycopg_version() -> tuple[int, ...]:
    return tuple(int(part) for part in version("psycopg").split(".")[:2])


@pytest.mark.parametrize("pool_mode", ["transaction", "statement"])
@pytest.mark.parametrize("bind", ["url", "engine"])
def test_ticket_server_behind_pgbouncer(
    pgbouncer: Callable[[str], PgBouncer],  # noqa: F811
    postgresql_url: str,
    pool_mode: str,
    bind: str,
) -> None:
    """6 threads x 150 ``next_id`` through PgBouncer: every call answers, no id twice. Given an
    engine, it is one set up for PgBouncer as psycopg documents."""
    if pool_mode == "statement" and _psycopg_version() < (3, 3):
        # Seen with psycopg 3.1.0 (the lowest declared): PgBouncer refuses a transaction block
        # in statement pooling; psycopg 3.3 works. docs/connections.md states the limit.
        pytest.skip("statement pooling is supported from psycopg 3.3 on")
    url = pgbouncer(pool_mode).url(postgresql_url)
    app = sa.create_engine(url, connect_args={"prepare_threshold": None})
    server = TicketServer(app if bind == "engine" else url)
    try:
        server.create("photos")
        ids, errors = _hammer(lambda: server.next_id("photos"))
        _check(ids, errors, THREADS * CALLS)
    finally:
        server.close()
        app.dispose()


def test_cached_source_behind_pgbouncer(
    bouncer: PgBouncer, postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Blocks of one id, so every id is a round trip of the cache's background refills, none
    of which may fail (the cache would hide a failed refill behind a retry); one sequence per
    thread, so refills run side by side."""
    server = TicketServer(bouncer.url(postgresql_url))
    cache = CachedSource(server, min_block=1, max_block=1, timeout=10.0)
    sequences = [f"photos{i}" for i in range(THREADS)]
    mine = threading.local()
    turn = iter(sequences)

    def draw() -> tuple[str, int]:
        if not hasattr(mine, "sequence"):
            mine.sequence = next(turn)
        return mine.sequence, cache.next_id(mine.sequence)

    try:
        for sequence in sequences:
            server.create(sequence)
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            ids, errors = _hammer(draw)
        _check(ids, errors, THREADS * CALLS)
        failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert not failed, f"{len(failed)} refills failed, e.g. {failed[0]}"
        assert cache.stats()["round_trips"] >= THREADS * CALLS // 2
    finally:
        cache.close()
        server.close()


class _Base(DeclarativeBase):
    pass


class _Photo(_Base):
    __tablename__ = "photos_through_bouncer"
    id: Mapped[int] = mapped_column(TicketId("PhotosBouncer"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(40))


@pytest.fixture
def app_through_bouncer(bouncer: PgBouncer, postgresql_url: str) -> Iterator[sa.Engine]:
    """The application's engine through PgBouncer, configured for it as the docs say."""
    engine = sa.create_engine(
        bouncer.url(postgresql_url), connect_args={"prepare_threshold": None}
    )
    _Base.metadata.create_all(engine)
    try:
        yield engine
    finally:
        configure(None)
        engine.dispose()


def test_embedded_default_behind_pgbouncer(app_through_bouncer: sa.Engine) -> None:
    """Flushes in 6 threads, and the embedded default's ticket server hammered directly (its
    cache would otherwise make too few round trips to show anything)."""
    engine = app_through_bouncer
    source = embedded_source(engine)

    def flush() -> int:
        with Session(engine) as session:
            photo = _Photo(title="t")
            session.add(photo)
            session.commit()
            return photo.id

    ids, errors = _hammer(flush, calls=20)
    _check(ids, errors, THREADS * 20)
    server = source.source
    assert isinstance(server, TicketServer) and server.own.inherits
    ids, errors = _hammer(lambda: server.next_id("PhotosBouncer"))
    _check(ids, errors, THREADS * CALLS)


def test_retry_session_behind_pgbouncer(app_through_bouncer: sa.Engine) -> None:
    """``retry_session`` units whose ids come from ``TicketServer(app_engine)``, uncached."""
    engine = app_through_bouncer
    factory = sessionmaker(engine, expire_on_commit=False)
    server = TicketServer(engine)
    configure(server)
    try:

        def unit() -> int:
            def work(session: Session) -> _Photo:
                photo = _Photo(title="r")
                session.add(photo)
                return photo

            photo = retry_session(factory, work)
            return photo.id

        ids, errors = _hammer(unit, calls=40)
        _check(ids, errors, THREADS * 40)
    finally:
        configure(None)
        server.close()


def test_worker_leases_behind_pgbouncer(bouncer: PgBouncer, postgresql_url: str) -> None:
    """Leases taken, renewed and released from 6 threads through PgBouncer."""
    url = bouncer.url(postgresql_url)
    namespace = f"bouncer-{secrets.token_hex(3)}"
    errors: list[BaseException] = []
    held: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(THREADS)

    def run() -> None:
        lease = WorkerLease(url, namespace=namespace, ttl=30.0)
        try:
            barrier.wait()
            grant = lease.acquire(64)
            with lock:
                held.append(grant.worker_id)
            for i in range(40):
                assert lease.renew(grant, i)
            lease.release(grant, 40)
        except Exception as error:
            with lock:
                errors.append(error)
        finally:
            lease.close()

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, f"{len(errors)} of {THREADS} lease holders failed, e.g. {errors[0]!r}"
    assert len(set(held)) == THREADS


def test_cli_and_admin_behind_pgbouncer(
    bouncer: PgBouncer, postgresql_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = bouncer.url(postgresql_url)
    assert cli_main(["init", "--url", url, "photos"]) == 0
    for _ in range(8):
        assert cli_main(["next", "--url", url, "photos", "--count", "3"]) == 0
    assert cli_main(["status", "--url", url, "--json"]) == 0
    out = capsys.readouterr().out
    assert "photos" in out
    server = TicketServer(url)
    try:
        for _ in range(12):  # more than psycopg's 5 executions before it prepares
            [status] = sequence_status([server])
        assert status.last_id == 24
        assert table_max(url, "tickets__photos", "id") == 24
    finally:
        server.close()


# -- connecting as the application does ------------------------------------------------------


@pytest.fixture
def pg_role(postgresql_url: str) -> Iterator[str]:
    """A login role that may create tables in the test database (what an IAM hook would log
    in as)."""
    role = f"tix_{secrets.token_hex(4)}"
    admin = sa.create_engine(
        postgresql_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE ROLE "{role}" LOGIN')
        conn.exec_driver_sql(f'GRANT ALL ON SCHEMA public TO "{role}"')
    try:
        yield role
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.exec_driver_sql(f'DROP OWNED BY "{role}"')
            conn.exec_driver_sql(f'DROP ROLE "{role}"')
        admin.dispose()


def _app_engine_with_hook(url: str, user: str, app_name: str) -> tuple[sa.Engine, list[str]]:
    """An application engine with a ``connect_args`` setting and a ``do_connect`` hook that
    logs in as ``user`` (the way an IAM-token hook sets the password)."""
    engine = sa.create_engine(url, connect_args={"application_name": app_name})
    calls: list[str] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        calls.append(cparams.get("application_name", ""))
        cparams["user"] = user

    return engine, calls


def _sessions(url: str) -> list[tuple[str, str]]:
    """(user, application_name) of every other session on the database."""
    database = make_url(url).database
    admin = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with admin.connect() as conn:
            rows = conn.exec_driver_sql(
                "SELECT usename, application_name FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (database,),
            ).all()
    finally:
        admin.dispose()
    return [(str(r[0]), str(r[1])) for r in rows]


@pytest.mark.parametrize("client", ["ticket_server", "embedded_default", "worker_lease"])
def test_connect_args_and_do_connect_hook_reach_the_library_connections(
    postgresql_url: str, pg_role: str, client: str
) -> None:
    app_name = f"app-{secrets.token_hex(3)}"
    engine, calls = _app_engine_with_hook(postgresql_url, pg_role, app_name)
    closers: list[Callable[[], None]] = [engine.dispose]
    try:
        if client == "ticket_server":
            server = TicketServer(engine)
            closers.append(server.close)
            server.next_id("photos")
        elif client == "embedded_default":
            cache = embedded_source(engine)
            cache.next_id("photos")
        else:
            lease = WorkerLease(engine, namespace="observed")
            closers.append(lease.close)
            lease.acquire(4)
        sessions = _sessions(postgresql_url)
        assert sessions, "the library kept no connection open"
        assert set(sessions) == {(pg_role, app_name)}, sessions
        assert calls and set(calls) == {app_name}
        assert engine.pool.checkedout() == 0  # its own pool, not the application's
    finally:
        for close in reversed(closers):
            close()


def test_the_application_engine_is_left_as_it_was(postgresql_url: str, pg_role: str) -> None:
    """The library's settings (timeouts, no prepared statements) go to its own connections
    only; the application's connections are made exactly as before."""
    engine, calls = _app_engine_with_hook(postgresql_url, pg_role, "app")
    server = TicketServer(engine, timeout=3.0)
    try:
        server.next_id("photos")
        with engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            assert dbapi is not None
            assert dbapi.prepare_threshold == 5  # psycopg's default, untouched
            assert "connect_timeout" not in dbapi.info.get_parameters()
        assert calls == ["app"] * len(calls) and len(calls) >= 2  # its own connection too
        assert server.own.engine.pool is not engine.pool
    finally:
        server.close()
        engine.dispose()


def test_ticket_server_never_waits_for_the_application_pool(postgresql_url: str) -> None:
    """A caller holding every connection of its engine's pool still gets ids."""
    engine = sa.create_engine(postgresql_url, pool_size=1, max_overflow=0, pool_timeout=1)
    server = TicketServer(engine)
    try:
        with engine.connect() as held:
            held.exec_driver_sql("SELECT 1")  # in a transaction, holding the only connection
            assert server.next_id("photos") == 1
            assert server.next_id("photos") == 2
    finally:
        server.close()
        engine.dispose()


def test_an_application_creator_is_used(postgresql_url: str) -> None:
    """``create_engine(creator=...)``: the library's connections come from it too, and still
    make no server-side prepared statements."""
    import psycopg

    made: list[Any] = []
    url = make_url(postgresql_url)

    def creator() -> Any:
        conn = psycopg.connect(
            host=url.host, port=url.port, user=url.username, dbname=url.database,
            application_name="from-creator",
        )
        made.append(conn)
        return conn

    engine = sa.create_engine("postgresql+psycopg://", creator=creator)
    server = TicketServer(engine)
    try:
        for _ in range(8):
            server.next_id("photos")
        assert made and all(c.prepare_threshold is None for c in made)
        assert {name for _, name in _sessions(postgresql_url)} == {"from-creator"}
    finally:
        server.close()
        engine.dispose()


# -- MySQL/MariaDB: the same inheritance with PyMySQL ----------------------------------------


@pytest.fixture
def mysql_user(mysql_url: str) -> Iterator[str]:
    user = f"tix_{secrets.token_hex(4)}"
    database = make_url(mysql_url).database
    admin = sa.create_engine(mysql_url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql("CREATE USER %s@'%%'", (user,))
        conn.exec_driver_sql(f"GRANT ALL ON `{database}`.* TO %s@'%%'", (user,))
    try:
        yield user
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql("DROP USER IF EXISTS %s@'%%'", (user,))
        admin.dispose()


@pytest.mark.parametrize("client", ["ticket_server", "embedded_default", "worker_lease"])
def test_mysql_connect_args_and_do_connect_hook_reach_the_library_connections(
    mysql_url: str, mysql_user: str, client: str
) -> None:
    """``init_command`` (from ``connect_args``) takes a named lock the server reports with the
    session holding it; the hook's user is that session's user."""
    lock_name = f"tickets_probe_{secrets.token_hex(4)}"
    engine = sa.create_engine(
        mysql_url, connect_args={"init_command": f"SELECT GET_LOCK('{lock_name}', 0)"}
    )
    calls: list[int] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        calls.append(1)
        cparams["user"] = mysql_user
        cparams.pop("password", None)

    closers: list[Callable[[], None]] = [engine.dispose]
    try:
        if client == "ticket_server":
            server = TicketServer(engine)
            closers.append(server.close)
            server.next_id("photos")
        elif client == "embedded_default":
            embedded_source(engine).next_id("photos")
        else:
            lease = WorkerLease(engine, namespace="observed")
            closers.append(lease.close)
            lease.acquire(4)
        admin = sa.create_engine(mysql_url, poolclass=sa.pool.NullPool)
        try:
            with admin.connect() as conn:
                holder = conn.exec_driver_sql(f"SELECT IS_USED_LOCK('{lock_name}')").scalar()
                assert holder is not None, "init_command never ran on a library connection"
                user = conn.exec_driver_sql(
                    "SELECT user FROM information_schema.processlist WHERE id = %s", (holder,)
                ).scalar()
        finally:
            admin.dispose()
        assert user == mysql_user
        assert calls
    finally:
        for close in reversed(closers):
            close()


# -- a hung worker-lease database --------------------------------------------------------------


@pytest.mark.parametrize("backend_name", ["postgresql", "mysql"])
def test_a_hung_lease_database_is_an_error_after_its_timeout(
    make_database: Callable[[str], str], backend_name: str
) -> None:
    url = make_database(backend_name)
    target = make_url(url)
    timeout = 1.0
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        lease = WorkerLease(proxy.url(url), namespace="hung", timeout=timeout)
        fresh = WorkerLease(proxy.url(url), namespace="hung2", timeout=timeout)
        try:
            grant = lease.acquire(8)
            proxy.hang()
            for what, call in (
                ("renew", lambda: lease.renew(grant, 1)),
                ("first acquire", lambda: fresh.acquire(8)),
            ):
                outcome = _within(30.0, call)
                assert isinstance(outcome, DatabaseUnavailable), (what, outcome)
                assert isinstance(outcome, TicketsError)
        finally:
            proxy.forward()
            lease.close()
            fresh.close()


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """What ``call()`` returned or raised, or a failure if it still runs after ``seconds``
    (a hang: the thread is left to the proxy's close)."""
    result: list[Any] = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append(call())
        except BaseException as error:
            result.append(error)
        finally:
            done.set()

    threading.Thread(target=run, daemon=True).start()
    started = time.monotonic()
    if not done.wait(seconds):
        pytest.fail(f"still waiting after {seconds:.0f} s: the call hangs")
    assert time.monotonic() - started < seconds
    return result[0]


def test_the_embedded_default_does_not_keep_the_application_engine_alive(
    postgresql_url: str,
) -> None:
    """It connects through the engine, keyed weakly by it: dropping the engine drops both."""
    engine = sa.create_engine(postgresql_url)
    source = embedded_source(engine)
    source.next_id("photos")
    server = source.source
    assert isinstance(server, TicketServer) and server.own.inherits
    alive = weakref.ref(engine)
    source.close()
    server.close()
    del engine, source, server
    gc.collect()
    assert alive() is None
