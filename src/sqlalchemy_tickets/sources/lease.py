"""Snowflake worker ids leased from a database table, so no human hands them out.

One row per (namespace, worker id) in ``tickets_worker_leases``::

    namespace     VARCHAR(64)  ┐ primary key: one id space per namespace (one per Snowflake
    worker_id     INTEGER      ┘ layout/epoch; generators sharing ids must share a namespace)
    holder        VARCHAR(32)  random token of the process holding the id ('' when released)
    owner         VARCHAR(200) host:pid of that process, for humans
    expires_at    BIGINT       database clock, Unix ms: after it, anyone may take the id
    issued_until  BIGINT       Unix ms: no id of this worker carries a later timestamp
    acquired_at   BIGINT       database clock, Unix ms
    renewed_at    BIGINT       database clock, Unix ms

**Taking an id.** An expired row is taken with ``UPDATE … WHERE expires_at <= now()`` — one
atomic compare-and-set on every backend, so of two racing processes exactly one gets it. When no
row is free, the next id is inserted (the primary key settles races). Rows are never deleted:
they keep ``issued_until``. Expiry is judged by the *database's* clock, the one clock all
holders share.

**Keeping it.** A heartbeat thread renews the lease every ``ttl / 3`` seconds. Each renewal
first writes ``issued_until = (holder's clock) + ttl`` and only then lets the generator issue ids
with timestamps up to that bound. A holder that cannot renew (database down, process paused)
stops issuing when its own clock passes the bound, and a renewal that finds another holder's
token says the lease was lost.

**Why two processes never issue the same id.** A new holder of worker *w* reads ``issued_until``
after the row changed hands (the row lock orders it after the old holder's last successful
renewal) and issues only timestamps *above* it, while the old holder never issues above it. This
holds whatever the clocks do. Clocks only decide liveness: a new holder whose clock is behind
``issued_until`` by more than ``max_backward_ms`` refuses to issue (``TicketsError``): the worker
id's own past is ahead of this machine's clock. A clean shutdown (``close()``, or ``atexit``)
writes the real last timestamp and expires the row at once, so the id is free again at once.

``lease_table()`` gives the Core ``Table`` (for Alembic: ``op.create_table`` of its columns, or
``lease_table(target_metadata)``); ``lease_table_statements()`` gives the DDL.
"""

from __future__ import annotations

import logging
import os
import random
import re
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine

from .._deprecation import deprecated_alias
from .._naming import check_seconds
from .._schema import (
    DEFAULT_LEASE_TABLE,
    drop_lease_table_statements,
    lease_table,
    lease_table_statements,
)
from ..dialects._clock import db_now_ms
from ..dialects._connect import Bind, OwnEngine, engine_of, to_url
from ..errors import TicketsError

__all__ = [
    "DEFAULT_LEASE_TABLE",
    "LeaseGrant",
    "LeaseRow",
    "WorkerLease",
    "create_lease_table",
    "db_now_ms",
    "drop_lease_table_statements",
    "lease_table",
    "lease_table_statements",
]

log = logging.getLogger("sqlalchemy_tickets")

DEFAULT_NAMESPACE = "default"
_NAMESPACE_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


# -- the table -----------------------------------------------------------------------------------
# lease_table() and its statements are the schema module's, where every table of the library is
# made from; they stay importable from here, where they always were.


def create_lease_table(
    bind: Bind,
    *,
    name: str = DEFAULT_LEASE_TABLE,
    schema: str | None = None,
    timeout: float = 5.0,
) -> None:
    """Create the lease table in a database if it is not there (on connections made the way
    ``bind`` makes them, bounded by ``timeout`` seconds)."""
    own = OwnEngine(bind, timeout=timeout, pool_size=1, what="worker lease database")
    try:
        with own.connect() as conn:
            for statement in lease_table_statements(name=name, schema=schema):
                conn.execute(statement)
    finally:
        own.dispose()


# -- leases --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseGrant:
    """A worker id this process holds."""

    worker_id: int
    #: Random token proving the holding in every renewal.
    token: str
    #: Unix ms: the highest timestamp an earlier holder may have put in an id of this worker.
    issued_until_ms: int


@dataclass(frozen=True)
class LeaseRow:
    """One row of the lease table, as :meth:`WorkerLease.rows` reads it."""

    worker_id: int
    holder: str
    owner: str
    #: Milliseconds until the lease expires, by the database clock (negative: expired).
    expires_in_ms: int
    issued_until_ms: int


