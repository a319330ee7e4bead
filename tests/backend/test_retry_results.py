"""What ``work`` returns can be read after ``retry_session`` returns, on every path it can take.

Each path is produced by the real TCP proxy in front of real PostgreSQL and MariaDB servers:

* ``no_fault``: nothing goes wrong;
* ``rerun``: the connection dies during the flush (before COMMIT is sent): ``work`` runs again;
* ``replay``: the connection dies after the flush, so the COMMIT never reaches the server: the
  same objects are inserted again without calling ``work``;
* ``verified_replay``: the COMMIT is applied but its reply is lost: the replay meets its own
  keys and checks that every row is stored.

The session factories are plain ``sessionmaker(engine)`` / ``async_sessionmaker(engine)``, which
expire everything on commit: the case of a user who did not think about it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Session,
    mapped_column,
    sessionmaker,
)

from sqlalchemy_tickets import async_retry_session, retry_session
from support.proxy import TcpProxy
from support.retry_rig import ASYNC_DRIVERS, BACKENDS, COMMIT, Child, Parent, behind_proxy

INSERT_PARENTS = b"INSERT INTO parents"
PATHS = ["no_fault", "rerun", "replay", "verified_replay"]
#: How many times ``work`` runs on each path.
WORK_CALLS = {"no_fault": 1, "rerun": 2, "replay": 1, "verified_replay": 1}
VERIFIED = "the lost commit had been applied"

pytestmark = pytest.mark.backend(*BACKENDS)


@dataclass
class Fault:
    """Arms the proxy for one path; ``sleep`` is the retry's pause (it never waits)."""

    path: str
    proxy: TcpProxy
    backend: str
    pauses: list[float] = field(default_factory=list)

    def arm(self) -> None:
        if self.path == "rerun":
            self.proxy.swallow_reply_after(INSERT_PARENTS)
        elif self.path == "verified_replay":
            self.proxy.swallow_reply_after(COMMIT[self.backend])

    def in_work(self, session: Session) -> None:
        """Called by ``work`` with the (sync) session of the attempt."""
        if self.path == "replay" and not self.pauses:
            # Once the flush is done, the server goes away: the COMMIT cannot reach it.
            event.listen(session, "after_flush_postexec", self._refuse, once=True)

    def _refuse(self, session: Session, flush_context: Any) -> None:
        self.proxy.refuse()

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.proxy.forward()

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def check(self, caplog: pytest.LogCaptureFixture) -> None:
        expected_faults = 1 if self.path in ("rerun", "verified_replay") else 0
        assert self.proxy.faults_fired == expected_faults
        assert len(self.pauses) == (0 if self.path == "no_fault" else 1)
        verified = any(VERIFIED in r.getMessage() for r in caplog.records)
        assert verified == (self.path == "verified_replay")


def stored(url: str) -> dict[int, tuple[str, list[tuple[int, str]]]]:
    """Every parent row with its children, read directly (not through the proxy)."""
    direct = sa.create_engine(url)
    try:
        with direct.connect() as conn:
            parents = conn.execute(sa.select(Parent.__table__.c.id, Parent.__table__.c.name))
            result = {pid: (name, []) for pid, name in parents}
            children = Child.__table__
            for cid, pid, label in conn.execute(
                sa.select(children.c.id, children.c.parent_id, children.c.label).order_by(
                    children.c.id
                )
            ):
                result[pid][1].append((cid, label))
    finally:
        direct.dispose()
    return result


def as_read(parents: list[Parent]) -> dict[int, tuple[str, list[tuple[int, str]]]]:
    """The returned objects read after the retry returned: raises if anything was expired."""
    for parent in parents:
        assert sa.inspect(parent).detached
    return {
        p.id: (p.name, sorted((c.id, c.label) for c in p.children if c.parent_id == p.id))
        for p in parents
    }


@dataclass
class Server:
    url: str
    backend: str
    proxy: TcpProxy


@pytest.fixture
def server(backend: str, make_database: Callable[[str], str]) -> Iterator[Server]:
    url = make_database(backend)
    with behind_proxy(url) as proxy:
        yield Server(url, backend, proxy)


def make_graph(names: list[str]) -> list[Parent]:
    return [
        Parent(name=name, children=[Child(label=f"{name}/{i}") for i in range(3)]) for name in names
    ]


