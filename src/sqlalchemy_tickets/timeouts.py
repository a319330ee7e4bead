"""Bound every round trip of an application engine, so a hung server becomes a retryable error.

``apply_timeouts(engine, 5.0)`` takes an ``Engine`` or an ``AsyncEngine``: connects, statements,
COMMITs, ROLLBACKs and pings that take longer fail with the driver's connection error, which
:func:`~sqlalchemy_tickets.retry_session` and :func:`~sqlalchemy_tickets.async_retry_session`
retry. How, per driver:

* PyMySQL: its own connect/read/write timeouts; mysqlclient: the same, in whole seconds (the
  bound rounded up).
* psycopg and psycopg2 (synchronous): neither has a client-side read timeout, so their
  connections are made with calls bounded by the library's watchdog, a thread that shuts the
  socket down when a call outlives its deadline; the blocked call then fails at once with a
  connection error. The connect is bounded by libpq's ``connect_timeout`` (whole seconds, at
  least 2).
* asyncio drivers (psycopg async, asyncpg, aiomysql): the connect, handshake included, is bounded
  by ``asyncio.wait_for`` (with SQLAlchemy 2.0.16+; before it, by the driver's own connect
  timeout); then every statement, COMMIT, ROLLBACK and ping arms the same watchdog on the
  connection's socket, through engine events — nothing is cancelled, the connection simply
  dies, is invalidated by SQLAlchemy and replaced by the pool.
* SQLite (pysqlite, aiosqlite): the busy timeout; a file has no network to hang.

Each backend module says where its drivers keep their socket (``socket_fd``) and which drivers
it can bound (``timeout_drivers``); any other driver (pg8000, MariaDB Connector/Python, asyncmy...)
is refused when ``apply_timeouts`` is called, with a message naming it and the supported ones.
"""

from __future__ import annotations

import logging
import re
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, overload

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from ._naming import check_seconds
from .dialects import backend_for
from .dialects._connect import watchdog
from .dialects.base import TicketBackend
from .errors import TicketsError

if TYPE_CHECKING:
    # Annotations only: sqlalchemy.ext.asyncio needs greenlet (the asyncio extra).
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["apply_timeouts"]

logger = logging.getLogger("sqlalchemy_tickets")

_WATCH_KEY = "sqlalchemy_tickets.watch"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


#: ``async_creator_fn`` (what ``create_async_engine(async_creator=...)`` uses) arrived in 2.0.16.
_HAS_ASYNC_CREATOR = _version(sa.__version__) >= (2, 0, 16)


