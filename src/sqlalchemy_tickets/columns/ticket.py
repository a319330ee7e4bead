"""``TicketId``: an integer key drawn from a ticket sequence (a source), before the INSERT."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.types import TypeDecorator

from .._naming import check_bits, normalize_sequence
from ..errors import TicketsError
from ._assign import AssignedIdType, EngineGetter

# The sources (servers, caches, tiers, the embedded default: most of the package, with the
# dialect modules) are imported where ids are first drawn, not with the column type: defining
# a model or importing the package does not need them.
if TYPE_CHECKING:
    from ..sources.base import TicketSource

__all__ = ["TicketId"]

# Per source, per application engine: the (table, column) pairs whose largest key the source
# has been told of in this process. Weak both ways: an engine per test must not accumulate.
_met: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Engine, set[tuple[str, str]]]] = (
    weakref.WeakKeyDictionary()
)
_met_lock = threading.Lock()


def _met_for(source: Any, engine: Engine) -> set[tuple[str, str]] | None:
    """The set of met columns of ``source`` on ``engine`` (``None``: ``source`` cannot be
    held weakly, so floors are not kept for it)."""
    with _met_lock:
        try:
            per_engine = _met.get(source)
            if per_engine is None:
                per_engine = _met[source] = weakref.WeakKeyDictionary()
        except TypeError:
            return None
        found = per_engine.get(engine)
        if found is None:
            found = per_engine[engine] = set()
        return found


def _column_key(column: sa.Column[Any]) -> tuple[str, str]:
    return (column.table.fullname if column.table is not None else "", column.name)


class TicketId(AssignedIdType, TypeDecorator[int]):
    """An integer key drawn from a ticket sequence: ``mapped_column(TicketId("Photos"),
    primary_key=True)`` needs nothing else.

    Args:
        sequence: the sequence name (case-insensitive); ``None`` draws from Flickr's
            ``Tickets64`` (``bits=32``: ``Tickets32``) table.
        bits: 64 (BIGINT, ids up to 2**63-1) or 32 (INTEGER, up to 2**31-1).
        source: where ids come from; default: what :func:`configure` set, else the embedded
            default (ticket tables beside the application's data).
    """

    impl = sa.BigInteger
    cache_ok = True

    def __init__(
        self, sequence: str | None = None, *, bits: int = 64, source: TicketSource | None = None
    ) -> None:
        self.bits = check_bits(bits)
        self.sequence = normalize_sequence(sequence)
        if source is not None and not _is_source(source):
            raise TicketsError(f"{source!r} is not a ticket source (needs next_id, next_block)")
        self.source = source
        super().__init__()
        if bits == 32:
            self.impl = sa.Integer()  # type: ignore[assignment]

    @property
    def python_type(self) -> type[int]:
        return int

    def __repr__(self) -> str:
        args = [] if self.sequence is None else [repr(self.sequence)]
        if self.bits != 64:
            args.append(f"bits={self.bits}")
        return f"TicketId({', '.join(args)})"

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return (self._source(engine), self.sequence, self.bits)

    def new_ids(self, engine: EngineGetter, count: int) -> list[int]:
        from ..sources.base import take

        return take(self._source(engine), self.sequence, count, self.bits)

    def unmet_floors(
        self, engine: EngineGetter, columns: list[sa.Column[Any]]
    ) -> list[sa.Column[Any]]:
        from ..sources.base import KeepsAbove

        source = self._source(engine)
        if not isinstance(source, KeepsAbove):
            return []
        try:
            app = engine()
        except TicketsError:
            return []  # a ShardedSession: its rows go to many databases
        met = _met_for(source, app)
        if met is None:
            return []
        return [c for c in columns if _column_key(c) not in met]

    def keep_above(self, engine: EngineGetter, floor: int, columns: list[sa.Column[Any]]) -> None:
        from ..sources.base import ensure_above_in

        source = self._source(engine)
        if floor > 0:
            ensure_above_in(source, self.sequence, floor, self.bits)
        met = _met_for(source, engine())
        if met is not None:
            with _met_lock:
                met.update(map(_column_key, columns))

    def _source(self, engine: EngineGetter) -> TicketSource:
        from ..sources.default import resolve

        return resolve(self.source, engine)

    def copy(self, **kw: Any) -> TicketId:
        return TicketId(self.sequence, bits=self.bits, source=self.source)


def _is_source(source: object) -> bool:
    from ..sources.base import TicketSource

    return isinstance(source, TicketSource)


TicketId.__module__ = "sqlalchemy_tickets"
