"""A datacenter tier's tables as an operator sees them: their DDL, their creation (and upgrade
from an older release), and the status of every sequence in them (stock, rate, runway, claim).
Public through :mod:`sqlalchemy_tickets.sources.datacenter`."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from .. import _schema
from .._naming import DEFAULT_TIER_PREFIX, STAMP_TABLE, TicketTable, TierTables, tier_tables
from ..dialects._clock import db_now_ms
from ..dialects._connect import Bind, OwnEngine, create_under_lock, sync_bind
from ..dialects.base import TicketBackend
from ..errors import UnknownSequenceError

logger = logging.getLogger("sqlalchemy_tickets")


def missing_table(backend: TicketBackend, error: sa_exc.DBAPIError) -> bool:
    """Whether a database error says a table of the tier is not there."""
    return error.orig is not None and backend.is_missing_table(error.orig)


def sequence_of(name: str) -> str | None:
    """The sequence of a ``sequence_name`` column's value (``''``: Flickr's tables)."""
    return None if name == "" else name


# -- tables ------------------------------------------------------------------------------------


def datacenter_tables(
    metadata: sa.MetaData | None = None,
    *,
    dialect: str = "postgresql",
    table_prefix: str = DEFAULT_TIER_PREFIX,
) -> tuple[sa.Table, sa.Table]:
    """The Core ``(stock, state)`` tables of a datacenter tier on ``dialect``'s backend (added
    to ``metadata`` if given), e.g. for Alembic's ``target_metadata``."""
    return _schema.tier_tables(_backend(dialect), tier_tables(table_prefix), metadata)


def datacenter_table_statements(
    *, dialect: str = "postgresql", table_prefix: str = DEFAULT_TIER_PREFIX
) -> list[sa.sql.Executable]:
    """DDL creating a datacenter tier's tables; safe to run when they exist."""
    return _schema.tier_statements(_backend(dialect), tier_tables(table_prefix))


def drop_datacenter_table_statements(
    *, dialect: str = "postgresql", table_prefix: str = DEFAULT_TIER_PREFIX
) -> list[sa.sql.Executable]:
    """DDL dropping a datacenter tier's tables (and the ids in stock with them)."""
    return _schema.drop_tier_statements(_backend(dialect), tier_tables(table_prefix))


def _backend(dialect: str) -> TicketBackend:
    from ..dialects import backend_for

    return backend_for(dialect)


def create_datacenter_tables(
    bind: Bind, *, table_prefix: str = DEFAULT_TIER_PREFIX, timeout: float = 5.0
) -> None:
    """Create a datacenter tier's tables in ``bind``'s database if they are not there.

    Safe to run from several processes at once (creators wait for each other, bounded by
    ``timeout`` seconds), and beside running tiers.
    """
    names = tier_tables(table_prefix)
    own = OwnEngine(sync_bind(bind), timeout=timeout, pool_size=1, what="datacenter tier")
    try:
        create_tables(own, names)
    finally:
        own.dispose()


def create_tables(own: OwnEngine, names: TierTables) -> None:
    """Create the tier's tables (and add the columns an older release's lack), under the
    creation lock: concurrent creators wait for each other."""
    # The creation lock is keyed by a table name: the state table's stands for both.
    lock = [TicketTable(None, 64, names.state)]
    wanted = [names.stock, names.state, STAMP_TABLE]
    # Nothing is sent where the tables exist: a role without the CREATE right is refused
    # even CREATE TABLE IF NOT EXISTS (a migration made them; this is its application).
    if set(wanted) - own.run(lambda conn: own.backend.existing_tables(conn, wanted)):
        create_under_lock(own, lock, lambda conn: _schema.tier_statements(own.backend, names))
    _, state = _schema.tier_tables(own.backend, names)
    if not has_columns(own, state):

        def upgrade(conn: sa.Connection) -> Iterator[sa.sql.Executable]:
            for column, ddl in own.backend.missing_columns(conn, state):
                logger.warning("datacenter tier table %s upgraded: adding column %s",
                               names.state, column)
                yield ddl

        create_under_lock(own, lock, upgrade)
    logger.info("datacenter tier tables %s, %s ready on %s", names.stock, names.state,
                own.url.render_as_string())


def older_release(own: OwnEngine, names: TierTables) -> str:
    """What to say of tier tables an older release made (they lack columns this one uses)."""
    return (
        f"the datacenter tier table {names.state} on {own.url.render_as_string()} was made by "
        "an older release (it lacks the columns of the one-statement take); upgrade it with "
        "`sqlalchemy-tickets init --url URL --datacenter-tier` (or op.create_datacenter_tables() "
        "in a migration, or a DatacenterTier with create_missing=True)"
    )


