"""``PrefixedId``: a string key like ``post_01jd5m8w3kx…`` (a ULID or TypeID body), computed in
the application, its prefix checked on every value bound.

Stored as ``VARCHAR(n) COLLATE "C"`` (PostgreSQL), ``VARCHAR(n)`` ascii / ascii_bin (MySQL,
MariaDB) or ``VARCHAR(n)`` (SQLite, binary collation): the database orders ids byte by byte —
the order they were made in — and index keys take one byte per character.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from ..generators import _registry
from ..generators.prefixed import (
    BODY_LENGTH,
    PrefixedIdGenerator,
    check_prefix_and_format,
    check_value,
)
from ._text import TextId, ascii_string

__all__ = ["PrefixedId"]


class PrefixedId(TextId, TypeDecorator[str]):
    """A string key like ``post_01jd5m8w3kx…``: time-ordered, URL-safe, prefix-checked.

    Args:
        prefix: 1-63 lowercase letters/underscores, starting and ending with a letter; with
            ``format="typeid"`` also ``""`` (TypeIDs without a prefix, as the spec allows).
        format: ``"ulid"`` (default: a lowercase ULID body) or ``"typeid"`` (a TypeID: the body
            is a base32 UUIDv7; ``typeid.TypeID.from_string`` reads it).
        secure: random bits from the OS CSPRNG (default) or a seeded PRNG (faster; ids become
            guessable from earlier ones — only where ids are no secret).

    Every value bound — inserted, updated or compared with ``==``/``IN``/``<``… — must be an id
    of this prefix: a ``user_…`` value in a ``post_`` column raises :class:`TicketsError`
    (SQLAlchemy wraps it in ``StatementError``; ``.orig`` is the ``TicketsError``) before any
    SQL is sent.
    ``LIKE``-style patterns are not checked.

    As the primary key of a mapped class, the prefix names the class:
    :func:`sqlalchemy_tickets.lookup` loads a record from its id alone.
    """

    impl = sa.String
    cache_ok = True
    new_id: Callable[[], str]

    def __init__(
        self,
        prefix: str,
        *,
        format: Literal["ulid", "typeid"] = "ulid",
        secure: bool = True,
    ) -> None:
        self.prefix = check_prefix_and_format(prefix, format)
        self.format = format
        self.secure = bool(secure)
        self.length = len(prefix) + (1 if prefix else 0) + BODY_LENGTH
        super().__init__(self.length)
        self.impl = ascii_string(self.length)  # type: ignore[assignment]
        generator = _registry.prefixed.get(
            (self.prefix, format, self.secure),
            lambda: PrefixedIdGenerator(prefix, format=format, secure=self.secure),
        )
        self.generator = generator
        self.new_id = generator.new_id

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) and hasattr(value, "suffix") and hasattr(value, "prefix"):
            value = str(value)  # typeid.TypeID
        return check_value(self.prefix, value)

    def __repr__(self) -> str:
        args = [repr(self.prefix)]
        if self.format != "ulid":
            args.append(f"format={self.format!r}")
        if not self.secure:
            args.append("secure=False")
        return f"PrefixedId({', '.join(args)})"


PrefixedId.__module__ = "sqlalchemy_tickets"
