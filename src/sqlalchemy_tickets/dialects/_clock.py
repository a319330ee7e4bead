"""The database server's clock, as one SQL expression per dialect.

Everything a datacenter tier or a worker lease shares between processes and hosts (rate samples,
claims, lease expiries) is timed on the database's clock, read in the statement that uses it:
the one clock every process agrees on, whatever its host's clock says.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

__all__ = ["db_now_ms"]


class db_now_ms(FunctionElement[int]):
    """The database server's clock as Unix milliseconds (BIGINT), compiled per dialect."""

    type = sa.BigInteger()
    inherit_cache = True
    name = "db_now_ms"


@compiles(db_now_ms)
def _now_unknown(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    raise sa_exc.CompileError(
        f"the library has no clock expression for the {compiler.dialect.name!r} dialect; "
        "supported: postgresql, mysql, mariadb, sqlite"
    )


@compiles(db_now_ms, "postgresql")
def _now_postgresql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(FLOOR(EXTRACT(EPOCH FROM clock_timestamp()) * 1000) AS BIGINT)"


@compiles(db_now_ms, "mysql")
@compiles(db_now_ms, "mariadb")
def _now_mysql(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"


@compiles(db_now_ms, "sqlite")
def _now_sqlite(element: db_now_ms, compiler: SQLCompiler, **kw: Any) -> str:
    return "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