def has_columns(own: OwnEngine, table: sa.Table) -> bool:
    """Whether ``table`` has every column it should (one read of none of its rows: cheaper
    than the catalog's description on every process's first use)."""
    try:
        own.run(lambda conn: conn.execute(sa.select(*table.c).where(sa.false())).all())
    except sa_exc.DBAPIError:
        return False
    return True


# -- status ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierStatus:
    """One sequence of a datacenter tier, as :func:`describe_datacenter` reads it."""

    sequence: str | None
    bits: int
    #: Ids in stock, and how many of them were given back.
    stock: int
    given_back_in_stock: int
    #: Rows (ranges) in stock.
    ranges: int
    #: Ids taken, ever, by every process.
    issued: int
    given_back: int
    refills: int
    refilled: int
    #: Ids per second taken by every process together (EWMA), and how old its last sample is.
    rate: float
    rate_age: float | None
    #: Seconds the stock lasts at that rate with upstream down (``None``: no rate yet).
    runway: float | None
    #: Who is refilling, and in how many seconds the claim is void (negative: already void).
    claim_owner: str | None
    claim_expires_in: float | None
    #: Seconds since a block was last stored (``None``: never).
    last_refill_age: float | None
    exhausted: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def describe_datacenter(
    bind: Bind, *, table_prefix: str = DEFAULT_TIER_PREFIX, timeout: float = 5.0
) -> list[TierStatus]:
    """Every sequence of the datacenter tier in ``bind``'s database: stock, rate, runway, claim.

    Raises :class:`UnknownSequenceError` if the tier's tables are not there, and
    :class:`DatabaseUnavailable` if the database does not answer.
    """
    own = OwnEngine(sync_bind(bind), timeout=timeout, pool_size=1, what="datacenter tier")
    try:
        return describe(own, tier_tables(table_prefix))
    finally:
        own.dispose()


def describe(own: OwnEngine, names: TierTables) -> list[TierStatus]:
    stock_t, state_t = _schema.tier_tables(own.backend, names)
    try:
        with own.connect() as conn:
            states = conn.execute(
                sa.select(state_t, db_now_ms().label("now_ms")).order_by(
                    state_t.c.sequence_name, state_t.c.bits
                )
            ).all()
            ranges = conn.execute(
                sa.select(
                    stock_t.c.sequence_name, stock_t.c.bits, stock_t.c.kind,
                    stock_t.c.first_id, stock_t.c.last_id, stock_t.c.step,
                )
            ).all()
    except sa_exc.DBAPIError as error:
        if missing_table(own.backend, error):
            raise UnknownSequenceError(
                f"no datacenter tier tables ({names.stock}, {names.state}) on "
                f"{own.url.render_as_string()}; create them with `sqlalchemy-tickets init` "
                "or create_datacenter_tables()"
            ) from error
        if not has_columns(own, state_t):
            raise UnknownSequenceError(older_release(own, names)) from error
        raise own.unavailable(error) from error
    counted: dict[tuple[str, int], list[int]] = {}
    for r in ranges:
        n = (int(r.last_id) - int(r.first_id)) // int(r.step) + 1
        figures = counted.setdefault((r.sequence_name, int(r.bits)), [0, 0, 0])
        figures[0] += n
        figures[1] += n if r.kind == 0 else 0
        figures[2] += 1
    result = []
    for s in states:
        now = int(s.now_ms)
        stock, back, rows = counted.get((s.sequence_name, int(s.bits)), [0, 0, 0])
        if int(s.head_first) <= int(s.head_last):  # the range being handed out
            n = (int(s.head_last) - int(s.head_first)) // int(s.head_step) + 1
            stock, rows = stock + n, rows + 1
            back += n if int(s.head_kind) == 0 else 0
        rate = float(s.rate)
        result.append(
            TierStatus(
                sequence=sequence_of(s.sequence_name),
                bits=int(s.bits),
                stock=stock,
                given_back_in_stock=back,
                ranges=rows,
                issued=int(s.issued),
                given_back=int(s.given_back),
                refills=int(s.refills),
                refilled=int(s.refilled),
                rate=rate,
                rate_age=(now - int(s.rate_at)) / 1000 if s.rate_at else None,
                runway=stock / rate if rate > 0 else None,
                claim_owner=s.claim_owner or None,
                claim_expires_in=(int(s.claim_until) - now) / 1000 if s.claim_owner else None,
                last_refill_age=(now - int(s.refilled_at)) / 1000 if s.refilled_at else None,
                exhausted=bool(s.exhausted),
            )
        )
    return result
