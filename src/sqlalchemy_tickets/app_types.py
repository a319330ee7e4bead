"""Column types whose ids are computed in the application: no ticket server, no round trip.

``SnowflakeId``, ``UUID7``, ``PrefixedId`` and ``ObjectId`` plug into the same flush-time
assignment as ``TicketId`` (``flush.AssignedIdType``): pending ORM objects get their ids in
``before_flush``, Core and ORM bulk inserts through the column default, and an id the user set
is kept. Each type has ``new_id()``, the callable its default uses.

Generators are shared per configuration within a process (two ``SnowflakeId(worker_id=3)``
columns draw from one sequence, so they can never issue the same id), and their ``repr`` names
only what the column's meaning depends on — never a lease database URL, so Alembic
autogenerate does not copy credentials into migration files.

Storage:

=============  ===============================  =========================================
type           PostgreSQL                       MySQL / MariaDB / SQLite
=============  ===============================  =========================================
SnowflakeId    BIGINT                           BIGINT
UUID7          UUID (16 bytes)                  MariaDB >= 10.7: UUID (16 bytes); MySQL,
                                                SQLite: CHAR(32) hex (``sqlalchemy.Uuid``)
PrefixedId     VARCHAR(n) COLLATE "C"           VARCHAR(n) ascii / ascii_bin (MySQL);
                                                VARCHAR(n) (SQLite, binary collation)
ObjectId       VARCHAR(24) COLLATE "C"          VARCHAR(24) ascii / ascii_bin; VARCHAR(24)
=============  ===============================  =========================================

The ``C`` / ``ascii_bin`` collations make the database order prefixed ids byte by byte — the
order they were made in — and keep index keys one byte per character.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, Dialect, Engine
from sqlalchemy.sql import operators
from sqlalchemy.types import TypeDecorator, TypeEngine

from .dialects import backend_for
from .errors import TicketsError
from .flush import AssignedIdType, EngineGetter
from .generators.lease import DEFAULT_NAMESPACE, WorkerLease
from .generators.objectid import ObjectIdGenerator, check_object_id
from .generators.prefixed import (
    BODY_LENGTH,
    FORMATS,
    PrefixedIdGenerator,
    check_prefix,
    check_value,
)
from .generators.snowflake import (
    DEFAULT_MAX_BACKWARD_MS,
    TWITTER_EPOCH_MS,
    SnowflakeGenerator,
    SnowflakeLayout,
    SnowflakeParts,
    epoch_ms,
)
from .generators.uuid7 import uuid7

__all__ = ["ObjectId", "PrefixedId", "SnowflakeId", "UUID7"]

_registry_lock = threading.Lock()
_snowflakes: dict[Hashable, SnowflakeGenerator] = {}
_leases: dict[Hashable, WorkerLease] = {}
_prefixed: dict[Hashable, PrefixedIdGenerator] = {}
_object_ids: ObjectIdGenerator | None = None


def _ascii_string(length: int) -> TypeEngine[str]:
    """VARCHAR whose order is byte order and whose keys take one byte per character."""
    return (
        sa.String(length)
        .with_variant(
            mysql.VARCHAR(length, charset="ascii", collation="ascii_bin"), "mysql", "mariadb"
        )
        .with_variant(sa.String(length, collation="C"), "postgresql")
    )


# -- SnowflakeId ----------------------------------------------------------------------------------


class _SnowflakeSlot:
    """Holds the generator of a ``SnowflakeId`` once known; shared by copies of the type."""

    __slots__ = ("generator",)

    def __init__(self, generator: SnowflakeGenerator | None) -> None:
        self.generator = generator


class SnowflakeId(AssignedIdType, TypeDecorator[int]):
    """A BIGINT Snowflake key: 41-bit ms since ``epoch``, 10-bit worker, 12-bit sequence.

    ``mapped_column(SnowflakeId(worker_id=3), primary_key=True)`` needs nothing else.

    Args:
        worker_id: this process's worker id, unique among processes writing the same tables.
        worker_lease: with ``worker_id=None``, where to lease a worker id: a URL, an
            ``Engine`` or a :class:`~sqlalchemy_tickets.generators.WorkerLease`. ``None`` (with
            ``worker_id=None``): lease from the database the first row goes to (SQLite: its
            ``-tickets`` sibling file); ``new_id()`` then works after the first insert.
        lease_namespace, lease_ttl: the lease's id space and lifetime in seconds.
        epoch: Unix ms or ``datetime``; default Twitter's (2010-11-04T01:42:54.657Z).
        timestamp_bits, worker_bits, sequence_bits: the layout (sum <= 63).
        max_backward_ms: backward clock steps up to this are waited out; larger ones raise.
        clock: nanoseconds since the Unix epoch (tests); default ``time.time_ns``.
    """

    impl = sa.BigInteger
    cache_ok = True
    new_id: Callable[[], int]

    def __init__(
        self,
        *,
        worker_id: int | None = None,
        worker_lease: str | URL | Engine | WorkerLease | None = None,
        lease_namespace: str = DEFAULT_NAMESPACE,
        lease_ttl: float = 30.0,
        epoch: int | datetime = TWITTER_EPOCH_MS,
        timestamp_bits: int = 41,
        worker_bits: int = 10,
        sequence_bits: int = 12,
        max_backward_ms: int = DEFAULT_MAX_BACKWARD_MS,
        clock: Callable[[], int] | None = None,
    ) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.worker_lease = worker_lease
        self.lease_namespace = lease_namespace
        self.lease_ttl = lease_ttl
        self.epoch = epoch_ms(epoch)
        self.timestamp_bits = timestamp_bits
        self.worker_bits = worker_bits
        self.sequence_bits = sequence_bits
        self.max_backward_ms = max_backward_ms
        self.clock = clock
        self.layout = SnowflakeLayout(timestamp_bits, worker_bits, sequence_bits)
        if worker_id is not None and worker_lease is not None:
            raise TicketsError("SnowflakeId takes worker_id or worker_lease, not both")
        # Validate everything now (bad worker ids, layouts, epochs) rather than at first insert.
        SnowflakeGenerator(
            worker_id if worker_id is not None else 0,
            epoch=self.epoch,
            layout=self.layout,
            max_backward_ms=max_backward_ms,
        )
        generator = None
        if worker_id is not None:
            generator = self._generator(("worker", worker_id), None)
        elif worker_lease is not None:
            generator = self._generator(("lease", _lease_key(self, worker_lease)), worker_lease)
        self._slot = _SnowflakeSlot(generator)
        self.new_id = generator.new_id if generator is not None else self._new_id_unresolved

    def _generator(self, who: Hashable, bind: Any) -> SnowflakeGenerator:
        key = (who, self.epoch, self.layout, self.max_backward_ms, self.clock)
        with _registry_lock:
            found = _snowflakes.get(key)
            if found is None:
                lease = None if self.worker_id is not None else _lease(self, bind)
                extra: dict[str, Any] = {} if self.clock is None else {"clock": self.clock}
                found = SnowflakeGenerator(
                    self.worker_id,
                    lease=lease,
                    epoch=self.epoch,
                    layout=self.layout,
                    max_backward_ms=self.max_backward_ms,
                    **extra,
                )
                _snowflakes[key] = found
        return found

    def _new_id_unresolved(self) -> int:
        generator = self._slot.generator
        if generator is None:
            raise TicketsError(
                "SnowflakeId() has no worker id yet: it leases one from the database of the "
                "first row inserted. Pass worker_id=N or worker_lease=URL to call new_id() "
                "before any insert"
            )
        return generator.new_id()

    @property
    def generator(self) -> SnowflakeGenerator | None:
        """The generator behind this column (``None`` until a lease database is known)."""
        return self._slot.generator

    def _resolve(self, engine: EngineGetter) -> SnowflakeGenerator:
        generator = self._slot.generator
        if generator is None:
            app = engine()
            url = backend_for(app.url.get_backend_name()).embedded_url(app.url)
            generator = self._generator(("lease", _lease_key(self, url)), url)
            self._slot.generator = generator
        return generator

    @property
    def python_type(self) -> type[int]:
        return int

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return self._slot

    def new_ids(self, engine: EngineGetter, count: int) -> list[int]:
        return self._resolve(engine).new_ids(count)

    def parse(self, value: int) -> SnowflakeParts:
        """Time, worker and sequence of an id of this column's layout and epoch."""
        from .generators.snowflake import parse

        return parse(value, epoch=self.epoch, layout=self.layout)

    def __repr__(self) -> str:
        args = []
        if self.worker_id is not None:
            args.append(f"worker_id={self.worker_id!r}")
        if self.epoch != TWITTER_EPOCH_MS:
            args.append(f"epoch={self.epoch!r}")
        for name, default in (("timestamp_bits", 41), ("worker_bits", 10), ("sequence_bits", 12)):
            if getattr(self, name) != default:
                args.append(f"{name}={getattr(self, name)!r}")
        return f"SnowflakeId({', '.join(args)})"


