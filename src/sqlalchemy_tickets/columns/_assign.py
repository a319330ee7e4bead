"""Ids given to rows before any SQL runs: at ``before_flush`` for the ORM, through the column
default for Core and ORM bulk inserts.

An id column's type is an :class:`AssignedIdType`. When its column joins a table the type gives it
a default (unless the user gave one) — the Core path. In ``before_flush`` every pending object that
lacks an id gets one, grouped so that one ``next_block`` serves every object of a
(source, sequence, bits) in the flush — the ORM path. Since the objects hold their ids before the
INSERT, the ORM sends one plain executemany, and a retried flush reuses the same ids.

The first time a type meets a table in a process (``unmet_floors``), the ids drawn are looked
for among the table's keys on a connection of the library's own (a few primary-key index
lookups, ``_floors.py``: never through the caller's connection or transaction); where one is
there, the source is told that ids up to the table's largest key are in use (``keep_above``)
and the ids are drawn again: a table moved from auto-increment, or a ticket database restored
from an older backup, never gets a key it already holds.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Mapper, Session, UOWTransaction
from sqlalchemy.sql.schema import ColumnDefault
from sqlalchemy.util.concurrency import await_only, in_greenlet

from ..errors import TicketsError

EngineGetter = Callable[[], Engine]

_T = TypeVar("_T")

__all__ = ["AssignedIdType"]


class AssignedIdType:
    """Mixin for column types whose values are chosen by the application before the INSERT."""

    def assign_group(self, engine: EngineGetter) -> Hashable:
        """Ids of columns in one group are drawn together (one round trip per flush)."""
        raise NotImplementedError

    def new_ids(self, engine: EngineGetter, count: int) -> list[Any]:
        """``count`` fresh ids for rows written through ``engine()``."""
        raise NotImplementedError

    def check_assigned(self, value: Any) -> None:
        """Refuse a value set by hand that the column cannot hold (``TicketsError``), at flush
        time, before any SQL runs. The default accepts everything."""

    def unmet_floors(
        self, engine: EngineGetter, columns: list[sa.Column[Any]]
    ) -> list[sa.Column[Any]]:
        """The columns among ``columns`` whose largest value the source has not been told of
        in this process (see :meth:`keep_above`). The default: none."""
        return []

    def keep_above(
        self, engine: EngineGetter, floor: int, columns: list[sa.Column[Any]]
    ) -> None:
        """Tell the source that ids up to ``floor`` (the largest key of ``columns``) are in
        use; ``columns`` are met from now on."""

    # SQLAlchemy calls this when the type is given to a Column (SchemaEventTarget protocol).
    def _set_parent(self, parent: Any, outer: bool = False, **kw: Any) -> None:
        if isinstance(parent, sa.Column):
            parent._on_table_attach(self._on_table_attach)

    def _on_table_attach(self, column: sa.Column[Any], table: sa.Table) -> None:
        # A foreign key that borrowed this type refers to ids; it must not mint new ones.
        if column.foreign_keys or column.default is not None or column.server_default is not None:
            return
        ColumnDefault(_core_default(self))._set_parent_with_dispatch(column)


def _core_default(type_: AssignedIdType) -> Callable[[Any], Any]:
    key = object()

    def default(context: Any) -> Any:
        """One id per row; for an executemany or a multi-VALUES insert, one block for all its
        rows."""
        connection: Connection = context.connection

        def engine() -> Engine:
            return connection.engine

        def draw(count: int) -> list[Any]:
            ids, unchecked = _draw(type_, engine, count, columns)
            if unchecked:
                ids = _settle(type_, engine, ids, unchecked, lambda: connection)
            return ids

        statement = getattr(context.compiled, "statement", None)
        if isinstance(statement, sa.Insert) and statement.select is not None:
            raise TicketsError(
                f"{context.current_column} has no value in an INSERT ... FROM SELECT, and a "
                "default gives one value to the whole statement, not one per row: select the "
                "rows and insert them with conn.execute(table.insert(), rows), or give the "
                "column in the SELECT (ids from source.next_block(...))"
            )
        # A multi-VALUES insert asks once per row, the rows after the first through a stand-in
        # of the column (SQLAlchemy's ``_multiparam_column``), which knows its ``original``.
        column = getattr(context.current_column, "original", context.current_column)
        columns = [column]
        rows = _rows(context)
        if rows <= 1:
            return draw(1)[0]
        pending: dict[object, Any] = context.__dict__.setdefault("_sqlalchemy_tickets", {})
        ids = pending.get(key)
        if ids is None:
            ids = pending[key] = iter(draw(rows))
        try:
            return next(ids)
        except StopIteration:
            return draw(1)[0]

    return default


def _rows(context: Any) -> int:
    """How many rows the statement of ``context`` inserts: those of an executemany, or of a
    multi-VALUES insert (one parameter set whose values name each row's column: SQLAlchemy asks
    the default once per row)."""
    rows = len(context.compiled_parameters)
    if rows == 1:
        multi = getattr(getattr(context.compiled, "statement", None), "_multi_values", None)
        if multi:
            rows = sum(len(group) for group in multi)
    return rows


def _draw(
    type_: AssignedIdType,
    engine: EngineGetter,
    count: int,
    columns: list[sa.Column[Any]],
) -> tuple[list[Any], list[sa.Column[Any]]]:
    """``count`` new ids; and the columns among ``columns`` whose largest key must still be
    read through the caller's connection, once the ids are given (an in-memory SQLite database,
    which no other connection sees).

    The first time the type meets one of ``columns`` here, the ids are looked for among their
    keys on the library's own connection to the application's database (``_floors.py``: never
    through the caller's connection or transaction); where one is there, the source is told the
    table's largest key and ids are drawn again (those are burned: keys the table holds, or
    below them)."""
    unmet = type_.unmet_floors(engine, columns)
    ids = _off_the_loop(type_.new_ids, engine, count)
    if not unmet:
        return ids, []
    from ._floors import keys_in_use  # the library's connections: only once a check is due

    floor = _off_the_loop(keys_in_use, engine(), unmet, ids)
    if floor is None:
        return ids, unmet
    return _off_the_loop(_keep_above, type_, engine, floor, unmet, ids), []


def _settle(
    type_: AssignedIdType,
    engine: EngineGetter,
    ids: list[Any],
    columns: list[sa.Column[Any]],
    connection: Callable[[], Connection],
) -> list[Any]:
    """:func:`_draw`'s check of ``ids`` against ``columns`` on ``connection()`` (the caller's,
    in its context), after the ids were given; the ids to keep (new ones if any was in use)."""
    from ._floors import floor_of

    floor = floor_of(connection(), columns, ids)
    return _off_the_loop(_keep_above, type_, engine, floor, columns, ids)

def _keep_above(
    type_: AssignedIdType,
    engine: EngineGetter,
    floor: int,
    columns: list[sa.Column[Any]],
    ids: list[Any],
) -> list[Any]:
    """``ids`` if they are all above ``floor`` (0: none of them is a key of the table: nothing
    to tell the source); else the source is told of ``floor`` and new ids are drawn (those are
    burned: keys the table holds, or below them)."""
    if all(not isinstance(i, int) or i > floor for i in ids):
        type_.keep_above(engine, 0, columns)  # met: the table's keys are below the source
        return ids
    type_.keep_above(engine, floor, columns)
    return type_.new_ids(engine, len(ids))


#: What one group of a flush draws: the type, the engine, the (object dict, key) pairs to fill,
#: the columns they fill and the mapper of the first.
_Group = tuple[
    AssignedIdType, EngineGetter, list[tuple[Any, str]], list["sa.Column[Any]"], Mapper[Any]
]

_Plan = tuple[tuple[str, AssignedIdType, "sa.Column[Any]"], ...]

# Per mapper: (attribute key, type, column) of every id column the flush must fill.
_plans: weakref.WeakKeyDictionary[Mapper[Any], _Plan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def _plan(mapper: Mapper[Any]) -> _Plan:
    plan = _plans.get(mapper)
    if plan is None:
        found: dict[str, tuple[AssignedIdType, sa.Column[Any]]] = {}
        for prop in mapper.column_attrs:
            for column in prop.columns:
                if (
                    isinstance(column, sa.Column)
                    and isinstance(column.type, AssignedIdType)
                    and not column.foreign_keys
                ):
                    found.setdefault(prop.key, (column.type, column))
        plan = tuple((key, type_, column) for key, (type_, column) in found.items())
        with _plans_lock:
            _plans[mapper] = plan
    return plan


@event.listens_for(Session, "before_flush")
def _assign_ids(session: Session, flush_context: UOWTransaction, instances: Any) -> None:
    # Per object this is on every flush's path, for every model: group the pending states by
    # mapper first, so models without id columns cost one dict append, and the plan, the
    # engine and the group of each id column are worked out once per mapper, not per object.
    by_class: dict[Any, list[Any]] = {}
    for state, obj in session._new.items():
        found = by_class.get(state.manager)
        if found is None:
            by_class[state.manager] = [obj]
        else:
            found.append(obj)
    groups: dict[Hashable, _Group] = {}
    for manager, objects in by_class.items():
        mapper = manager.mapper
        plan = _plan(mapper)
        if not plan:
            continue
        # The objects' attribute dicts, fetched once: InstanceState.dict is a property.
        dicts = list(map(manager.dict_getter(), objects))
        engine = _engine_getter(session, mapper)
        for key, type_, column in plan:
            if type(type_).check_assigned is not AssignedIdType.check_assigned:
                for values in dicts:
                    value = values.get(key)
                    if value is not None:
                        type_.check_assigned(value)
            targets = [(values, key) for values in dicts if values.get(key) is None]
            if not targets:
                continue
            group = type_.assign_group(engine)
            entry = groups.get(group)
            if entry is None:
                groups[group] = (type_, engine, targets, [column], mapper)
            else:
                entry[2].extend(targets)
                if column not in entry[3]:
                    entry[3].append(column)
    for type_, engine, targets, columns, mapper in groups.values():
        new_ids, unchecked = _draw(type_, engine, len(targets), columns)
        _give(targets, new_ids)
        if not unchecked:
            continue

        def flushing(mapper: Mapper[Any] = mapper) -> Connection:
            # In-memory SQLite: the flushing connection (no other one sees the database), in
            # its transaction, now that the objects hold their ids.
            return session.connection(bind_arguments={"mapper": mapper})

        kept = _settle(type_, engine, new_ids, unchecked, flushing)
        if kept is not new_ids:
            _give(targets, kept)


def _give(targets: list[tuple[Any, str]], ids: list[Any]) -> None:
    for (values, key), new_id in zip(targets, ids, strict=True):
        # Straight into the object's state: a pending object's INSERT is built from it, and no
        # history is needed for a key that was never loaded.
        values[key] = new_id


def _engine_getter(session: Session, mapper: Mapper[Any]) -> EngineGetter:
    """The engine rows of ``mapper`` go to, looked up only if a source needs it (only the
    embedded default does)."""
    found: list[Engine] = []

    def engine() -> Engine:
        if not found:
            _refuse_sharded(session, mapper)
            bind = session.get_bind(mapper)
            found.append(bind.engine if isinstance(bind, Connection) else bind)
        return found[0]

    return engine


def _refuse_sharded(session: Session, mapper: Mapper[Any]) -> None:
    """Refuse the embedded default (and a ``SnowflakeId`` lease beside the data) under a
    ``ShardedSession``.

    Its rows go to many databases, and the embedded default counts in the database it is
    given: asked without an instance (the ids are not there yet), a shard chooser either
    fails or names one shard, and nothing makes every process pick the same one, so ids would
    repeat across shards. Only a source shared by every shard keeps them unique.
    """
    # Only a program that imported horizontal_shard can have a ShardedSession: never import it.
    module = sys.modules.get("sqlalchemy.ext.horizontal_shard")
    if module is not None and isinstance(session, module.ShardedSession):
        raise TicketsError(
            f"{mapper.class_.__name__}: under a ShardedSession, ids must come from a source "
            "shared by every shard, and none is configured (the embedded default would keep "
            "its counters on whichever shard the chooser names, and ids would repeat across "
            "shards); call sqlalchemy_tickets.configure(url or source) or pass "
            "TicketId(source=...) (SnowflakeId: worker_lease=URL or worker_id=N)"
        )


def _off_the_loop(fn: Callable[..., _T], *args: Any) -> _T:
    """Call ``fn``; under ``AsyncSession`` (a flush inside SQLAlchemy's greenlet), in a worker
    thread awaited by the event loop, so a ticket round trip never blocks the loop."""
    # Without greenlet loaded no AsyncSession can be flushing; and on SQLAlchemy 2.1 without
    # greenlet installed, in_greenlet() itself raises ImportError.
    if sys.modules.get("greenlet") is not None and in_greenlet():
        import asyncio  # here: most processes never need the event loop machinery

        return await_only(asyncio.to_thread(fn, *args))
    return fn(*args)
