"""psycopg connections whose every round trip is bounded by the watchdog.

psycopg waits on its socket without a deadline; these subclasses arm the library's watchdog
around each call that waits for the server (execute, executemany, commit, rollback).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import psycopg

from .._watchdog import watchdog

R = TypeVar("R")


def _bounded(conn: TimedConnection, call: Callable[[], R]) -> R:
    token = watchdog.arm(conn.fileno(), conn.tickets_timeout)
    try:
        return call()
    finally:
        watchdog.disarm(token)


class TimedCursor(psycopg.Cursor[Any]):
    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        conn: Any = self.connection
        return _bounded(conn, lambda: super(TimedCursor, self).execute(query, params, **kw))

    def executemany(self, query: Any, params_seq: Any, **kw: Any) -> None:
        conn: Any = self.connection
        _bounded(conn, lambda: super(TimedCursor, self).executemany(query, params_seq, **kw))


class TimedConnection(psycopg.Connection[Any]):
    tickets_timeout: float = 0.0

    def commit(self) -> None:
        _bounded(self, super().commit)

    def rollback(self) -> None:
        _bounded(self, super().rollback)


def timed_connect(cargs: Any, cparams: dict[str, Any], seconds: float) -> TimedConnection:
    cparams.setdefault("cursor_factory", TimedCursor)
    conn = TimedConnection.connect(*cargs, **cparams)
    conn.tickets_timeout = seconds
    return conn
