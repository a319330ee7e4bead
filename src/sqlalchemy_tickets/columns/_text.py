"""What the string id columns (``PrefixedId``, ``ObjectId``) share: byte-ordered ASCII storage
and the operators whose right-hand side is a whole id."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.sql import operators
from sqlalchemy.types import TypeEngine


def ascii_string(length: int) -> TypeEngine[str]:
    """VARCHAR whose order is byte order and whose keys take one byte per character."""
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
