"""``TicketId``: an integer key drawn from a ticket sequence (a source), before the INSERT."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.types import TypeDecorator

from .._naming import check_bits, normalize_sequence
from ..sources.base import TicketSource, take
from ..sources.default import resolve
from ._assign import AssignedIdType, EngineGetter

__all__ = ["TicketId"]


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
        if source is not None and not isinstance(source, TicketSource):
            from ..errors import TicketsError

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
        return take(self._source(engine), self.sequence, count, self.bits)

    def _source(self, engine: EngineGetter) -> TicketSource:
        return resolve(self.source, engine)

    def copy(self, **kw: Any) -> TicketId:
        return TicketId(self.sequence, bits=self.bits, source=self.source)


TicketId.__module__ = "sqlalchemy_tickets"
