"""apply_timeouts on asyncio engines: a hung server (the proxy accepts and never answers) becomes
a retryable error after about the bound, for psycopg async, asyncpg and aiomysql.

Every wait in these tests is guarded by ``asyncio.wait_for(..., GUARD)``: without the bound the
test fails with the guard's timeout instead of hanging.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import (
    TicketId,
    TicketsError,
    apply_timeouts,
    async_retry_session,
    is_retryable,
)
from support.proxy import TcpProxy
from support.retry_rig import behind_proxy

pytest.importorskip("sqlalchemy.ext.asyncio")

BOUND = 1.0
#: Far above the bound, far below pytest's timeout: reaching it means the bound did not hold.
GUARD = 30.0
DRIVERS = {
    "psycopg_async": ("postgresql", "postgresql+psycopg"),
    "asyncpg": ("postgresql", "postgresql+asyncpg"),
    "aiomysql": ("mysql", "mysql+aiomysql"),
}


class Base(DeclarativeBase):
    pass


class Row(Base):
    __tablename__ = "rows"
    id: Mapped[int] = mapped_column(TicketId("rows"), primary_key=True)
    note: Mapped[str] = mapped_column(sa.String(40))


@dataclass
class Rig:
    url: str  # direct, synchronous driver
    async_url: sa.engine.URL  # through the proxy, asyncio driver
    proxy: TcpProxy

    def count(self) -> int:
        direct = sa.create_engine(self.url)
        try:
            with direct.connect() as conn:
                return int(conn.scalar(sa.select(sa.func.count()).select_from(Row)) or 0)
        finally:
            direct.dispose()


@pytest.fixture(params=sorted(DRIVERS))
def rig(request: pytest.FixtureRequest, make_database: Callable[[str], str]) -> Iterator[Rig]:
    pytest.importorskip(request.param.split("_")[0])
    backend, drivername = DRIVERS[request.param]
    url = make_database(backend)
    with behind_proxy(url, Base.metadata) as proxy:
        async_url = sa.engine.make_url(proxy.url(url)).set(drivername=drivername)
        yield Rig(url, async_url, proxy)


def run(coro: Any) -> Any:
    async def guarded() -> Any:
        return await asyncio.wait_for(coro, GUARD)

    return asyncio.run(guarded())


async def timed_failure(call: Callable[[], Any]) -> tuple[BaseException, float]:
    started = time.monotonic()
    try:
        await call()
    except Exception as error:  # the error the bound produced
        return error, time.monotonic() - started
    raise AssertionError("the hung call succeeded")


async def fails_when_hung(
    rig: Rig,
    engine: Any,
    action: Callable[[Any], Awaitable[Any]],
    first: sa.Executable | None = None,
) -> tuple[BaseException, float]:
    """On a connection made before the hang (its first statement ``first``, default
    ``SELECT 1``), hang the proxy and time ``action(conn)`` until it fails; the proxy forwards
    again and ``engine`` is disposed whatever happens."""
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.select(1) if first is None else first)
            rig.proxy.hang()
            return await timed_failure(lambda: action(conn))
    finally:
        rig.proxy.forward()
        await engine.dispose()


def check_bounded(error: BaseException, elapsed: float) -> None:
    assert isinstance(error, sa.exc.DBAPIError), repr(error)
    assert is_retryable(error), repr(error)
    assert BOUND * 0.9 <= elapsed < GUARD / 2, elapsed


def test_connect_to_a_hung_server(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[BaseException, float]:
        engine = apply_timeouts(create_async_engine(rig.async_url), BOUND)
        rig.proxy.hang()
        try:

            async def connect() -> None:
                async with engine.connect() as conn:
                    await conn.execute(sa.select(1))

            return await timed_failure(connect)
        finally:
            rig.proxy.forward()
            await engine.dispose()

    error, elapsed = run(main())
    check_bounded(error, elapsed)


def test_statement_on_a_pooled_connection_then_the_pool_recovers(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[BaseException, float, int]:
        engine = apply_timeouts(create_async_engine(rig.async_url, pool_size=1), BOUND)
        try:
            async with engine.connect() as conn:  # established before the hang
                await conn.execute(sa.select(1))
            rig.proxy.hang()

            async def query() -> None:
                async with engine.connect() as conn:
                    await conn.execute(sa.select(sa.func.count()).select_from(Row))

            error, elapsed = await timed_failure(query)
            rig.proxy.forward()
            async with engine.connect() as conn:  # the cut connection was replaced
                value = (await conn.execute(sa.select(42))).scalar_one()
            return error, elapsed, value
        finally:
            await engine.dispose()

    error, elapsed, value = run(main())
    check_bounded(error, elapsed)
    assert value == 42


def test_commit_to_a_hung_server(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[BaseException, float]:
        engine = apply_timeouts(create_async_engine(rig.async_url), BOUND)
        insert = sa.insert(Row).values(id=1, note="never committed")
        return await fails_when_hung(rig, engine, lambda conn: conn.commit(), first=insert)

    error, elapsed = run(main())
    check_bounded(error, elapsed)
    # Whether the row is there is unknown by nature: the proxy delivers the COMMIT it held
    # once it forwards again, as a server that recovers would apply it.


def test_async_retry_session_waits_a_hang_out(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

    pauses: list[float] = []

    async def lift_the_hang(seconds: float) -> None:
        pauses.append(seconds)
        rig.proxy.forward()

    async def work(session: AsyncSession) -> Row:
        row = Row(note="patient")
        session.add(row)
        return row

    async def main() -> Row:
        engine = apply_timeouts(create_async_engine(rig.async_url), BOUND)
        try:
            async with engine.connect() as conn:
                await conn.execute(sa.select(1))
            rig.proxy.hang()
            return await async_retry_session(
                async_sessionmaker(engine), work, sleep=lift_the_hang
            )
        finally:
            await engine.dispose()

    row = run(main())
    assert len(pauses) == 1
    assert row.note == "patient" and row.id > 0
    assert rig.count() == 1


def test_the_sync_engine_of_an_async_engine_is_bounded_too(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[BaseException, float]:
        engine = create_async_engine(rig.async_url)
        assert apply_timeouts(engine.sync_engine, BOUND) is engine.sync_engine
        return await fails_when_hung(rig, engine, lambda conn: conn.execute(sa.select(2)))

    error, elapsed = run(main())
    check_bounded(error, elapsed)


def test_applying_again_changes_the_bound(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> tuple[BaseException, float]:
        engine = apply_timeouts(create_async_engine(rig.async_url), GUARD)
        apply_timeouts(engine, BOUND)
        return await fails_when_hung(rig, engine, lambda conn: conn.execute(sa.select(2)))

    error, elapsed = run(main())
    check_bounded(error, elapsed)


def test_an_unknown_asyncio_driver_is_refused_by_name() -> None:
    from sqlalchemy_tickets.dialects import backend_for

    dialect = sa.dialects.registry.load("mysql.asyncmy")()
    with pytest.raises(TicketsError, match=r"mysql\+asyncmy: .*socket"):
        backend_for("mysql").async_connect_timeout(dialect, {}, 1.0)


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), True, "5"])
def test_bad_bounds_are_refused(seconds: Any) -> None:
    engine = sa.create_engine("sqlite://")
    with pytest.raises(TicketsError, match="positive number of seconds"):
        apply_timeouts(engine, seconds)


def test_not_an_engine_is_refused() -> None:
    with pytest.raises(TicketsError, match="Engine or an AsyncEngine"):
        apply_timeouts("sqlite://", 5)  # type: ignore[call-overload]


def test_an_unknown_sync_driver_is_refused_by_name() -> None:
    from sqlalchemy_tickets.dialects import backend_for

    dialect = sa.dialects.registry.load("postgresql.pg8000")()
    with pytest.raises(TicketsError, match=r"postgresql\+pg8000: .*socket"):
        backend_for("postgresql").connect_with_timeout(dialect, [], {}, 1.0)


def test_dispose_with_a_pooled_connection_to_a_hung_server(rig: Rig) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    async def main() -> float:
        engine = apply_timeouts(create_async_engine(rig.async_url), BOUND)
        async with engine.connect() as conn:
            await conn.execute(sa.select(1))
        rig.proxy.hang()
        started = time.monotonic()
        try:
            await engine.dispose()  # closes the pooled connection: a goodbye nobody answers
        finally:
            rig.proxy.forward()
        return time.monotonic() - started

    assert run(main()) < GUARD / 2
