"""retry_session through a real TCP proxy in front of real PostgreSQL and MariaDB servers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
import tenacity
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import (
    Session,
    sessionmaker,
)

from sqlalchemy_tickets import (
    CommitOutcomeUnknownError,
    apply_timeouts,
    async_retry_session,
    retry_session,
)
from support.proxy import TcpProxy
from support.retry_rig import (
    ASYNC_DRIVERS,
    BACKENDS,
    COMMIT,
    Base,
    Child,
    Member,
    Parent,
    behind_proxy,
)

pytestmark = pytest.mark.backend(*BACKENDS)


@dataclass
class Rig:
    url: str  # direct
    proxy: TcpProxy
    engine: sa.Engine  # through the proxy
    factory: sessionmaker[Session]
    commit: bytes

    def count(self, model: type[Base]) -> int:
        direct = sa.create_engine(self.url)
        with direct.connect() as conn:
            n = conn.scalar(sa.select(sa.func.count()).select_from(model))
        direct.dispose()
        return int(n or 0)


@pytest.fixture
def rig(backend: str, make_database) -> Iterator[Rig]:
    url = make_database(backend)
    with behind_proxy(url) as proxy:
        engine = sa.create_engine(proxy.url(url))
        try:
            yield Rig(
                url, proxy, engine, sessionmaker(engine, expire_on_commit=False), COMMIT[backend]
            )
        finally:
            engine.dispose()


def no_sleep(seconds: float) -> None:
    pass


def test_lost_commit_reply_of_one_object(rig: Rig) -> None:
    calls = []

    def work(session: Session) -> str:
        calls.append(1)
        session.add(Parent(name="one"))
        return "done"

    rig.proxy.swallow_reply_after(rig.commit)
    assert retry_session(rig.factory, work, sleep=no_sleep) == "done"
    assert rig.proxy.faults_fired == 1
    assert len(calls) == 1  # replayed, not re-run
    assert rig.count(Parent) == 1


def test_lost_commit_reply_of_a_graph_with_foreign_keys(rig: Rig) -> None:
    made: list[Parent] = []

    def work(session: Session) -> None:
        for i in range(20):
            parent = Parent(name=f"p{i}", children=[Child() for _ in range(3)])
            made.append(parent)
            session.add(parent)

    rig.proxy.swallow_reply_after(rig.commit)
    retry_session(rig.factory, work, sleep=no_sleep)
    assert rig.proxy.faults_fired == 1
    assert rig.count(Parent) == 20 and rig.count(Child) == 60
    direct = sa.create_engine(rig.url)
    with direct.connect() as conn:
        pairs = set(conn.execute(sa.select(Child.__table__.c.id, Child.__table__.c.parent_id)))
    direct.dispose()
    assert pairs == {(c.id, p.id) for p in made for c in p.children}


def test_a_graph_nobody_kept_is_rebuilt_for_the_replay(rig: Rig) -> None:
    # The caller keeps no reference: after the flush the objects are gone, and the replay
    # rebuilds them from what was flushed, foreign keys included.
    def work(session: Session) -> None:
        for i in range(5):
            session.add(Parent(name=f"lost{i}", children=[Child() for _ in range(3)]))

    rig.proxy.swallow_reply_after(rig.commit)
    retry_session(rig.factory, work, sleep=no_sleep)
    assert rig.proxy.faults_fired == 1
    assert rig.count(Parent) == 5 and rig.count(Child) == 15
    direct = sa.create_engine(rig.url)
    with direct.connect() as conn:
        orphans = conn.scalar(
            sa.select(sa.func.count())
            .select_from(Child.__table__)
            .where(Child.__table__.c.parent_id.not_in(sa.select(Parent.__table__.c.id)))
        )
    direct.dispose()
    assert orphans == 0


def test_two_hundred_lost_replies_in_a_row(rig: Rig) -> None:
    ids = []
    for i in range(200):
        rig.proxy.swallow_reply_after(rig.commit)
        parent = Parent(name=f"t{i}")

        def work(session: Session, parent: Parent = parent) -> int:
            session.add(parent)
            return 0

        retry_session(rig.factory, work, sleep=no_sleep)
        ids.append(parent.id)
    assert rig.proxy.faults_fired == 200
    assert rig.count(Parent) == 200  # exactly: no duplicate, none lost
    assert len(set(ids)) == 200


def test_server_refusing_connections_then_back(rig: Rig) -> None:
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        session.add(Parent(name="patient"))

    rig.proxy.refuse()
    threading.Timer(1.5, rig.proxy.forward).start()
    started = time.monotonic()
    retry_session(rig.factory, work, attempts=20, backoff=0.1, max_backoff=0.4)
    assert time.monotonic() - started >= 1.0  # it really waited the outage out
    assert len(calls) >= 2
    assert rig.count(Parent) == 1


def test_hung_server_times_out_and_is_retried(rig: Rig) -> None:
    apply_timeouts(rig.engine, 1.0)
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        session.add(Parent(name="hung"))

    def back_after_the_first_failure(state: object) -> float:
        # The server answers again once an attempt has failed on the hang (not at a time
        # that a loaded machine could reach before the attempt's own timeout).
        rig.proxy.forward()
        return 0.2

    with rig.factory() as warm:  # a pooled connection, established before the hang
        warm.execute(sa.select(1))
    rig.proxy.hang()
    started = time.monotonic()
    retry_session(rig.factory, work, attempts=10, wait=back_after_the_first_failure)
    assert time.monotonic() - started >= 1.0
    assert len(calls) >= 2
    assert rig.count(Parent) == 1


def test_a_real_constraint_violation_is_raised_at_once_with_nothing_written(rig: Rig) -> None:
    with rig.factory() as session:
        session.add(Member(email="taken@example.com"))
        session.commit()
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        session.add(Parent(name="innocent"))
        session.add(Member(email="taken@example.com"))

    with pytest.raises(sa.exc.IntegrityError):
        retry_session(rig.factory, work, sleep=no_sleep)
    assert len(calls) == 1
    assert rig.count(Parent) == 0 and rig.count(Member) == 1


def test_an_error_in_work_is_raised_at_once(rig: Rig) -> None:
    calls = []

    def work(session: Session) -> None:
        calls.append(1)
        session.add(Parent(name="never"))
        raise KeyError("bug")

    with pytest.raises(KeyError):
        retry_session(rig.factory, work, sleep=no_sleep)
    assert len(calls) == 1 and rig.count(Parent) == 0


def test_an_update_whose_commit_reply_is_lost_is_refused(rig: Rig) -> None:
    with rig.factory() as session:
        session.add(Parent(name="before"))
        session.commit()

    def work(session: Session) -> None:
        parent = session.scalars(sa.select(Parent)).one()
        parent.name = "after"

    rig.proxy.swallow_reply_after(rig.commit)
    with pytest.raises(CommitOutcomeUnknownError, match="may or may not have been applied"):
        retry_session(rig.factory, work, sleep=no_sleep)
    assert rig.proxy.faults_fired == 1


def test_decorator_and_tenacity_strategies(rig: Rig) -> None:
    @retry_session(rig.factory, stop=tenacity.stop_after_attempt(3), wait=tenacity.wait_fixed(0))
    def add(session: Session) -> str:
        session.add(Parent(name="decorated"))
        return "ok"

    rig.proxy.swallow_reply_after(rig.commit)
    assert add() == "ok"
    assert rig.proxy.faults_fired == 1 and rig.count(Parent) == 1


def test_async_lost_commit_reply_and_violation(make_database, backend: str) -> None:
    url = make_database(backend)
    with behind_proxy(url) as proxy:
        async_url = sa.engine.make_url(proxy.url(url)).set(drivername=ASYNC_DRIVERS[backend])

        async def main() -> tuple[int, int]:
            engine = create_async_engine(async_url)
            factory = async_sessionmaker(engine, expire_on_commit=False)
            calls = []

            async def work(session) -> str:  # type: ignore[no-untyped-def]
                calls.append(1)
                session.add_all([Parent(name=f"a{i}", children=[Child()]) for i in range(5)])
                return "ok"

            proxy.swallow_reply_after(COMMIT[backend])
            assert await async_retry_session(factory, work, sleep=_no_async_sleep) == "ok"
            assert len(calls) == 1

            async def clash(session) -> None:  # type: ignore[no-untyped-def]
                calls.append(1)
                session.add(Member(email="x@example.com"))
                session.add(Member(email="x@example.com"))

            with pytest.raises(sa.exc.IntegrityError):
                await async_retry_session(factory, clash, sleep=_no_async_sleep)
            assert len(calls) == 2
            async with factory() as session:
                parents = await session.scalar(sa.select(sa.func.count()).select_from(Parent))
                members = await session.scalar(sa.select(sa.func.count()).select_from(Member))
            await engine.dispose()
            return int(parents or 0), int(members or 0)

        parents, members = asyncio.run(main())
        assert proxy.faults_fired == 1
        assert parents == 5 and members == 0


async def _no_async_sleep(seconds: float) -> None:
    pass