class WorkerLease:
    """Worker ids of one namespace, leased from a table in a database.

    Args:
        bind: the lease database (URL or ``Engine``; given an ``Engine``, the lease connects
            the way it does, on a small autocommit pool of its own so it never joins a
            caller's transaction).
        namespace: one id space; generators that must not share worker ids share a namespace
            (1-64 characters of ``A-Za-z0-9_.:-``).
        ttl: seconds a lease lives without renewal; a killed process's id is free after it.
        heartbeat: seconds between renewals (default ``ttl / 3``; must be below ``ttl``).
        table_name, schema: where the table is (created on first use unless
            ``create_table=False``).
        timeout: seconds a connect, or one unit of work (taking, renewing or releasing an id),
            may take before it fails with :class:`~sqlalchemy_tickets.DatabaseUnavailable`.
    """

    def __init__(
        self,
        bind: Bind,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        ttl: float = 30.0,
        heartbeat: float | None = None,
        table_name: str = DEFAULT_LEASE_TABLE,
        schema: str | None = None,
        timeout: float = 5.0,
        create_table: bool = True,
    ) -> None:
        if not isinstance(namespace, str) or not _NAMESPACE_RE.match(namespace):
            raise TicketsError(
                f"invalid lease namespace {namespace!r}: use 1-64 characters of A-Za-z0-9_.:-"
            )
        check_seconds("ttl", ttl)
        beat = ttl / 3 if heartbeat is None else heartbeat
        if isinstance(beat, bool) or not isinstance(beat, (int, float)) or not 0 < beat < ttl:
            raise TicketsError(
                f"heartbeat must be a positive number of seconds below ttl ({ttl}), not {beat!r}"
            )
        check_seconds("timeout", timeout)
        self._bind = bind
        engine = engine_of(bind)
        self.url: URL = engine.url if engine is not None else to_url(bind)  # type: ignore[arg-type]
        self.namespace = namespace
        self.ttl = float(ttl)
        self.heartbeat = float(beat)
        self.timeout = float(timeout)
        self.create_table = create_table
        self.table = lease_table(name=table_name, schema=schema)
        self._own: OwnEngine | None = None
        self._table_ready = False
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"WorkerLease({self.url.render_as_string()!r}, namespace={self.namespace!r}, "
            f"ttl={self.ttl})"
        )

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl * 1000)

    @property
    def own(self) -> OwnEngine:
        """The lease's own autocommit engine and bounded round trip, made on first use."""
        own = self._own
        if own is None:
            with self._lock:
                own = self._own
                if own is None:
                    own = self._own = OwnEngine(
                        self._bind,
                        timeout=self.timeout,
                        pool_size=1,
                        max_overflow=2,
                        what="worker lease database",
                    )
        return own

    @property
    def engine(self) -> Engine:
        """The lease's own autocommit engine (its connections are not bounded in time: use
        :attr:`own`'s ``connect()`` for that)."""
        return self.own.engine

    def ensure_table(self) -> None:
        """Create the lease table if it is missing (once per process)."""
        if self._table_ready or not self.create_table:
            return
        with self.own.connect() as conn:
            for statement in lease_table_statements(name=self.table.name, schema=self.table.schema):
                try:
                    conn.execute(statement)
                except sa_exc.DBAPIError:
                    # Another process created it between IF NOT EXISTS and CREATE (MySQL can
                    # report that as an error); fine if the table is there now.
                    if not sa.inspect(conn).has_table(self.table.name, schema=self.table.schema):
                        raise
        self._table_ready = True

    def _mine(self) -> sa.ColumnElement[bool]:
        return self.table.c.namespace == self.namespace

    def acquire(self, worker_limit: int) -> LeaseGrant:
        """Take a free worker id below ``worker_limit``; raise :class:`TicketsError` if all
        ``worker_limit`` ids are held by live leases."""
        try:
            self.ensure_table()
        except sa_exc.DBAPIError as error:
            raise TicketsError(
                f"cannot create the worker lease table in {self.url.render_as_string()}: "
                f"{error.orig}"
            ) from error
        t = self.table
        now = db_now_ms()
        token = secrets.token_hex(16)
        owner = f"{socket.gethostname()}:{os.getpid()}"[:200]
        taken = {
            "holder": token,
            "owner": owner,
            "expires_at": now + self.ttl_ms,
            "acquired_at": now,
            "renewed_at": now,
        }
        try:
            for _attempt in range(50):
                with self.own.connect() as conn:
                    free = list(
                        conn.execute(
                            sa.select(t.c.worker_id)
                            .where(
                                self._mine(), t.c.expires_at <= now, t.c.worker_id < worker_limit
                            )
                            .order_by(t.c.expires_at, t.c.worker_id)
                            .limit(8)
                        ).scalars()
                    )
                    random.shuffle(free)  # racing processes should not all try the same row
                    for worker_id in free:
                        updated = conn.execute(
                            sa.update(t)
                            .where(self._mine(), t.c.worker_id == worker_id, t.c.expires_at <= now)
                            .values(**taken)
                        )
                        if updated.rowcount == 1:
                            until = conn.execute(
                                sa.select(t.c.issued_until).where(
                                    self._mine(), t.c.worker_id == worker_id, t.c.holder == token
                                )
                            ).scalar_one()
                            log.info(
                                "leased Snowflake worker id %d (namespace %r) from %s",
                                worker_id,
                                self.namespace,
                                self.url.render_as_string(),
                            )
                            return LeaseGrant(int(worker_id), token, int(until))
                    highest = conn.execute(
                        sa.select(sa.func.max(t.c.worker_id)).where(self._mine())
                    ).scalar()
                    worker_id = 0 if highest is None else int(highest) + 1
                    if worker_id >= worker_limit:
                        if free:
                            continue  # every free row was taken under us: look again
                        raise TicketsError(
                            f"all {worker_limit} worker ids of namespace {self.namespace!r} are "
                            f"leased by live processes ({self.url.render_as_string()}): stop one, "
                            "wait for a dead one's lease to expire, or use more worker bits"
                        )
                    try:
                        conn.execute(
                            sa.insert(t).values(
                                namespace=self.namespace,
                                worker_id=worker_id,
                                issued_until=0,
                                **taken,
                            )
                        )
                    except sa_exc.IntegrityError:
                        continue  # another process inserted this id first
                    log.info(
                        "leased new Snowflake worker id %d (namespace %r) from %s",
                        worker_id,
                        self.namespace,
                        self.url.render_as_string(),
                    )
                    return LeaseGrant(worker_id, token, 0)
        except sa_exc.DBAPIError as error:
            raise TicketsError(
                f"cannot lease a worker id from {self.url.render_as_string()}: {error.orig}"
            ) from error
        raise TicketsError(
            f"could not lease a worker id of namespace {self.namespace!r}: too much contention"
        )

    def renew(self, grant: LeaseGrant, issued_until_ms: int) -> bool:
        """Extend the lease by ``ttl`` and record ``issued_until_ms``; ``False``: lost.

        Database errors propagate (the caller retries at its next heartbeat).
        """
        t = self.table
        now = db_now_ms()
        with self.own.connect() as conn:
            updated = conn.execute(
                sa.update(t)
                .where(self._mine(), t.c.worker_id == grant.worker_id, t.c.holder == grant.token)
                .values(expires_at=now + self.ttl_ms, renewed_at=now, issued_until=issued_until_ms)
            )
        return bool(updated.rowcount == 1)

    def release(self, grant: LeaseGrant, issued_until_ms: int) -> None:
        """Give the id back at once, recording the last timestamp really issued."""
        t = self.table
        now = db_now_ms()
        with self.own.connect() as conn:
            conn.execute(
                sa.update(t)
                .where(self._mine(), t.c.worker_id == grant.worker_id, t.c.holder == grant.token)
                .values(expires_at=now, holder="", issued_until=issued_until_ms)
            )
        log.info("released Snowflake worker id %d (namespace %r)", grant.worker_id, self.namespace)

    def rows(self) -> list[LeaseRow]:
        """Every worker id of this namespace, held or not (for status pages and tests)."""
        self.ensure_table()
        t = self.table
        with self.own.connect() as conn:
            result = conn.execute(
                sa.select(
                    t.c.worker_id,
                    t.c.holder,
                    t.c.owner,
                    t.c.expires_at - db_now_ms(),
                    t.c.issued_until,
                )
                .where(self._mine())
                .order_by(t.c.worker_id)
            )
            return [LeaseRow(int(r[0]), r[1], r[2], int(r[3]), int(r[4])) for r in result]

    def close(self) -> None:
        """Close the lease's connections (ids held by generators stay leased: close those)."""
        own, self._own = self._own, None
        if own is not None:
            own.dispose()

    dispose = deprecated_alias(close, "dispose")

    def _after_fork_in_child(self) -> None:
        """The parent's pooled connections are not ours to use or close."""
        self._lock = threading.Lock()
        own, self._own = self._own, None
        if own is not None:
            own.dispose(close=False)


class Heartbeat:
    """A daemon thread calling ``beat()`` every ``interval`` seconds until it returns ``False``
    or :meth:`stop` is called."""

    def __init__(self, interval: float, beat: Callable[[], bool], name: str) -> None:
        self.interval = interval
        self._beat = beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end (it does at its next wake-up; this does not wait)."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self._beat():
                    return
            except Exception:  # a heartbeat must not die silently; the next one tries again
                log.exception("worker lease heartbeat failed")
