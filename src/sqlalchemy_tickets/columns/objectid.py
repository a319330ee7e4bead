"""``ObjectId``: a MongoDB ObjectId key as 24 lowercase hex characters, computed in the
application, stored as byte-ordered ASCII ``VARCHAR(24)``."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..generators import _registry
from ..generators.objectid import ObjectIdGenerator, check_object_id
from ._assign import AssignedIdType, EngineGetter
from ._text import WHOLE_ID_OPERATORS, ascii_string

__all__ = ["ObjectId"]


class ObjectId(AssignedIdType, TypeDecorator[str]):
    """A MongoDB ObjectId key as 24 lowercase hex characters (``VARCHAR(24)``).

    Bound values may be hex strings (any case), 12 bytes or ``bson.ObjectId`` objects.
    """

    impl = sa.String
    cache_ok = True
    new_id: Callable[[], str]

    def __init__(self) -> None:
        super().__init__(24)
        self.impl = ascii_string(24)  # type: ignore[assignment]
        with _registry.lock:
            if _registry.object_ids is None:
                _registry.object_ids = ObjectIdGenerator()
            self.generator = _registry.object_ids
        self.new_id = self.generator.new_id

    @property
    def python_type(self) -> type[str]:
        return str

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else check_object_id(value)

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return self if op in WHOLE_ID_OPERATORS else sa.String()

    def check_assigned(self, value: Any) -> None:
        # A flush refuses a foreign prefix itself, as a plain TicketsError (a ValueError),
        # rather than as the StatementError SQLAlchemy wraps bind-time errors in.
        self.process_bind_param(value, None)  # type: ignore[arg-type]

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return self.generator

    def new_ids(self, engine: EngineGetter, count: int) -> list[str]:
        return self.generator.new_ids(count)

    def __repr__(self) -> str:
        return "ObjectId()"


ObjectId.__module__ = "sqlalchemy_tickets"
