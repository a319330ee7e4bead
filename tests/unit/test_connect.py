"""The library's own connections on SQLite files: inherited from the application's engine,
apart from its pool, and never changing how the application connects (no server needed; the
PostgreSQL, MariaDB and PgBouncer cases are in ``tests/backend/test_connections.py``)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from sqlalchemy_tickets import TicketsError, TicketServer
from sqlalchemy_tickets.dialects._connect import OwnEngine
from sqlalchemy_tickets.sources.default import embedded_source
from sqlalchemy_tickets.sources.lease import WorkerLease


def _hooked(url: str) -> tuple[sa.Engine, list[str]]:
    engine = sa.create_engine(url)
    calls: list[str] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        calls.append(str(cargs[0]))

    return engine, calls


def test_a_hook_of_the_application_makes_the_ticket_servers_connections(tmp_path: Path) -> None:
    engine, calls = _hooked(f"sqlite:///{tmp_path / 'app.db'}")
    server = TicketServer(engine)
    try:
        assert server.own.inherits
        assert server.next_block("photos", 3) == range(1, 4)
        assert calls and all(path.endswith("app.db") for path in calls)
        assert engine.pool.checkedout() == 0
    finally:
        server.close()
        engine.dispose()


def test_a_hook_added_afterwards_is_honoured_too(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    server = TicketServer(engine)
    later: list[str] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        later.append("called")

    try:
        server.next_id("photos")
        assert later
    finally:
        server.close()
        engine.dispose()


def test_a_hook_that_makes_the_connection_itself_is_used(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    engine = sa.create_engine(f"sqlite:///{path}")
    made: list[sqlite3.Connection] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> Any:
        made.append(sqlite3.connect(str(path), check_same_thread=False))
        return made[-1]

    server = TicketServer(engine)
    try:
        assert server.next_id("photos") == 1
        assert made
    finally:
        server.close()
        engine.dispose()


def test_an_application_creator_is_used(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    made: list[sqlite3.Connection] = []

    def creator() -> sqlite3.Connection:
        made.append(sqlite3.connect(str(path), check_same_thread=False))
        return made[-1]

    engine = sa.create_engine("sqlite://", creator=creator)
    server = TicketServer(engine)
    try:
        assert server.next_id("photos") == 1
        assert made
        assert path.exists()  # the creator's file, not the URL's memory database
    finally:
        server.close()
        engine.dispose()


def test_the_application_connects_as_before(tmp_path: Path) -> None:
    """The listener the library adds runs the application's hooks once per connection and
    leaves the application's own arguments alone."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    seen: list[dict[str, Any]] = []

    @event.listens_for(engine, "do_connect")
    def hook(dialect: Any, record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        seen.append(dict(cparams))

    server = TicketServer(engine, timeout=1.5)
    try:
        server.next_id("photos")
        library = len(seen)
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
        assert len(seen) == library + 1
        assert "timeout" not in seen[-1]  # the library's busy timeout is not the application's
    finally:
        server.close()
        engine.dispose()


def test_an_async_engine_lends_its_url_on_the_synchronous_driver(tmp_path: Path) -> None:
    pytest.importorskip("aiosqlite")
    pytest.importorskip("greenlet")
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'app.db'}")
    server = TicketServer(engine)
    try:
        assert server.url.drivername == "sqlite+pysqlite"
        assert not server.own.inherits
        assert server.next_id("photos") == 1
    finally:
        server.close()


def test_the_embedded_default_on_sqlite_uses_the_sibling_file(tmp_path: Path) -> None:
    engine, calls = _hooked(f"sqlite:///{tmp_path / 'app.db'}")
    source = embedded_source(engine)
    try:
        source.next_id("photos")
        server = source.source
        assert isinstance(server, TicketServer)
        assert not server.own.inherits  # a second writer cannot share the application's file
        assert str(server.url.database).endswith("app.db-tickets")
        assert calls == []
    finally:
        source.close()
        engine.dispose()


def test_worker_leases_inherit_too(tmp_path: Path) -> None:
    engine, calls = _hooked(f"sqlite:///{tmp_path / 'app.db'}")
    lease = WorkerLease(engine, namespace="unit")
    try:
        grant = lease.acquire(4)
        assert lease.renew(grant, 1)
        assert lease.own.inherits and calls
    finally:
        lease.close()
        engine.dispose()


@pytest.mark.parametrize("timeout", [0, -1, True, "2", float("nan")])
def test_a_bad_timeout_is_refused(timeout: Any) -> None:
    with pytest.raises(TicketsError, match="timeout"):
        OwnEngine("sqlite://", timeout=timeout)