def _lease_key(type_: SnowflakeId, bind: object) -> Hashable:
    if isinstance(bind, WorkerLease):
        return bind
    if isinstance(bind, Engine):
        bind = bind.url
    url = sa.make_url(bind) if isinstance(bind, str) else bind
    if not isinstance(url, URL):
        raise TicketsError(
            f"worker_lease must be a URL, an Engine or a WorkerLease, not {type(bind).__name__}"
        )
    return (url.render_as_string(hide_password=False), type_.lease_namespace, type_.lease_ttl)


def _lease(type_: SnowflakeId, bind: Any) -> WorkerLease:
    """The shared WorkerLease for a bind (call with the registry lock held)."""
    if isinstance(bind, WorkerLease):
        return bind
    key = _lease_key(type_, bind)
    found = _leases.get(key)
    if found is None:
        found = _leases[key] = WorkerLease(
            bind, namespace=type_.lease_namespace, ttl=type_.lease_ttl
        )
    return found


# -- UUID7 ----------------------------------------------------------------------------------------


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


# -- PrefixedId -----------------------------------------------------------------------------------

# Operators whose right-hand side is a whole id (checked); LIKE patterns and the rest are not.
_WHOLE_ID_OPERATORS = frozenset(
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


class PrefixedId(AssignedIdType, TypeDecorator[str]):
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
        if format not in FORMATS:
            raise TicketsError(f"format must be one of {FORMATS}, not {format!r}")
        self.prefix = check_prefix(prefix, allow_empty=format == "typeid")
        self.format = format
        self.secure = bool(secure)
        self.length = len(prefix) + (1 if prefix else 0) + BODY_LENGTH
        super().__init__(self.length)
        self.impl = _ascii_string(self.length)  # type: ignore[assignment]
        key = (self.prefix, format, self.secure)
        with _registry_lock:
            generator = _prefixed.get(key)
            if generator is None:
                generator = _prefixed[key] = PrefixedIdGenerator(
                    prefix, format=format, secure=self.secure
                )
        self.generator = generator
        self.new_id = generator.new_id

    @property
    def python_type(self) -> type[str]:
        return str

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) and hasattr(value, "suffix") and hasattr(value, "prefix"):
            value = str(value)  # typeid.TypeID
        return check_value(self.prefix, value)

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return self if op in _WHOLE_ID_OPERATORS else sa.String()

    def check_assigned(self, value: Any) -> None:
        # A flush refuses a foreign prefix itself, as a plain TicketsError (a ValueError),
        # rather than as the StatementError SQLAlchemy wraps bind-time errors in.
        self.process_bind_param(value, None)  # type: ignore[arg-type]

    def assign_group(self, engine: EngineGetter) -> Hashable:
        return self.generator

    def new_ids(self, engine: EngineGetter, count: int) -> list[str]:
        new_id = self.new_id
        return [new_id() for _ in range(count)]

    def __repr__(self) -> str:
        args = [repr(self.prefix)]
        if self.format != "ulid":
            args.append(f"format={self.format!r}")
        if not self.secure:
            args.append("secure=False")
        return f"PrefixedId({', '.join(args)})"


# -- ObjectId -------------------------------------------------------------------------------------


class ObjectId(AssignedIdType, TypeDecorator[str]):
    """A MongoDB ObjectId key as 24 lowercase hex characters (``VARCHAR(24)``).

    Bound values may be hex strings (any case), 12 bytes or ``bson.ObjectId`` objects.
    """

    impl = sa.String
    cache_ok = True
    new_id: Callable[[], str]

    def __init__(self) -> None:
        global _object_ids
        super().__init__(24)
        self.impl = _ascii_string(24)  # type: ignore[assignment]
        with _registry_lock:
            if _object_ids is None:
                _object_ids = ObjectIdGenerator()
            self.generator = _object_ids
        self.new_id = self.generator.new_id

    @property
    def python_type(self) -> type[str]:
        return str

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else check_object_id(value)

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return self if op in _WHOLE_ID_OPERATORS else sa.String()

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


for _type in (SnowflakeId, UUID7, PrefixedId, ObjectId):
    _type.__module__ = "sqlalchemy_tickets"
