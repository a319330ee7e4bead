"""Operating ticket servers: what they hold, cut-over from auto-increment, re-striding.

Everything here runs on a :class:`TicketServer`'s own autocommit connections, through its bounded
round trip (``server.own.connect()``), one atomic statement per change, so clients may keep
drawing ids while it runs.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from ._commands import sync_command
from ._naming import TicketTable, max_id, normalize_sequence, ticket_table
from .dialects._connect import Bind, OwnEngine
from .dialects.base import TableInfo, TableSpec, last_id_below
from .errors import TicketsError, UnknownSequenceError
from .sources.server import PAUSED_OFFSET, TicketServer

logger = logging.getLogger("sqlalchemy_tickets")

__all__ = [
    "SequenceStatus",
    "ServerHealth",
    "WARN_SHARE",
    "restride",
    "sequence_status",
    "sequences",
    "server_health",
    "sync_sequence",
]

#: Share of an id space used past which ``status`` warns.
WARN_SHARE = 0.8

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}\Z")
_FLICKR = {"Tickets64": 64, "Tickets32": 32}


def sequences(server: TicketServer) -> list[TicketTable]:
    """The ticket tables on ``server``: named sequences (by its table template) and Flickr's."""
    prefix, _, suffix = server.table_template.partition("{sequence}")
    pattern = re.compile(re.escape(prefix) + r"([a-z][a-z0-9_]*)" + re.escape(suffix) + r"\Z")
    found: list[TicketTable] = []
    try:
        with server.own.connect() as conn:
            names = sa.inspect(conn).get_table_names()
    except sa.exc.DBAPIError as error:
        raise server.own.unavailable(error) from error
    for name in sorted(names):
        if name in _FLICKR:
            found.append(ticket_table(None, _FLICKR[name]))
        elif (match := pattern.match(name)) is not None:
            found.append(ticket_table(match.group(1), 64, server.table_template))
    return found


@dataclass(frozen=True)
class SequenceStatus:
    """One sequence on one server, as ``status`` reports it."""

    server: str
    sequence: str
    table: str
    last_id: int | None
    increment: int
    offset: int
    paused: bool
    used_32: float  # share of the 32-bit space below the last id
    used_64: float
    rate: float | None  # ids per second over the sample, if sampled
    exhausted_32_at: str | None  # ISO date the 32-bit space runs out at that rate
    exhausted_64_at: str | None
    #: The identity recorded in the database's stamp table, and the one it shows now: they
    #: differ after a restore or a failover no process has issued from yet.
    identity: str | None
    identity_now: str | None
    #: The most any other server given issued of this sequence (a pair), when it is more than
    #: this server's last id plus its stride: this server may have been restored.
    behind: int | None
    warnings: list[str]

    @property
    def warning(self) -> str | None:
        return "; ".join(self.warnings) or None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def sequence_status(
    servers: Sequence[TicketServer],
    *,
    sample: float = 0.0,
    now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
    sleep: Callable[[float], Any] = time.sleep,
) -> list[SequenceStatus]:
    """Every sequence on every server; with ``sample`` > 0, read twice that many seconds apart
    to measure the burn rate and forecast the date each id space runs out."""
    first: dict[tuple[int, TicketTable], TableInfo | None] = {}
    identities: dict[tuple[int, TicketTable], tuple[str | None, str | None]] = {}
    for i, server in enumerate(servers):
        for table in sequences(server):
            first[i, table] = _describe(server, table)
            stored, shown = server.identities(table.sequence, bits=table.bits)
            identities[i, table] = (
                None if stored is None else stored.stamp, None if shown is None else shown.stamp
            )
    highest: dict[TicketTable, list[tuple[int, int]]] = {}
    for (i, table), info in first.items():
        if info is not None and info.last_id is not None:
            highest.setdefault(table, []).append((i, info.last_id))
    second = first
    if sample > 0:
        sleep(sample)
        second = {(i, t): _describe(servers[i], t) for (i, t) in first}
    today = now()
    out = []
    for (i, table), info in second.items():
        last = info.last_id if info is not None else None
        before = first[i, table]
        rate = None
        if sample > 0 and last is not None and before is not None and before.last_id is not None:
            rate = max(0.0, (last - before.last_id) / sample)
        # A share, so within 0..1: a 64-bit sequence past 2**31 has used all of a 32-bit space.
        used = {bits: min(1.0, max(0.0, (last or 0) / max_id(bits))) for bits in (32, 64)}
        label = table.sequence if table.sequence is not None else table.name
        warnings = []
        relevant = [32] if table.bits == 32 else [32, 64] if table.sequence else [64]
        for bits in relevant:
            if WARN_SHARE <= used[bits] < 1:
                warnings.append(
                    f"{used[bits]:.0%} of the {bits}-bit id space is used"
                    + (" (matters if a 32-bit column uses it)" if table.sequence and bits == 32
                       else "")
                )
        recorded, live = identities[i, table]
        # The servers of a pair drift apart by whole blocks in normal use: being behind them
        # says something only of a server restored or failed over.
        peers = [last for j, last in highest.get(table, []) if j != i]
        behind = max(peers) if peers and max(peers) > (last or 0) else None
        if recorded is not None and live is not None and recorded != live:
            above = max(behind or 0, last or 0)
            warnings.append(
                f"its identity changed (recorded {recorded}, now {live}): restored from a "
                "backup or failed over since it last issued"
                + (f", and behind the other servers, which issued up to {behind:,}"
                   if behind is not None else "")
                + "; running processes move it above what they issued, new ones refuse until "
                f"`{sync_command(servers[i].url.render_as_string(), table.sequence, table.bits)}`"
                # What this database shows is from before it went back: ids above it may have
                # been issued since, and only the tables they went to know them.
                f", N above every id issued before it went back: the largest key of the "
                f"tables this sequence serves (this database shows only {above:,}, and "
                "ids above that may have been issued before it went back)"
            )
        out.append(
            SequenceStatus(
                server=servers[i].url.render_as_string(),
                sequence=label,
                table=table.name,
                last_id=last,
                increment=info.increment if info else 1,
                offset=info.offset if info else 1,
                paused=info is not None and info.offset == PAUSED_OFFSET,
                used_32=used[32],
                used_64=used[64],
                rate=rate,
                exhausted_32_at=_forecast(today, last, rate, 32),
                exhausted_64_at=_forecast(today, last, rate, 64),
                identity=recorded,
                identity_now=live,
                behind=behind,
                warnings=warnings,
            )
        )
    return out


