"""Connections that production closes under the library: an operator's ``pg_terminate_backend``
or ``KILL CONNECTION``, an idle timeout of the server (``idle_session_timeout``,
``wait_timeout``), a pooler restarted. The server still accepts new connections the whole time,
so callers must see no error, no server may be reported down, and nothing is logged at WARNING:
a closed connection costs only the round trip that found it, which is made again on a fresh
connection within the same call (CONTRACT §2).

Everything here is real: the connections are killed server-side, the timeouts are the servers'
own, the PgBouncer is a real one stopped and started again.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    TicketId,
    TicketServer,
    TicketServers,
    TicketServerUnavailable,
    retry_session,
)
from sqlalchemy_tickets._naming import TicketTable
from sqlalchemy_tickets.dialects import mysql as mysql_backend
from sqlalchemy_tickets.dialects import postgresql as postgresql_backend
from sqlalchemy_tickets.dialects.base import lock_key
from sqlalchemy_tickets.sources.default import embedded_source
from support.pgbouncer import start_pgbouncer
from support.proxy import TcpProxy

pytestmark = pytest.mark.backend("postgresql", "mysql")

#: Rounds of killing every connection while the callers draw.
KILLS = 3
#: Threads drawing at once: more than one connection each server holds.
THREADS = 6
#: Every source's timeout: what is checked is that a closed connection costs callers no error,
#: so a round trip slowed by a loaded machine must not be mistaken for one.
TIMEOUT = 10.0


def kill_connections(url: str) -> int:
    """Close, server-side, every other connection to the database of ``url``; how many."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            return _kill_sessions(conn, "pid <> pg_backend_pid()", "db = DATABASE()")
    finally:
        engine.dispose()


def _kill_sessions(conn: sa.Connection, postgresql_where: str, mysql_where: str) -> int:
    """Close, server-side, the other sessions that ``*_where`` picks (of ``conn``'s database on
    PostgreSQL, in ``information_schema.processlist`` on MySQL); how many."""
    if conn.dialect.name == "postgresql":
        return len(conn.execute(sa.text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = current_database() AND {postgresql_where}"
        )).all())
    ids = conn.execute(sa.text(
        "SELECT id FROM information_schema.processlist "
        f"WHERE {mysql_where} AND id <> CONNECTION_ID()"
    )).scalars().all()
    for session in ids:
        try:
            conn.exec_driver_sql(f"KILL CONNECTION {int(session)}")
        except sa.exc.DBAPIError:  # it ended meanwhile
            pass
    return len(ids)


