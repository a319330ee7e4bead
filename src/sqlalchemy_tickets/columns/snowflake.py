"""``SnowflakeId``: a BIGINT key computed in the application (41-bit ms time, 10-bit worker,
12-bit sequence), its worker id fixed, leased from a given database, or leased from the
database the first row goes to.

Generators are shared per configuration within a process (two ``SnowflakeId(worker_id=3)``
columns draw from one sequence, so they can never issue the same id), and the ``repr`` names
only what the column's meaning depends on — never a lease database URL, so Alembic
autogenerate does not copy credentials into migration files.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine
from sqlalchemy.types import TypeDecorator

from .._deprecation import renamed_keyword
from ..errors import TicketsError
from ..generators import _registry
from ..generators.snowflake import (
    DEFAULT_MAX_BACKWARD_MS,
    TWITTER_EPOCH_MS,
    SnowflakeGenerator,
    SnowflakeLayout,
    SnowflakeParts,
    epoch_ms,
)
from ._assign import AssignedIdType, EngineGetter

# Leases (sources.lease, and with it every source and the dialect modules) are imported when a
# column first needs one, not with the column type.
if TYPE_CHECKING:
    from ..sources.lease import WorkerLease

#: ``sources.lease.DEFAULT_NAMESPACE``, spelled out: a default argument cannot wait for the
#: import (a unit test holds the two equal).
DEFAULT_NAMESPACE = "default"

__all__ = ["SnowflakeId"]


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
            ``Engine`` or a :class:`~sqlalchemy_tickets.sources.lease.WorkerLease`. ``None`` (with
            ``worker_id=None``): lease from the database the first row goes to (SQLite: its
            ``-tickets`` sibling file); ``new_id()`` then works after the first insert.
        lease_namespace, lease_ttl: the lease's id space and lifetime in seconds.
        epoch: Unix ms or ``datetime``; default Twitter's (2010-11-04T01:42:54.657Z).
        timestamp_bits, worker_bits, sequence_bits: the layout (sum <= 63).
        max_backward_ms: backward clock steps up to this are waited out; larger ones raise.
        time_ns: reads the time as integer nanoseconds since the Unix epoch (tests); default
            ``time.time_ns``. ``clock=`` is a deprecated alias.
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
        time_ns: Callable[[], int] | None = None,
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
        self.time_ns = renamed_keyword("SnowflakeId", "clock", "time_ns", clock, time_ns)
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
        key = (who, self.epoch, self.layout, self.max_backward_ms, self.time_ns)

        def make() -> SnowflakeGenerator:
            lease = None if self.worker_id is not None else _lease(self, bind)
            extra: dict[str, Any] = {} if self.time_ns is None else {"time_ns": self.time_ns}
            return SnowflakeGenerator(
                self.worker_id,
                lease=lease,
                epoch=self.epoch,
                layout=self.layout,
                max_backward_ms=self.max_backward_ms,
                **extra,
            )

        # An injected time source (tests) is held only while a column uses it.
        return _registry.snowflakes.get(key, make, weak=self.time_ns is not None)

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
            from ..dialects import backend_for

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
        from ..generators.snowflake import parse

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
    from ..sources.lease import WorkerLease

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
    """The shared WorkerLease for a bind (held while a generator uses it)."""
    from ..sources.lease import WorkerLease

    if isinstance(bind, WorkerLease):
        return bind
    return _registry.leases.get(
        _lease_key(type_, bind),
        lambda: WorkerLease(bind, namespace=type_.lease_namespace, ttl=type_.lease_ttl),
        weak=True,
    )


SnowflakeId.__module__ = "sqlalchemy_tickets"