@dataclass(frozen=True)
class ServerHealth:
    """Whether a ticket server answers, as ``status --upstream`` reports it."""

    server: str
    up: bool
    #: Seconds to the first answer, connecting included (``None``: no answer).
    connect: float | None
    #: Seconds of one round trip on the open connection (``None``: no answer).
    latency: float | None
    #: The ticket tables it holds (sequence names; Flickr's as ``Tickets64``/``Tickets32``).
    sequences: list[str]
    error: str | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def server_health(servers: Sequence[TicketServer]) -> list[ServerHealth]:
    """Ask each server, on its own bounded connections, which ticket tables it holds: whether
    it answers within its ``timeout``, how long connecting and a round trip take. Reads only:
    a database that does not exist is reported down, never created."""
    out = []
    for server in servers:
        shown = server.url.render_as_string()
        problem = server.backend.missing_database(server.url)
        if problem is not None:
            out.append(ServerHealth(shown, False, None, None, [], problem))
            continue
        try:
            started = time.perf_counter()
            sequences(server)  # connects, then one round trip
            connect = time.perf_counter() - started
            started = time.perf_counter()
            found = sequences(server)  # the same connection, from the server's pool
            latency = time.perf_counter() - started
        except (TicketsError, sa.exc.SQLAlchemyError, OSError) as error:
            out.append(ServerHealth(shown, False, None, None, [], _first(error)))
            continue
        names = [t.sequence if t.sequence is not None else t.name for t in found]
        out.append(ServerHealth(shown, True, connect, latency, names, None))
    return out


def _describe(server: TicketServer, table: TicketTable) -> TableInfo | None:
    return server.describe(table.sequence, bits=table.bits)


def _forecast(today: dt.datetime, last: int | None, rate: float | None, bits: int) -> str | None:
    if rate is None or rate <= 0 or last is None or last >= max_id(bits):
        return None
    seconds = (max_id(bits) - last) / rate
    try:
        return (today + dt.timedelta(seconds=seconds)).date().isoformat()
    except OverflowError:
        return "after 9999"


def _check_identifier(kind: str, name: str) -> str:
    if not _IDENTIFIER.match(name):
        raise TicketsError(f"invalid {kind} name {name!r}: use a plain SQL identifier")
    return name


def check_identifier(kind: str, name: str) -> str:
    """Refuse a table or column name that is not a plain SQL identifier (:class:`TicketsError`)."""
    return _check_identifier(kind, name)


def table_max(
    bind: Bind, table: str, column: str = "id", *, timeout: float = 30.0
) -> int:
    """``max(column)`` of an application table (0 when it is empty), read on a connection
    made the way ``bind`` makes them, within ``timeout`` seconds.

    The column must be an integer column (the key an auto-increment filled): anything else is a
    :class:`TicketsError` naming its type, before its maximum is read.
    """
    _check_identifier("table", table)
    _check_identifier("column", column)
    own = OwnEngine(bind, timeout=timeout, pool_size=1, what="application database")
    try:
        with own.connect() as conn:
            _check_integer_column(conn, table, column)
            target = sa.table(table, sa.column(column))
            value = conn.scalar(sa.select(sa.func.max(target.c[column])))
    except sa.exc.NoSuchTableError as error:
        raise TicketsError(f"cannot read max({column}) of {table}: no table {table}") from error
    except sa.exc.DBAPIError as error:
        raise TicketsError(f"cannot read max({column}) of {table}: {_first(error)}") from error
    finally:
        own.dispose()
    if value is not None and not isinstance(value, int):
        raise TicketsError(
            f"max({table}.{column}) is {value!r}, not an integer: sync needs an integer key"
        )
    return int(value or 0)


