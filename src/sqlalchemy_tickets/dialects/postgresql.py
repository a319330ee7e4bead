"""PostgreSQL (psycopg 3): ``UPDATE … RETURNING`` on a one-row table, in autocommit.

psycopg has no client-side read timeout, so a server that accepts and never answers is cut short
by the source's watchdog, which shuts down the connection's socket (see ``socket_fd``).
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import URL

from .base import ReturningBackend, register_backend


@register_backend("postgresql")
class PostgreSQLBackend(ReturningBackend):
    dialect_names = ("postgresql",)

    def engine_options(self, url: URL, timeout: float) -> dict[str, Any]:
        connect_args: dict[str, Any] = {"application_name": "sqlalchemy-tickets"}
        if url.get_driver_name() in ("psycopg", "psycopg2"):
            # libpq counts whole seconds and treats anything under 2 as 2.
            connect_args["connect_timeout"] = max(2, math.ceil(timeout))
        return {"connect_args": connect_args}

    def socket_fd(self, dbapi_connection: Any) -> int | None:
        fileno = getattr(dbapi_connection, "fileno", None)
        return int(fileno()) if fileno is not None else None

    def insert_seed(self, table: sa.Table, row: dict[str, Any]) -> sa.sql.Executable:
        return postgresql.insert(table).values(**row).on_conflict_do_nothing()

    def is_missing_table(self, error: BaseException) -> bool:
        code = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        return code == "42P01"
