"""What the string id columns (``PrefixedId``, ``ObjectId``) share: byte-ordered ASCII storage,
the operators whose right-hand side is a whole id, and the checks a bound value goes through."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import operators
from sqlalchemy.types import TypeEngine

from ._assign import AssignedIdType, EngineGetter


def ascii_string(length: int) -> TypeEngine[str]:
    """VARCHAR whose order is byte order and whose keys take one byte per character."""
    # Imported here, when a string id column is defined: SQLAlchemy's MySQL dialect package
    # costs every ``import sqlalchemy_tickets`` a tenth of a second otherwise.
    from sqlalchemy.dialects import mysql

    return (
        sa.String(length)
        .with_variant(
            mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
        )
        .with_variant(sa.String(length, collation="C"), "postgresql")
    )


# Operators whose right-hand side is a whole id (checked); LIKE patterns and the rest are not.
WHOLE_ID_OPERATORS = frozenset(
    {
        operators.eq,
        operators.ne,
        operators.lt,
        operators.le,
        operators.gt,
        operators.ge,
        operators.in_op,
        operators.not_in_op,
        operators.between_op,
        operators.not_between_op,
        operators.is_distinct_from,
        operators.is_not_distinct_from,
    }
)


class TextId(AssignedIdType):
    """Mixin of the string id types: a ``generator`` shared per configuration, ``new_id`` its
    callable, and ``process_bind_param`` that refuses a value of the wrong shape."""

    generator: Hashable
    new_id: Callable[[], str]

    @property
    def python_type(self) -> type[str]:
        return str

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        raise NotImplementedError

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return self if op in WHOLE_ID_OPERATORS else sa.String()

    def check_assigned(self, value: Any) -> None:
        # A flush refuses a foreign value itself, as a plain TicketsError (a ValueError),
        # rather than as the StatementError SQLAlchemy wraps bind-time errors in.
        self.process_bind_param(value, None)

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return self.generator

    def new_ids(self, engine: EngineGetter, count: int) -> list[str]:
        new_id = self.new_id
        return [new_id() for _ in range(count)]