def _check_integer_column(conn: sa.Connection, table: str, column: str) -> None:
    columns = {c["name"].lower(): c for c in sa.inspect(conn).get_columns(table)}
    found = columns.get(column.lower())
    if found is None:
        raise TicketsError(
            f"table {table} has no column {column} (columns: {', '.join(sorted(columns))})"
        )
    type_ = found["type"]
    integral = isinstance(type_, sa.Integer) or (
        isinstance(type_, sa.Numeric) and not isinstance(type_, sa.Float) and type_.scale == 0
    )
    if not integral:
        raise TicketsError(
            f"column {table}.{column} is {type_}, not an integer column: sync moves a sequence "
            "above the largest integer key (the column an auto-increment filled)"
        )


def sync_sequence(
    server: TicketServer, sequence: str | None, floor: int, *, bits: int = 64
) -> TableInfo:
    """Move ``sequence`` on ``server`` so every id it issues from now on is above ``floor``
    (Flickr's cut-over: sync the ticket sequence to the old auto-increment table). Running
    clients are safe: one atomic UPDATE, which never moves a sequence down."""
    if floor > max_id(bits):
        raise TicketsError(f"{floor} is past the {bits}-bit limit of {sequence or 'Tickets'}")
    table = ticket_table(sequence, bits, server.table_template)
    info = server.describe(sequence, bits=bits)  # raises UnknownSequenceError if absent
    if info is None or info.last_id is None:
        server.next_id(sequence, bits=bits)  # Flickr's table without its row: make it
    backend = server.backend
    t = backend.table(TableSpec(table))
    with server.own.connect() as conn:
        conn.execute(backend.raise_floor_statement(t, sa.literal(floor, sa.BigInteger)))
    after = server.describe(sequence, bits=bits)
    assert after is not None
    # The operator vouches for the sequence as it is now: processes that refused resume.
    server.record_identity(sequence, bits=bits)
    logger.info("synced %s on %s above %d: last id %s", table.label, server, floor, after.last_id)
    return after


def restride(servers: Sequence[TicketServer], names: Sequence[str] | None = None) -> int:
    """Give ``servers`` (the new, complete list, in position order) the strides of their
    positions — N servers to N+1, or N−1 — so that every id issued afterwards is above every id
    any of them issued before, and server *i* issues ids ≡ *i+1* (mod N).

    Per sequence: each server holding it is paused (clients then get
    :class:`~sqlalchemy_tickets.TicketServerUnavailable` from it, which failover and caches
    ride out), the highest id issued anywhere is read, and each server gets its new increment,
    offset and a start above that id in one statement, which also un-pauses it. A server that
    lacks the sequence gets its table. Running it again after an interruption finishes the
    job. Returns the highest id issued before the change, over all sequences.
    """
    if not servers:
        raise TicketsError("restride needs the list of servers")
    wanted = [normalize_sequence(n) for n in names] if names else None
    found: dict[str, list[int]] = {}
    for i, server in enumerate(servers):
        for table in sequences(server):
            if table.flickr:
                if wanted is None:
                    logger.warning("%s on %s takes its stride from the server's "
                                   "auto_increment_* settings: not restrided", table.name, server)
                continue
            assert table.sequence is not None
            if wanted is None or table.sequence in wanted:
                found.setdefault(table.sequence, []).append(i)
    missing = [n for n in (wanted or []) if n not in found]
    if missing:
        raise UnknownSequenceError(f"no server has the sequence(s) {', '.join(map(str, missing))}")
    n = len(servers)
    highest = 0
    for name, holders in sorted(found.items()):
        table = ticket_table(name, 64, servers[0].table_template)
        for i in holders:
            _set_stride(servers[i], table, offset=PAUSED_OFFSET)
        top = max([0] + [_last_id(servers[i], table) for i in holders])
        highest = max(highest, top)
        for i, server in enumerate(servers):
            if i not in holders:
                server.create(name, start=1, increment=n, offset=i + 1)
            last = last_id_below(top + 1, n, i + 1)
            _set_stride(server, table, increment=n, offset=i + 1, last_id=last)
        logger.info("restrided %s over %d servers above id %d", name, n, top)
    return highest


def _last_id(server: TicketServer, table: TicketTable) -> int:
    info = server.describe(table.sequence, bits=table.bits)
    return info.last_id if info is not None and info.last_id is not None else 0


def _set_stride(
    server: TicketServer,
    table: TicketTable,
    *,
    offset: int,
    increment: int | None = None,
    last_id: int | None = None,
) -> None:
    backend = server.backend
    statement = backend.restride_statement(
        backend.table(TableSpec(table)), offset=offset, increment=increment, last_id=last_id
    )
    with server.own.connect() as conn:
        conn.execute(statement)


def _first(error: BaseException) -> str:
    text = str(getattr(error, "orig", None) or error).strip().splitlines()
    return text[0] if text else type(error).__name__
