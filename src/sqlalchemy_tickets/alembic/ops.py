"""The ``create_ticket_table`` / ``drop_ticket_table`` migration operations, and the others.

Importing :mod:`sqlalchemy_tickets.alembic` registers them on Alembic's ``Operations``, so a
migration script can say::

    import sqlalchemy_tickets.alembic  # noqa: F401  (registers op.create_ticket_table)

    def upgrade():
        op.create_ticket_table("Photos")                            # tickets__photos
        op.create_ticket_table("Photos", increment=2, offset=2)     # even ids (server 2 of 2)
        op.create_ticket_table(bits=32)                             # Flickr's Tickets32
        op.create_ticket_tables(["Orders", "Invoices"])            # many at once

    def downgrade():
        op.drop_ticket_tables(["Orders", "Invoices"])
        op.drop_ticket_table("Photos")

Arguments are validated when the operation is built, before any SQL is emitted or written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from alembic.operations import MigrateOperation, Operations

from .._naming import (
    DEFAULT_LEASE_TABLE,
    DEFAULT_TABLE_TEMPLATE,
    DEFAULT_TIER_PREFIX,
    TicketTable,
    TierTables,
    check_bits,
    check_stride,
    check_table_template,
    ticket_table,
    tier_tables,
)
from ..errors import TicketsError

# The dialect modules are imported when an operation runs, not when the operations are
# registered (every `import alembic` does that, through the package's plugin entry point).
if TYPE_CHECKING:
    from .._schema import TableSpec

__all__ = [
    "CreateDatacenterTablesOp",
    "CreateTicketTableOp",
    "CreateTicketTablesOp",
    "CreateWorkerLeaseTableOp",
    "DropDatacenterTablesOp",
    "DropWorkerLeaseTableOp",
    "DropTicketTableOp",
    "DropTicketTablesOp",
    "RestrideTicketTableOp",
    "SyncTicketSequenceOp",
]


class _TicketTableOp(MigrateOperation):
    """What both operations share: which sequence, at which width, under which table template."""

    def __init__(
        self,
        sequence: str | None = None,
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        self.table_template = check_table_template(table_template)
        # Validates the name (TicketsError for anything but a plain identifier) and the width.
        self.ticket_table: TicketTable = ticket_table(sequence, bits, self.table_template)
        self.sequence = sequence
        self.bits = self.ticket_table.bits

    @property
    def table_name(self) -> str:
        """The name of the ticket table (``tickets__photos``, ``Tickets64``, ...)."""
        return self.ticket_table.name

    def render_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that differ from the defaults (what autogenerate writes)."""
        return _width_kwargs(self.bits, self.table_template)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.table_name}>"


def _width_kwargs(bits: int, table_template: str) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if bits != 64:
        kw["bits"] = bits
    if table_template != DEFAULT_TABLE_TEMPLATE:
        kw["table_template"] = table_template
    return kw


def _stride_kwargs(start: int, increment: int, offset: int) -> dict[str, Any]:
    return {
        name: value
        for name, value in (("start", start), ("increment", increment), ("offset", offset))
        if value != 1
    }


