"""sqlalchemy-tickets: globally unique, compact, time-ordered primary keys for SQLAlchemy.

Ids are given to objects before the INSERT — from Flickr-style ticket servers, or computed in the
application — so a unit of work that timed out can be retried with the same keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._hooks import when_first_cache_opens as _when_first_cache_opens
from .columns import UUID7, ObjectId, PrefixedId, SnowflakeId, TicketId
from .errors import (
    CommitOutcomeUnknownError,
    DatabaseUnavailable,
    DriverNotInstalledError,
    ExhaustedError,
    RewindError,
    StrideMismatchError,
    TicketsError,
    TicketServerUnavailable,
    UnknownSequenceError,
)
from .prefix_lookup import async_lookup, lookup

if TYPE_CHECKING:
    from ._reset import drop_ticket_tables
    from .retry import async_retry_session, is_retryable, retry_session
    from .sources import (
        CachedSource,
        DatacenterTier,
        TicketServer,
        TicketServers,
        TicketSource,
        ZooKeeperSource,
        configure,
    )
    from .timeouts import apply_timeouts

    __version__: str

# Imported when first asked for (``sqlalchemy_tickets.configure``, ``from sqlalchemy_tickets
# import TicketServer``): the sources, retrying, timeouts and the test helper bring the dialect
# modules, multiprocessing and a dozen modules of their own, a quarter of what the package would
# otherwise add to ``import sqlalchemy.orm``, and a bare import (the column types, a model, an
# Alembic plugin load) needs none of it. They register nothing at import that a column needs
# first: the column types load the sources when they first draw ids. ``columns`` and
# ``prefix_lookup`` stay eager: they register the global ``before_flush`` and mapper listeners.
_LAZY = {
    "drop_ticket_tables": "._reset",
    "async_retry_session": ".retry",
    "is_retryable": ".retry",
    "retry_session": ".retry",
    "CachedSource": ".sources",
    "DatacenterTier": ".sources",
    "TicketServer": ".sources",
    "TicketServers": ".sources",
    "TicketSource": ".sources",
    "ZooKeeperSource": ".sources",
    "configure": ".sources",
    "apply_timeouts": ".timeouts",
}


def _enable_metrics() -> None:
    # The OpenTelemetry instruments, registered once a cache opens: nothing of metrics (nor of
    # OpenTelemetry, without the otel extra) is imported before.
    from .metrics import enable_if_installed

    enable_if_installed()


_when_first_cache_opens(_enable_metrics)


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is not None:
        from importlib import import_module

        value: object = getattr(import_module(module, __name__), name)
    elif name == "__version__":
        # Read from the installed metadata when first asked for: importlib.metadata would
        # otherwise cost every import of the package a scan of the installed distributions.
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("sqlalchemy-tickets")
        except PackageNotFoundError:  # pragma: no cover - running from a source tree
            value = "0.0.0"
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "UUID7",
    "CachedSource",
    "CommitOutcomeUnknownError",
    "DatabaseUnavailable",
    "DatacenterTier",
    "DriverNotInstalledError",
    "ExhaustedError",
    "ObjectId",
    "PrefixedId",
    "RewindError",
    "SnowflakeId",
    "StrideMismatchError",
    "TicketId",
    "TicketServer",
    "TicketServerUnavailable",
    "TicketServers",
    "TicketSource",
    "TicketsError",
    "UnknownSequenceError",
    "ZooKeeperSource",
    "__version__",
    "apply_timeouts",
    "async_lookup",
    "async_retry_session",
    "configure",
    "drop_ticket_tables",
    "is_retryable",
    "lookup",
    "retry_session",
]
