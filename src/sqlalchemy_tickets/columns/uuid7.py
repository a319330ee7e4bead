"""``UUID7``: an RFC 9562 UUIDv7 key computed in the application."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..errors import TicketsError
from ..generators.uuid7 import uuid7
from ._assign import AssignedIdType, EngineGetter

__all__ = ["UUID7"]


class UUID7(AssignedIdType, TypeDecorator[uuid.UUID]):
    """An RFC 9562 UUIDv7 key (``uuid.UUID``), stored with ``sqlalchemy.Uuid``: native ``UUID``
    on PostgreSQL and MariaDB >= 10.7, ``CHAR(32)`` hex on MySQL and SQLite.

    Values bound may be ``uuid.UUID``, anything with a 128-bit ``int`` (``uuid_utils.UUID``)
    or a UUID string.
    """

    impl = sa.Uuid
    cache_ok = True
    new_id: Callable[[], uuid.UUID]

    def __init__(self) -> None:
        super().__init__()
        self.new_id = uuid7

    @property
    def python_type(self) -> type[uuid.UUID]:
        return uuid.UUID

    def process_bind_param(self, value: Any, dialect: Dialect) -> uuid.UUID | None:
        if value is None or type(value) is uuid.UUID:
            return value
        if isinstance(value, uuid.UUID):
            return value
        if isinstance(value, str):
            try:
                return uuid.UUID(value)
            except ValueError:
                raise TicketsError(f"{value!r} is not a UUID") from None
        number = getattr(value, "int", None)
        if isinstance(number, int) and 0 <= number < 1 << 128:
            return uuid.UUID(int=number)
        raise TicketsError(f"a UUID7 column takes uuid.UUID values, not {type(value).__name__}")

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return UUID7

    def new_ids(self, engine: EngineGetter, count: int) -> list[uuid.UUID]:
        new_id = self.new_id
        return [new_id() for _ in range(count)]

    def __repr__(self) -> str:
        return "UUID7()"


UUID7.__module__ = "sqlalchemy_tickets"