@pytest.mark.parametrize("path", PATHS)
def test_returned_objects_are_readable(
    server: Server, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sqlalchemy_tickets")
    engine = sa.create_engine(server.proxy.url(server.url))
    fault = Fault(path, server.proxy, server.backend)
    calls: list[int] = []

    def work(session: Session) -> list[Parent]:
        calls.append(1)
        fault.in_work(session)
        parents = make_graph(["ada", "bob"])
        session.add_all(parents)
        return parents

    try:
        fault.arm()
        parents = retry_session(sessionmaker(engine), work, sleep=fault.sleep)
    finally:
        engine.dispose()
    fault.check(caplog)
    assert len(calls) == WORK_CALLS[path]
    assert as_read(parents) == stored(server.url)
    assert len(stored(server.url)) == 2


def test_decorator_passes_arguments_and_returns_readable_objects(server: Server) -> None:
    engine = sa.create_engine(server.proxy.url(server.url))

    @retry_session(sessionmaker(engine), sleep=lambda seconds: None)
    def add(session: Session, name: str, *, children: int) -> Parent:
        parent = Parent(name=name, children=[Child(label=str(i)) for i in range(children)])
        session.add(parent)
        return parent

    try:
        server.proxy.swallow_reply_after(COMMIT[server.backend])
        parent = add("carol", children=2)
    finally:
        engine.dispose()
    assert server.proxy.faults_fired == 1
    assert parent.name == "carol" and len(parent.children) == 2
    assert as_read([parent]) == stored(server.url)


# -- asyncio ------------------------------------------------------------------------------------


def async_url(server: Server) -> sa.engine.URL:
    return sa.engine.make_url(server.proxy.url(server.url)).set(
        drivername=ASYNC_DRIVERS[server.backend]
    )


@pytest.mark.parametrize("path", PATHS)
def test_async_returned_objects_are_readable(
    server: Server, path: str, caplog: pytest.LogCaptureFixture
) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

    caplog.set_level(logging.INFO, logger="sqlalchemy_tickets")
    fault = Fault(path, server.proxy, server.backend)
    calls: list[int] = []

    async def work(session: AsyncSession) -> list[Parent]:
        calls.append(1)
        fault.in_work(session.sync_session)
        parents = make_graph(["ada", "bob"])
        session.add_all(parents)
        return parents

    async def main() -> list[Parent]:
        engine = create_async_engine(async_url(server))
        try:
            fault.arm()
            return await async_retry_session(
                async_sessionmaker(engine), work, sleep=fault.async_sleep
            )
        finally:
            await engine.dispose()

    parents = asyncio.run(main())
    fault.check(caplog)
    assert len(calls) == WORK_CALLS[path]
    assert as_read(parents) == stored(server.url)
    assert len(stored(server.url)) == 2


def test_async_decorator(server: Server) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

    async def main() -> tuple[Parent, Parent]:
        engine = create_async_engine(async_url(server))

        async def no_sleep(seconds: float) -> None:
            pass

        @async_retry_session(async_sessionmaker(engine), sleep=no_sleep)
        async def add(session: AsyncSession, name: str) -> Parent:
            parent = Parent(name=name, children=[Child(label="only")])
            session.add(parent)
            return parent

        try:
            first = await add("dora")
            server.proxy.swallow_reply_after(COMMIT[server.backend])
            second = await add("eve")
        finally:
            await engine.dispose()
        return first, second

    first, second = asyncio.run(main())
    assert server.proxy.faults_fired == 1
    assert (first.name, second.name) == ("dora", "eve")
    assert as_read([first, second]) == stored(server.url)


# -- a worker-lease database that is down -------------------------------------------------------


def test_a_lease_outage_is_waited_out(make_database: Callable[[str], str]) -> None:
    from sqlalchemy_tickets import SnowflakeId

    lease_url = make_database("postgresql")
    target = sa.engine.make_url(lease_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:

        class Base2(DeclarativeBase):
            pass

        class Event(Base2):
            __tablename__ = "events"
            id: Mapped[int] = mapped_column(
                SnowflakeId(worker_lease=proxy.url(lease_url), lease_namespace="retry-test"),
                primary_key=True,
            )

        app = sa.create_engine("sqlite://")
        Base2.metadata.create_all(app)
        pauses: list[float] = []

        def sleep(seconds: float) -> None:
            pauses.append(seconds)
            proxy.forward()

        def work(session: Session) -> Event:
            row = Event()
            session.add(row)
            return row

        proxy.refuse()
        try:
            row = retry_session(sessionmaker(app), work, sleep=sleep)
        finally:
            generator = Event.__table__.c.id.type.generator
            if generator is not None:
                generator.close()
            app.dispose()
        assert len(pauses) == 1
        assert row.id > 0