def connections_to(url: str) -> int:
    """Sessions of other clients on the database of ``url``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                query = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                         " AND pid <> pg_backend_pid()")
            else:
                query = ("SELECT count(*) FROM information_schema.processlist "
                         "WHERE db = DATABASE() AND id <> CONNECTION_ID()")
            return int(conn.execute(sa.text(query)).scalar_one())
    finally:
        engine.dispose()


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = _now() + timeout
    while not condition():
        assert _now() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        threading.Event().wait(0.05)


def _now() -> float:
    import time

    return time.monotonic()


@pytest.fixture
def warnings_logged(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """``warnings_logged()``: the library's records at WARNING and above so far in the test
    (none is expected)."""
    caplog.set_level(logging.INFO, logger="sqlalchemy_tickets")

    def found() -> list[str]:
        # retry_session's own reports concern the application's connections (dead too).
        return [r.getMessage() for r in caplog.records
                if r.name.startswith("sqlalchemy_tickets") and r.levelno >= logging.WARNING
                and r.module != "retry"]

    return found


class _Callers:
    """``THREADS`` threads calling ``draw()`` until stopped; every id and every error kept."""

    def __init__(self, draw: Callable[[], object]) -> None:
        self._draw = draw
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.calls = 0
        self.ids: list[object] = []
        self.errors: list[BaseException] = []
        self._threads = [threading.Thread(target=self._run, name=f"draw-{i}")
                         for i in range(THREADS)]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got = self._draw()
            except Exception as error:  # every error a caller would see
                with self._lock:
                    self.errors.append(error)
                continue
            with self._lock:
                self.calls += 1
                self.ids.append(got)

    def __enter__(self) -> _Callers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_calls(self, more: int) -> None:
        """Wait until ``more`` calls completed after now."""
        with self._lock:
            target = self.calls + more
        _wait_for(lambda: self.calls >= target or bool(self.errors), 60,
                  f"{more} more calls")


def _kill_while_drawing(
    urls: list[str], callers: _Callers, round_trips: Callable[[], int] | None = None
) -> int:
    """Kill every connection of ``urls`` ``KILLS`` times, the callers drawing in between (and,
    given ``round_trips``, a cache's count of them, until it made two after each kill)."""
    killed = 0
    callers.wait_calls(4 * THREADS)
    for _ in range(KILLS):
        killed += sum(kill_connections(url) for url in urls)
        callers.wait_calls(4 * THREADS)
        if round_trips is not None:
            made = round_trips() + 2
            _wait_for(lambda made=made: round_trips() >= made or bool(callers.errors), 60,
                      "two round trips after the kill")
    return killed


def test_one_server_issues_through_kills_of_every_connection(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    """The pool holds several connections; all are killed at once. The next calls, one after
    the other, all succeed (before, each dead connection failed one call)."""
    url = make_database(backend)
    server = TicketServer(url, pool_size=THREADS, timeout=TIMEOUT)
    try:
        with _Callers(lambda: server.next_id("photos")) as callers:
            callers.wait_calls(4 * THREADS)  # several connections in the pool
        for _ in range(KILLS):
            assert kill_connections(url) >= 2
            ids = [server.next_id("photos") for _ in range(2 * THREADS)]
            assert ids == sorted(ids) and len(set(ids)) == len(ids)
        assert callers.errors == []
    finally:
        server.close()
    assert warnings_logged() == []


def test_a_pair_is_never_reported_down_while_its_servers_accept_connections(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    urls = [make_database(backend), make_database(backend)]
    pair = TicketServers([TicketServer(u, timeout=TIMEOUT) for u in urls])
    try:
        with _Callers(lambda: pair.next_id("photos")) as callers:
            assert _kill_while_drawing(urls, callers) >= 2 * KILLS
        assert callers.errors == []
        assert len(set(callers.ids)) == len(callers.ids)
        assert {(s["up"], s["failures"]) for s in pair.status()} == {(True, 0)}
    finally:
        pair.close()
    assert warnings_logged() == []


def test_a_cache_over_a_pair_refills_through_kills(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    urls = [make_database(backend), make_database(backend)]
    pair = TicketServers([TicketServer(u, timeout=TIMEOUT) for u in urls])
    # Small blocks: the refills go to the servers all along.
    cache = CachedSource(pair, min_block=4, max_block=4, timeout=TIMEOUT)
    try:
        with _Callers(lambda: cache.next_id("photos")) as callers:
            _kill_while_drawing(urls, callers, lambda: cache.stats()["round_trips"])
        assert callers.errors == []
        assert len(set(callers.ids)) == len(callers.ids)
        assert cache.stats()["sequences"]["photos/64"]["failures"] == 0
        assert {(s["up"], s["failures"]) for s in pair.status()} == {(True, 0)}
    finally:
        cache.close()
        pair.close()
    assert warnings_logged() == []


def test_a_datacenter_tier_takes_and_refills_through_kills(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    """Both of the tier's databases lose every connection: its own (the takes, claims and
    stores) and its upstream's (the refills)."""
    dc, global_url = make_database(backend), make_database(backend)
    upstream = TicketServer(global_url, timeout=TIMEOUT)
    tier = DatacenterTier(dc, upstream, min_block=20, max_block=20, supply=0.001,
                          timeout=TIMEOUT)
    try:
        with _Callers(lambda: tier.next_block("photos", 3)) as callers:
            _kill_while_drawing([dc, global_url], callers)
        assert callers.errors == []
        ids = [i for block in callers.ids for i in block]  # type: ignore[attr-defined]
        assert len(set(ids)) == len(ids)
        assert tier.stats()["failures"] == 0
    finally:
        tier.close()
        upstream.close()
    assert warnings_logged() == []


class _Base(DeclarativeBase):
    pass


class _Photo(_Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("photos"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(40))


def test_the_embedded_default_inserts_through_kills(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    """The application's own connections die too: its engine checks them at checkout
    (``pool_pre_ping``) and its units of work are retried (``retry_session``), as production
    applications do; the library's own connections of the embedded default need neither."""
    url = make_database(backend)
    engine = sa.create_engine(url, pool_pre_ping=True, pool_size=THREADS)
    _Base.metadata.create_all(engine)
    sessions = sessionmaker(engine)

    def insert() -> int:
        def work(session: Session) -> _Photo:
            photo = _Photo(title="t")
            session.add(photo)
            return photo

        return retry_session(sessions, work, attempts=10, backoff=0.01).id

    try:
        with _Callers(insert) as callers:
            # The cache of the embedded default refills after every kill.
            _kill_while_drawing([url], callers,
                                lambda: embedded_source(engine).stats()["round_trips"])
        assert callers.errors == []
        assert len(set(callers.ids)) == len(callers.ids)
        with Session(engine) as session:
            assert session.scalar(sa.select(sa.func.count()).select_from(_Photo)) == len(
                callers.ids)
    finally:
        engine.dispose()
    assert warnings_logged() == []


def _server_with_idle_timeout(backend: str, url: str) -> TicketServer:
    """A server whose idle connections the database closes after about a second."""
    if backend == "postgresql":
        name = make_url(url).database
        admin = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" SET idle_session_timeout = 1000')
        admin.dispose()
        return TicketServer(url, pool_size=THREADS, timeout=TIMEOUT)
    # MariaDB's wait_timeout is the server's; here it is set for the sessions of one engine,
    # whose way of connecting the server inherits.
    engine = sa.create_engine(url, connect_args={"init_command": "SET SESSION wait_timeout = 1"})
    return TicketServer(engine, pool_size=THREADS, timeout=TIMEOUT)


def test_connections_closed_by_the_servers_idle_timeout_cost_nothing(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    url = make_database(backend)
    server = _server_with_idle_timeout(backend, url)
    try:
        for _ in range(2):
            with _Callers(lambda: server.next_id("photos")) as callers:
                callers.wait_calls(4 * THREADS)
            assert callers.errors == []
            # Idle: the server closes every one of them.
            _wait_for(lambda: connections_to(url) == 0, 30, "the idle connections to be closed")
            assert [server.next_id("photos") for _ in range(THREADS)]
    finally:
        server.close()
    assert warnings_logged() == []


@pytest.mark.backend("postgresql")
def test_a_pgbouncer_restart_costs_callers_nothing(
    make_database: Callable[[str], str], backend_admin_url: Callable[[str], str],
    warnings_logged: Callable[[], list[str]],
) -> None:
    url = make_database("postgresql")
    target = make_url(backend_admin_url("postgresql"))
    workdir = Path(tempfile.mkdtemp(prefix="tickets-bouncer-"))
    workdir.chmod(0o755)
    bouncer = start_pgbouncer(workdir, target_host=target.host or "127.0.0.1",
                              target_port=target.port or 5432)
    via = make_url(url).set(host="127.0.0.1", port=bouncer.port).render_as_string(
        hide_password=False)
    server = TicketServer(via, pool_size=THREADS, timeout=TIMEOUT)
    cache = CachedSource(server, min_block=4, max_block=4, timeout=TIMEOUT)
    try:
        for _ in range(2):
            with _Callers(lambda: server.next_id("photos")) as callers:
                callers.wait_calls(4 * THREADS)
            cache.next_id("albums")
            # A refill already under way when the bouncer stops meets a server that is down
            # (refused: a WARNING, rightly): the restart is what is tried here, not an outage.
            _wait_for(lambda: cache.stats()["in_flight"] == 0, 30, "no refill in flight")
            bouncer.stop()
            bouncer.restart()
            assert [server.next_id("photos") for _ in range(2 * THREADS)]
            assert [cache.next_id("albums") for _ in range(20)]
            assert callers.errors == []
        assert cache.stats()["sequences"]["albums/64"]["failures"] == 0
    finally:
        cache.close()
        server.close()
        bouncer.stop()
    assert warnings_logged() == []


def test_a_block_whose_answer_was_lost_is_burned_never_issued(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    """The take ran on the server but its answer never came back (the connection dropped after
    the statement): the call takes another block on a fresh connection. The lost block's ids
    are never handed out, by this process or any other."""
    url = make_database(backend)
    target = make_url(url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=TIMEOUT)
        other = TicketServer(url, timeout=TIMEOUT)
        try:
            first = server.next_block("photos", 10)
            assert list(first) == list(range(1, 11))
            proxy.swallow_reply_after(b"UPDATE")
            second = server.next_block("photos", 10)  # no error reaches the caller
            assert proxy.faults_fired == 1
            assert second.start == 21, "the lost block, 11..20, was handed out"
            later = [i for _ in range(5) for i in server.next_block("photos", 10)]
            later += [i for _ in range(5) for i in other.next_block("photos", 10)]
            assert not set(range(11, 21)) & set(later)
        finally:
            server.close()
            other.close()
    assert warnings_logged() == []


def test_a_connection_closed_during_its_handshake_costs_a_pair_nothing(
    make_database: Callable[[str], str], backend: str, warnings_logged: Callable[[], list[str]]
) -> None:
    """A new connection the server accepted and then closed while connecting (a kill that
    lands on it, a pooler restarting) is not a server down: the call connects again, the pair
    reports both servers up and backs neither off. A server that closes every new connection
    is down, within the call's attempts."""
    urls = [make_database(backend), make_database(backend)]
    target = make_url(urls[0])
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        first = TicketServer(proxy.url(urls[0]), timeout=TIMEOUT)
        pair = TicketServers([first, TicketServer(urls[1], timeout=TIMEOUT)])
        try:
            proxy.drop_new_connections(1)
            ids = [pair.next_id("photos") for _ in range(4)]
            assert proxy.faults_fired == 1
            assert len(set(ids)) == 4
            assert {(s["up"], s["failures"]) for s in pair.status()} == {(True, 0)}
            assert warnings_logged() == []

            kill_connections(urls[0])
            proxy.drop_new_connections(1)  # the pooled connection dead, then the new one
            assert first.next_id("photos") not in ids
            assert proxy.faults_fired == 2

            kill_connections(urls[0])
            proxy.drop_new_connections(100)
            with pytest.raises(TicketServerUnavailable, match="failed to connect"):
                first.next_id("photos")
            assert 2 < proxy.faults_fired < 100
        finally:
            pair.close()


@contextmanager
def _creation_lock_held(url: str) -> Iterator[sa.Connection]:
    """Hold, from a session of the test's own, the lock a creator of ``tickets__photos`` takes
    (:meth:`TicketBackend.creating`): its creation waits for it."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
    table = TicketTable("photos", 64, "tickets__photos")
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                conn.execute(sa.text("SELECT pg_advisory_lock(:c, :k)"),
                             {"c": postgresql_backend._LOCK_CLASS, "k": lock_key(table)})
            else:
                assert conn.execute(sa.text("SELECT GET_LOCK(:n, 10)"),
                                    {"n": mysql_backend._lock_name(table)}).scalar() == 1
            yield conn
    finally:
        engine.dispose()


def _kill_lock_waiters(conn: sa.Connection) -> int:
    """Close, server-side, the sessions waiting for the creation lock; how many."""
    return _kill_sessions(conn, "wait_event = 'advisory'", "info LIKE 'SELECT GET_LOCK%'")


@pytest.mark.parametrize("pair", [False, True], ids=["server", "pair"])
def test_a_connection_closed_while_a_table_is_made_costs_the_caller_nothing(
    make_database: Callable[[str], str], backend: str, pair: bool,
    warnings_logged: Callable[[], list[str]],
) -> None:
    """First contact makes the sequence's table, and the connection making it is closed under
    it (a kill, a reaper): the creation runs again on a fresh connection. The caller gets its
    id, and no server is reported down (before, the call failed, and a pair backed that server
    off: what a pair met when a kill landed on its second server's first contact)."""
    urls = [make_database(backend), make_database(backend)]
    servers = [TicketServer(u, timeout=TIMEOUT) for u in urls]
    source: TicketServer | TicketServers = TicketServers(servers) if pair else servers[0]
    got: list[object] = []
    try:
        with _creation_lock_held(urls[0]) as holder:
            caller = threading.Thread(target=lambda: got.append(_call(source)), name="draw")
            caller.start()
            _wait_for(lambda: _kill_lock_waiters(holder) > 0, 30,
                      "the creator to wait for the lock, and its connection to be killed")
        caller.join(30)
        assert got and not isinstance(got[0], BaseException), got
        if pair:
            assert isinstance(source, TicketServers)
            assert {(s["up"], s["failures"]) for s in source.status()} == {(True, 0)}
    finally:
        for server in servers:
            server.close()
    assert warnings_logged() == []


def _call(source: TicketServer | TicketServers) -> object:
    try:
        return source.next_id("photos")
    except Exception as error:  # what the caller would see
        return error