class _Bound:
    """The bound of one engine; applying again changes it in place (no second set of hooks)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


_bounds: weakref.WeakKeyDictionary[Engine, _Bound] = weakref.WeakKeyDictionary()
_bounds_lock = threading.Lock()


@overload
def apply_timeouts(engine: Engine, seconds: float) -> Engine: ...


@overload
def apply_timeouts(engine: AsyncEngine, seconds: float) -> AsyncEngine: ...


def apply_timeouts(engine: Engine | AsyncEngine, seconds: float) -> Engine | AsyncEngine:
    """Give every round trip of ``engine`` (an ``Engine`` or ``AsyncEngine``) a ``seconds``
    bound: a hung server becomes a connection error after that long.

    Calling it again on the same engine changes the bound. A synchronous engine's pooled
    connections are closed first, so the bound holds for all of them; an asyncio engine's are
    kept (their round trips are bounded when they run). Returns ``engine``.

    Raises:
        TicketsError: ``seconds`` is not a positive number, ``engine`` is not an engine, or its
            driver cannot be bounded (the message names the driver and why).
    """
    check_seconds("a timeout", seconds, finite=True)
    sync_engine = engine if isinstance(engine, Engine) else getattr(engine, "sync_engine", None)
    if not isinstance(sync_engine, Engine):
        raise TicketsError(
            f"apply_timeouts takes an Engine or an AsyncEngine, not {type(engine).__name__}"
        )
    backend = backend_for(sync_engine.dialect.name)
    is_async = bool(sync_engine.dialect.is_async)
    # Refuse a driver that cannot be bounded now, not at its first connect.
    backend.check_timeouts(sync_engine.dialect)
    with _bounds_lock:
        bound = _bounds.get(sync_engine)
        if bound is not None:
            bound.seconds = float(seconds)
        else:
            bound = _bounds[sync_engine] = _Bound(float(seconds))
            if is_async:
                _hook_asyncio_engine(sync_engine, backend, bound)
            else:
                _hook_engine(sync_engine, backend, bound)
    if not is_async:
        sync_engine.dispose()
    return engine


def _hook_engine(engine: Engine, backend: TicketBackend, bound: _Bound) -> None:
    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        return backend.connect_with_timeout(dialect, cargs, cparams, bound.seconds)


def _hook_asyncio_engine(engine: Engine, backend: TicketBackend, bound: _Bound) -> None:
    dialect = engine.dialect

    @event.listens_for(engine, "do_connect")
    def connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        creator = backend.async_connect_timeout(dialect, cparams, bound.seconds)
        if creator is not None and _HAS_ASYNC_CREATOR and "async_creator_fn" not in cparams:
            cparams["async_creator_fn"] = _bounded_connect(creator, backend, dialect, bound)

    @event.listens_for(engine, "before_cursor_execute")
    def before(conn: Any, cursor: Any, statement: Any, *args: Any) -> None:
        _arm(conn.info, backend, conn.connection.dbapi_connection, bound.seconds)

    @event.listens_for(engine, "after_cursor_execute")
    def after(conn: Any, cursor: Any, statement: Any, *args: Any) -> None:
        _disarm(conn.info)

    @event.listens_for(engine, "handle_error")
    def failed(context: Any) -> None:
        if context.connection is not None:
            _disarm(context.connection.info)

    # COMMIT, ROLLBACK (also the pool's reset on return), pings and a graceful close (asyncpg
    # waits for the server's goodbye) go through the dialect, not a cursor: bound them on this
    # engine's own dialect instance.
    for name in ("do_commit", "do_rollback", "do_ping", "do_close"):
        setattr(dialect, name, _bounded_call(getattr(dialect, name), backend, bound))


def _arm(
    info: dict[Any, Any], backend: TicketBackend, dbapi_connection: Any, seconds: float
) -> None:
    _disarm(info)
    fd = backend.socket_fd(dbapi_connection)
    if fd is not None:  # None: the connection is closed already, the call fails by itself
        info[_WATCH_KEY] = watchdog.arm(fd, seconds)


def _disarm(info: dict[Any, Any]) -> None:
    token = info.pop(_WATCH_KEY, None)
    if token is not None:
        watchdog.disarm(token)


def _bounded_call(
    call: Callable[..., Any], backend: TicketBackend, bound: _Bound
) -> Callable[..., Any]:
    def bounded(dbapi_connection: Any, *args: Any, **kwargs: Any) -> Any:
        fd = backend.socket_fd(dbapi_connection)
        token = watchdog.arm(fd, bound.seconds) if fd is not None else None
        try:
            return call(dbapi_connection, *args, **kwargs)
        finally:
            if token is not None:
                watchdog.disarm(token)

    return bounded


def _bounded_connect(
    creator: Callable[..., Awaitable[Any]], backend: TicketBackend, dialect: Any, bound: _Bound
) -> Callable[..., Awaitable[Any]]:
    seconds = bound.seconds

    async def connect(*args: Any, **kwargs: Any) -> Any:
        import asyncio

        try:
            return await asyncio.wait_for(creator(*args, **kwargs), seconds)
        except asyncio.TimeoutError as error:
            raise backend.connect_timeout_error(
                dialect.loaded_dbapi,
                f"{dialect.name}+{dialect.driver}: no connection within {seconds:g} s "
                "(apply_timeouts)",
            ) from error

    return connect
