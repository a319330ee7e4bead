"""``ObjectId``: a MongoDB ObjectId key as 24 lowercase hex characters, computed in the
application, stored as byte-ordered ASCII ``VARCHAR(24)``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..generators import _registry
from ..generators.objectid import ObjectIdGenerator, check_object_id
from ._text import TextId, ascii_string

__all__ = ["ObjectId"]


class ObjectId(TextId, TypeDecorator[str]):
    """A MongoDB ObjectId key as 24 lowercase hex characters (``VARCHAR(24)``).

    Bound values may be hex strings (any case), 12 bytes or ``bson.ObjectId`` objects.
    """

    impl = sa.String
    cache_ok = True
    new_id: Callable[[], str]

    def __init__(self) -> None:
        super().__init__(24)
        self.impl = ascii_string(24)  # type: ignore[assignment]
        self.generator = _registry.object_ids.get(None, ObjectIdGenerator)
        self.new_id = self.generator.new_id

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else check_object_id(value)

    def __repr__(self) -> str:
        return "ObjectId()"


ObjectId.__module__ = "sqlalchemy_tickets"
