"""Values the backends and the ticket sources pass each other: compiled statements, connect
arguments, what a ticket table holds and which database server answered."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect

#: The table name statements are compiled for, then swapped for each table's (see
#: :meth:`RawStatement.renamed`): a plain identifier no dialect quotes, found nowhere else.
_STAND_IN = "tickets__sqlalchemy_tickets_stand_in"

#: The index a compiled row read carries in place of each table's (see ``describe_many``).
_INDEX = 2147480001

#: Tables per statement where a statement reads many (a ``UNION ALL``, an ``IN`` list).
MANY = 200


def run(cursor: Any, statement: sa.sql.ClauseElement, dialect: Dialect) -> Any:
    """Compile ``statement`` for ``dialect`` and run it on a DBAPI cursor (for statements made
    for one call; those run often are compiled once, as a :class:`RawStatement`)."""
    # Expanding IN lists become one parameter per value here, as the driver needs them.
    compiled: Any = statement.compile(dialect=dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.params
    if compiled.positional:
        cursor.execute(compiled.string, tuple(params[name] for name in compiled.positiontup))
    else:
        cursor.execute(compiled.string, params)
    return cursor


class RawStatement:
    """A Core statement compiled once for one dialect, runnable on a bare DBAPI cursor."""

    __slots__ = ("sql", "_positional", "_defaults")

    def __init__(self, statement: sa.sql.ClauseElement, dialect: Dialect) -> None:
        compiled: Any = statement.compile(dialect=dialect)
        self.sql: str = compiled.string
        self._positional: Sequence[str] | None = (
            list(compiled.positiontup) if compiled.positional and compiled.positiontup else None
        )
        self._defaults = dict(compiled.params)

    def params(self, **values: Any) -> Sequence[Any] | Mapping[str, Any]:
        """The parameters in the form the driver's paramstyle wants."""
        merged = {**self._defaults, **values}
        if self._positional is not None:
            return tuple(merged[name] for name in self._positional)
        return merged

    def execute(self, cursor: Any, **values: Any) -> Any:
        cursor.execute(self.sql, self.params(**values))
        return cursor

    def renamed(self, old: str, new: str, dialect: Dialect) -> RawStatement:
        """This statement on the table ``new`` instead of ``old``: its quoted name in the SQL
        and in the parameters' values swapped (compiling a statement per table would cost a
        few milliseconds for each of thousands of sequences)."""
        quote = dialect.identifier_preparer.quote
        twin = object.__new__(RawStatement)
        twin.sql = self.sql.replace(quote(old), quote(new))
        twin._positional = self._positional
        twin._defaults = {k: new if v == old else v for k, v in self._defaults.items()}
        return twin


@dataclass(frozen=True)
class ConnectParams:
    """DBAPI connect keyword arguments the library adds to its own connections.

    ``defaults`` apply where neither the URL, ``connect_args`` nor a ``do_connect`` hook set the
    key (the application's choice wins: ``prepare_threshold``, ``application_name``);
    ``forced`` always apply (the timeouts that make a hung server an error).
    """

    defaults: dict[str, Any] = field(default_factory=dict)
    forced: dict[str, Any] = field(default_factory=dict)

    def apply_defaults(self, cparams: dict[str, Any]) -> None:
        for key, value in self.defaults.items():
            cparams.setdefault(key, value)

    def apply_forced(self, cparams: dict[str, Any]) -> None:
        cparams.update(self.forced)


@dataclass(frozen=True)
class TableInfo:
    """The stride of a ticket table and the last id it issued (``None``: nothing issued yet)."""

    increment: int
    offset: int
    last_id: int | None


#: How long a failover may be trusted to have lost nothing after the last time every commit
#: was known to wait for the standbys that may be promoted (``Identity.trusted_until``): longer
#: than a failover takes, renewed well before it runs out (``SYNC_RENEWAL``). A database whose
#: replication stops protecting its commits issues nothing until the lease it recorded ran
#: out (``docs/rewinds.md``).
SYNC_LEASE_MS = 90_000
#: Seconds between a process's renewals of the leases of a database it issues from (each
#: renews those a third through: a lease has two thirds of its time left, or more).
SYNC_RENEWAL = 5.0
#: Seconds between looks at the replication of a table whose commits do not wait for its
#: standbys (until one shows they do, a failover is a possible rewind).
SYNC_RECHECK = 30.0
#: How far two database servers' clocks may disagree (each side of a lease is moved by it).
CLOCK_SKEW_MS = 1_000


@dataclass(frozen=True)
class Identity:
    """What a ticket table is, as far as a restore or a failover can change it.

    ``lineage`` is what a failover keeps (PostgreSQL's ``system_identifier``), ``era`` what it
    moves (PostgreSQL's timeline; MySQL/MariaDB's ``@@server_id``), ``table`` what a restore
    changes (PostgreSQL's table OID, MySQL/MariaDB's table creation time, SQLite's root page).
    ``synchronous``: every commit on this database waits, now, for every standby that may be
    promoted (read live); recorded, that it did when the lease was last renewed.
    """

    lineage: str
    era: str
    table: str
    synchronous: bool = False
    #: What the backend's take compares to be sure it still writes this table (see
    #: :meth:`TicketBackend.identity_guards`); not recorded.
    guard: tuple[Any, ...] = field(default=(), compare=False)
    #: Read live: the database's clock then, in milliseconds since the epoch.
    clock: int | None = field(default=None, compare=False)
    #: Recorded: until when (database clock, ms) a failover may be trusted to have lost
    #: nothing, if ``synchronous``; while it runs, nothing is issued from asynchronous commits.
    trusted_until: int | None = field(default=None, compare=False)

    @property
    def stamp(self) -> str:
        """The identity as recorded in the stamp table (``synchronous`` apart)."""
        return f"{self.lineage}|{self.era}|{self.table}"

    @property
    def prefix(self) -> str:
        """What the stamps of every table of this database and era start with."""
        return f"{self.lineage}|{self.era}|"

    @classmethod
    def from_stamp(
        cls, stamp: str, synchronous: bool, trusted_until: int | None = None
    ) -> Identity:
        lineage, _, rest = stamp.partition("|")
        era, _, table = rest.partition("|")
        return cls(lineage, era, table, synchronous, trusted_until=trusted_until)

    def same(self, other: Identity) -> bool:
        return self.stamp == other.stamp

    def leased(self, clock: int | None) -> bool:
        """Whether this recorded identity's lease still runs at ``clock`` (a live reading of
        the database's clock), with the clocks' possible disagreement against it."""
        return (
            self.trusted_until is not None
            and clock is not None
            and clock + CLOCK_SKEW_MS < self.trusted_until
        )

    def promoted_from(self, other: Identity) -> bool:
        """Whether this (live) is ``other`` (recorded) after a failover that lost nothing: the
        same database and table, a new era, and every commit on the old primary waited for
        every standby that may be promoted, up to a moment that, by this server's clock, has
        not passed yet (its lease). Whether the old primary's last writes are here is a
        property of its replication when it failed, which only that lease speaks for: a
        setting emptied since, a quorum, or a failover noticed after the lease ran out is a
        possible rewind."""
        return (
            other.synchronous
            and other.leased(self.clock)
            and self.lineage == other.lineage
            and self.table == other.table
            and self.era != other.era
        )

    def __str__(self) -> str:
        return self.stamp