@Operations.register_operation("create_ticket_table")
class CreateTicketTableOp(_TicketTableOp):
    """Create the one-row ticket table of a sequence (``None``: Flickr's ``Tickets64``/``32``).

    The first id issued is the smallest id >= ``start`` that is congruent to ``offset``
    modulo ``increment``. On MySQL/MariaDB, Flickr's tables take their stride from the server's
    ``auto_increment_increment``/``auto_increment_offset``: online, a requested stride other
    than 1/1 is checked against the server before anything is created.
    """

    def __init__(
        self,
        sequence: str | None = None,
        *,
        bits: int = 64,
        start: int = 1,
        increment: int = 1,
        offset: int = 1,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        super().__init__(sequence, bits=bits, table_template=table_template)
        check_stride(start, increment, offset, self.bits)
        self.start = start
        self.increment = increment
        self.offset = offset

    @property
    def spec(self) -> TableSpec:
        """What the backend needs to build the DDL and the seed row."""
        from .._schema import TableSpec

        return TableSpec(self.ticket_table, self.start, self.increment, self.offset)

    @classmethod
    def create_ticket_table(
        cls,
        operations: Operations,
        sequence: str | None = None,
        *,
        bits: int = 64,
        start: int = 1,
        increment: int = 1,
        offset: int = 1,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        """Create the ticket table of ``sequence`` and its seed row (if it does not exist).

        :param sequence: the sequence name (case-insensitive); ``None``: Flickr's ``Tickets64``
            (``bits=32``: ``Tickets32``).
        :param bits: 64 or 32, the width of the ids.
        :param start: the first id issued is the smallest id >= ``start`` that is congruent to
            ``offset`` modulo ``increment``.
        :param increment: the stride (the number of ticket servers, e.g. 2 for odd/even).
        :param offset: 1..increment, this server's position among its peers.
        :param table_template: how a sequence name becomes a table name; must match the
            ``table_template`` of the sources that draw from it.
        """
        op = cls(
            sequence,
            bits=bits,
            start=start,
            increment=increment,
            offset=offset,
            table_template=table_template,
        )
        operations.invoke(op)

    def reverse(self) -> DropTicketTableOp:
        return DropTicketTableOp(
            self.sequence,
            bits=self.bits,
            table_template=self.table_template,
            _reverse=self,
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_ticket_table", self.ticket_table)

    def render_kwargs(self) -> dict[str, Any]:
        stride = _stride_kwargs(self.start, self.increment, self.offset)
        return {**super().render_kwargs(), **stride}


@Operations.register_operation("drop_ticket_table")
class DropTicketTableOp(_TicketTableOp):
    """Drop the ticket table of a sequence (if it exists). Its ids are gone with it."""

    def __init__(
        self,
        sequence: str | None = None,
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
        _reverse: CreateTicketTableOp | None = None,
    ) -> None:
        super().__init__(sequence, bits=bits, table_template=table_template)
        self._reverse = _reverse

    @classmethod
    def drop_ticket_table(
        cls,
        operations: Operations,
        sequence: str | None = None,
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        """Drop the ticket table of ``sequence`` (``None``: Flickr's ``Tickets64``/``32``)."""
        operations.invoke(cls(sequence, bits=bits, table_template=table_template))

    def reverse(self) -> CreateTicketTableOp:
        if self._reverse is not None:
            return self._reverse
        return CreateTicketTableOp(
            self.sequence, bits=self.bits, table_template=self.table_template
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_ticket_table", self.ticket_table)


class _TicketTablesOp(MigrateOperation):
    """What both operations on many sequences share: which sequences, at which width, under
    which table template."""

    def __init__(
        self,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        if isinstance(sequences, (str, bytes)):
            raise TicketsError(
                f"sequences must be a list of names, not the string {sequences!r} "
                "(op.create_ticket_tables([name]), or op.create_ticket_table(name))"
            )
        self.table_template = check_table_template(table_template)
        self.bits = check_bits(bits)
        #: The names as given (what autogenerate writes).
        self.sequences: list[str | None] = list(sequences)
        # Validates every name (TicketsError for anything but a plain identifier); a sequence
        # named twice ("Photos", "photos") is one table.
        tables: dict[str, TicketTable] = {}
        for sequence in self.sequences:
            table = ticket_table(sequence, self.bits, self.table_template)
            tables.setdefault(table.name, table)
        self.ticket_tables: list[TicketTable] = list(tables.values())

    @property
    def table_names(self) -> list[str]:
        """The names of the ticket tables, each once, in the order of ``sequences``."""
        return [table.name for table in self.ticket_tables]

    def render_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that differ from the defaults (what autogenerate writes)."""
        return _width_kwargs(self.bits, self.table_template)

    def __repr__(self) -> str:
        names = self.table_names
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f"<{type(self).__name__} {shown}>"


@Operations.register_operation("create_ticket_tables")
class CreateTicketTablesOp(_TicketTablesOp):
    """Create the ticket tables of many sequences, all with one stride: what
    :class:`CreateTicketTableOp` does for each, in one operation (see
    :meth:`create_ticket_tables` for how it uses the migration's transaction)."""

    def __init__(
        self,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        start: int = 1,
        increment: int = 1,
        offset: int = 1,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        super().__init__(sequences, bits=bits, table_template=table_template)
        check_stride(start, increment, offset, self.bits)
        self.start = start
        self.increment = increment
        self.offset = offset

    @property
    def specs(self) -> list[TableSpec]:
        """What the backend needs to build each table's DDL and seed row."""
        from .._schema import TableSpec

        return [
            TableSpec(table, self.start, self.increment, self.offset)
            for table in self.ticket_tables
        ]

    @classmethod
    def create_ticket_tables(
        cls,
        operations: Operations,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        start: int = 1,
        increment: int = 1,
        offset: int = 1,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        """Create the ticket tables of ``sequences`` and their seed rows (those that exist
        are left as they are), as :meth:`create_ticket_table` does for one. Every name is
        checked before any SQL is emitted or written.

        **Transactions.** Online, the tables are created in the migration's transaction, as
        any other operation's DDL: on PostgreSQL the migration stays all or nothing, but each
        new table holds six slots of the server's shared lock table until COMMIT, and there
        are ``max_locks_per_transaction`` (64) x ``max_connections`` (100) of them by default
        — a migration creating about a thousand tables (fewer beside other work) fails with
        "out of shared memory". For thousands of tables, either raise
        ``max_locks_per_transaction``, split them over several migrations, or run the
        operation in an autocommit block, where it commits in batches of 100 tables, each
        created under the same creation locks as ``TicketServer.create_tables`` (so running
        clients never see a table without its row)::

            with op.get_context().autocommit_block():
                op.create_ticket_tables(names)

        (An autocommit block first commits what the migration did before it: Alembic
        recommends ``transaction_per_migration=True`` with it.) The operation does not
        commit on its own: a migration's transaction is its author's to end. Offline
        (``--sql``) the script holds every statement, in the script's transaction.

        :param sequences: sequence names (case-insensitive); ``None`` is Flickr's
            ``Tickets64`` (``bits=32``: ``Tickets32``).
        :param bits, start, increment, offset, table_template: as for
            :meth:`create_ticket_table`, the same for every table.
        """
        op = cls(
            sequences,
            bits=bits,
            start=start,
            increment=increment,
            offset=offset,
            table_template=table_template,
        )
        operations.invoke(op)

    def reverse(self) -> DropTicketTablesOp:
        return DropTicketTablesOp(
            self.sequences, bits=self.bits, table_template=self.table_template, _reverse=self
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_ticket_tables", tuple(self.ticket_tables))

    def render_kwargs(self) -> dict[str, Any]:
        stride = _stride_kwargs(self.start, self.increment, self.offset)
        return {**super().render_kwargs(), **stride}


@Operations.register_operation("drop_ticket_tables")
class DropTicketTablesOp(_TicketTablesOp):
    """Drop the ticket tables of many sequences (those that exist). Their ids are gone with
    them."""

    def __init__(
        self,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
        _reverse: CreateTicketTablesOp | None = None,
    ) -> None:
        super().__init__(sequences, bits=bits, table_template=table_template)
        self._reverse = _reverse

    @classmethod
    def drop_ticket_tables(
        cls,
        operations: Operations,
        sequences: Iterable[str | None],
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        """Drop the ticket tables of ``sequences``, as :meth:`drop_ticket_table` does for one.
        Online in the migration's transaction, each dropped table holds lock slots until
        COMMIT as a created one does (see :meth:`create_ticket_tables`); in an autocommit
        block each statement commits at once."""
        operations.invoke(cls(sequences, bits=bits, table_template=table_template))

    def reverse(self) -> CreateTicketTablesOp:
        if self._reverse is not None:
            return self._reverse
        return CreateTicketTablesOp(
            self.sequences, bits=self.bits, table_template=self.table_template
        )

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_ticket_tables", tuple(self.ticket_tables))


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}\Z")


def _identifier(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        raise TicketsError(f"invalid {kind} name {name!r}: use a plain SQL identifier")
    return name


@Operations.register_operation("sync_ticket_sequence")
class SyncTicketSequenceOp(_TicketTableOp):
    """Move a sequence above ``max(column)`` of an application table in the same database —
    the cut-over of a model from auto-increment to ``TicketId`` (Flickr synced its Photos
    sequence to the old auto-increment table). The statement that ``sqlalchemy-tickets sync``
    runs, with ``max(column)`` read by the database as it runs: one UPDATE that never moves a
    sequence down, so it is safe beside running clients, and the same online and in ``--sql``
    scripts. Autogenerate proposes it (see :mod:`sqlalchemy_tickets.alembic.compare`).
    Irreversible: its reverse does nothing (ids are never handed out twice).

    ``embedded``: the sequence is the embedded default's. On a SQLite file the embedded
    default keeps its ticket tables in the ``-tickets`` sibling file: the operation attaches
    it, makes the ticket table there if it is missing (as the embedded default would on first
    use, with its stamp table), moves it, and detaches it. Elsewhere the embedded default's
    tables are the migrated database's, and ``embedded`` changes nothing."""

    def __init__(
        self,
        sequence: str | None,
        table: str,
        column: str = "id",
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
        embedded: bool = False,
    ) -> None:
        super().__init__(sequence, bits=bits, table_template=table_template)
        self.table = _identifier("table", table)
        self.column = _identifier("column", column)
        if not isinstance(embedded, bool):
            raise TicketsError(f"embedded must be True or False, not {embedded!r}")
        self.embedded = embedded

    @classmethod
    def sync_ticket_sequence(
        cls,
        operations: Operations,
        sequence: str | None,
        table: str,
        column: str = "id",
        *,
        bits: int = 64,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
        embedded: bool = False,
    ) -> None:
        """Make every id ``sequence`` issues from now on larger than ``max(table.column)``.

        :param sequence: the sequence name (case-insensitive); ``None``: Flickr's ``Tickets64``
            (``bits=32``: ``Tickets32``). Its ticket table must exist in the migrated database
            (but see ``embedded``).
        :param table: the application table whose ids the sequence must pass.
        :param column: its integer key (the column an auto-increment filled).
        :param embedded: the sequence is the embedded default's: on a SQLite file, its
            ticket table is in the ``-tickets`` sibling file (made there if missing).
        """
        operations.invoke(
            cls(sequence, table, column, bits=bits, table_template=table_template,
                embedded=embedded)
        )

    def reverse(self) -> MigrateOperation:
        return _NoOp()

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("sync_ticket_sequence", self.ticket_table, self.table, self.column)

    def render_kwargs(self) -> dict[str, Any]:
        kw = super().render_kwargs()
        if self.embedded:
            kw["embedded"] = True
        return kw

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.table_name} above {self.table}.{self.column}>"


@Operations.register_operation("restride_ticket_table")
class RestrideTicketTableOp(_TicketTableOp):
    """Give one server's named sequence a new stride, its next id above ``above`` (default:
    above its own last id). For a maintenance window, server by server with the same
    ``above``; with clients running, use ``sqlalchemy-tickets restride``, which pauses every
    server first."""

    def __init__(
        self,
        sequence: str,
        *,
        increment: int,
        offset: int,
        above: int = 0,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        super().__init__(sequence, bits=64, table_template=table_template)
        if sequence is None:
            raise TicketsError(
                "Flickr's tables take their stride from the server's auto_increment_* "
                "settings; restride named sequences only"
            )
        check_stride(max(1, above), increment, offset, 64)
        self.increment = increment
        self.offset = offset
        self.above = above

    @classmethod
    def restride_ticket_table(
        cls,
        operations: Operations,
        sequence: str,
        *,
        increment: int,
        offset: int,
        above: int = 0,
        table_template: str = DEFAULT_TABLE_TEMPLATE,
    ) -> None:
        """Set ``sequence``'s increment and offset; its next id is above ``above`` and above
        every id it issued."""
        operations.invoke(
            cls(sequence, increment=increment, offset=offset, above=above,
                table_template=table_template)
        )

    def reverse(self) -> MigrateOperation:
        return _NoOp()


class _NoOp(MigrateOperation):
    """The reverse of an operation that cannot be undone without reissuing ids."""


class _LeaseTableOp(MigrateOperation):
    """What both lease-table operations share: the table's (validated) name."""

    def __init__(self, *, name: str = DEFAULT_LEASE_TABLE) -> None:
        self.name = _identifier("table", name)


@Operations.register_operation("create_worker_lease_table")
class CreateWorkerLeaseTableOp(_LeaseTableOp):
    """Create the table ``SnowflakeId`` leases its worker ids from (if it does not exist)."""

    @classmethod
    def create_worker_lease_table(
        cls, operations: Operations, *, name: str = DEFAULT_LEASE_TABLE
    ) -> None:
        """Create the worker-id lease table."""
        operations.invoke(cls(name=name))

    def reverse(self) -> DropWorkerLeaseTableOp:
        return DropWorkerLeaseTableOp(name=self.name)


@Operations.register_operation("drop_worker_lease_table")
class DropWorkerLeaseTableOp(_LeaseTableOp):
    """Drop the worker-id lease table (it forgets each worker's last timestamp)."""

    @classmethod
    def drop_worker_lease_table(
        cls, operations: Operations, *, name: str = DEFAULT_LEASE_TABLE
    ) -> None:
        """Drop the worker-id lease table."""
        operations.invoke(cls(name=name))

    def reverse(self) -> CreateWorkerLeaseTableOp:
        return CreateWorkerLeaseTableOp(name=self.name)


class _DatacenterTablesOp(MigrateOperation):
    """What both datacenter-tier operations share: the tier's (validated) table prefix."""

    def __init__(self, *, table_prefix: str = DEFAULT_TIER_PREFIX) -> None:
        # Validates the prefix (TicketsError before any SQL) and names both tables.
        self.names: TierTables = tier_tables(table_prefix)
        self.table_prefix = table_prefix

    def render_kwargs(self) -> dict[str, Any]:
        """Keyword arguments that differ from the defaults (what autogenerate writes)."""
        if self.table_prefix == DEFAULT_TIER_PREFIX:
            return {}
        return {"table_prefix": self.table_prefix}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.names.stock}, {self.names.state}>"


@Operations.register_operation("create_datacenter_tables")
class CreateDatacenterTablesOp(_DatacenterTablesOp):
    """Create a datacenter tier's two tables, ``<prefix>__stock`` and ``<prefix>__state`` (if
    they do not exist): the DDL that
    :func:`~sqlalchemy_tickets.sources.datacenter.create_datacenter_tables` runs."""

    @classmethod
    def create_datacenter_tables(
        cls, operations: Operations, *, table_prefix: str = DEFAULT_TIER_PREFIX
    ) -> None:
        """Create the tables of the datacenter tier whose tables start with ``table_prefix``
        (``DatacenterTier(..., table_prefix=...)``; default ``tickets_dc``)."""
        operations.invoke(cls(table_prefix=table_prefix))

    def reverse(self) -> DropDatacenterTablesOp:
        return DropDatacenterTablesOp(table_prefix=self.table_prefix)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("add_datacenter_tables", self.names.stock, self.names.state)


@Operations.register_operation("drop_datacenter_tables")
class DropDatacenterTablesOp(_DatacenterTablesOp):
    """Drop a datacenter tier's two tables (if they exist). The ids in stock are gone with
    them — burned, never issued twice — and every process using the tier fails until the
    tables are back."""

    @classmethod
    def drop_datacenter_tables(
        cls, operations: Operations, *, table_prefix: str = DEFAULT_TIER_PREFIX
    ) -> None:
        """Drop the tables of the datacenter tier whose tables start with ``table_prefix``."""
        operations.invoke(cls(table_prefix=table_prefix))

    def reverse(self) -> CreateDatacenterTablesOp:
        return CreateDatacenterTablesOp(table_prefix=self.table_prefix)

    def to_diff_tuple(self) -> tuple[Any, ...]:
        return ("remove_datacenter_tables", self.names.stock, self.names.state)
