"""PostgreSQL (psycopg 3): ``UPDATE … RETURNING`` on a one-row table, in autocommit.

psycopg has no client-side read timeout, so a server that accepts and never answers is cut short
by the source's watchdog, which shuts down the connection's socket (see ``socket_fd``).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Awaitable, Callable
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL, Dialect

from .base import ReturningBackend, register_backend, transport_fd

_RETRYABLE_STATES = frozenset({"40001", "40P01", "57014", "57P01", "57P02", "57P03"})
#: Where the errors of the supported drivers are defined (SQLAlchemy's asyncpg adapter defines
#: its own DBAPI error classes).
_DRIVER_MODULES = ("psycopg", "psycopg2", "asyncpg", "sqlalchemy.dialects.postgresql.asyncpg")


@register_backend("postgresql")
class PostgreSQLBackend(ReturningBackend):
    sync_drivername = "postgresql+psycopg"

    def connect_with_timeout(
        self, dialect: Dialect, cargs: Any, cparams: dict[str, Any], seconds: float
    ) -> Any:
        if dialect.driver != "psycopg" or dialect.is_async:
            return super().connect_with_timeout(dialect, cargs, cparams, seconds)
        from ._psycopg_timed import timed_connect

        cparams.setdefault("connect_timeout", max(2, math.ceil(seconds)))
        return timed_connect(cargs, cparams, seconds)

    def engine_options(self, url: URL, timeout: float) -> dict[str, Any]:
        connect_args: dict[str, Any] = {"application_name": "sqlalchemy-tickets"}
        if url.get_driver_name() in ("psycopg", "psycopg2"):
            # libpq counts whole seconds and treats anything under 2 as 2.
            connect_args["connect_timeout"] = max(2, math.ceil(timeout))
        return {"connect_args": connect_args}

    def socket_fd(self, dbapi_connection: Any) -> int | None:
        # SQLAlchemy's asyncio adapters hold the driver's connection as driver_connection.
        conn = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        fileno = getattr(conn, "fileno", None)  # psycopg (sync and async), psycopg2
        if fileno is not None:
            return int(fileno())
        # asyncpg keeps no public handle on its socket; its asyncio transport has one.
        return transport_fd(getattr(conn, "_transport", None))

    def async_connect_timeout(
        self, dialect: Dialect, cparams: dict[str, Any], seconds: float
    ) -> Callable[..., Awaitable[Any]] | None:
        if dialect.driver == "psycopg":
            import psycopg

            # libpq counts whole seconds and treats anything under 2 as 2.
            cparams.setdefault("connect_timeout", max(2, math.ceil(seconds)))
            return psycopg.AsyncConnection.connect
        if dialect.driver == "asyncpg":
            asyncpg = importlib.import_module("asyncpg")  # untyped: no stubs to check against
            cparams.setdefault("timeout", seconds)
            return cast("Callable[..., Awaitable[Any]]", asyncpg.connect)
        return super().async_connect_timeout(dialect, cparams, seconds)

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        return postgresql.insert(table).values(**row).on_conflict_do_nothing()

    def is_retryable(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if code is not None:
            # 40001 serialization failure, 40P01 deadlock, 57014 statement timeout,
            # 57P01-57P03 server shutting down / starting, 08xxx connection exceptions.
            return code in _RETRYABLE_STATES or code.startswith("08")
        # No SQLSTATE: the connection itself failed (closed, reset, cut by a timeout).
        return type(error).__name__ in ("OperationalError", "InterfaceError") and (
            type(error).__module__.startswith(_DRIVER_MODULES)
        )

    def is_missing_table(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        return code == "42P01"
