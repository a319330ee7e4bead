"""sqlalchemy-tickets: globally unique, compact, time-ordered primary keys for SQLAlchemy.

Ids are given to objects before the INSERT — from Flickr-style ticket servers, or computed in the
application — so a unit of work that timed out can be retried with the same keys.
"""

from __future__ import annotations

from ._reset import drop_ticket_tables
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
from .retry import async_retry_session, is_retryable, retry_session
from .sources import (
    CachedSource,
    DatacenterTier,
    TicketServer,
    TicketServers,
    TicketSource,
    configure,
)
from .timeouts import apply_timeouts


def __getattr__(name: str) -> str:
    # ``__version__`` is read from the installed metadata when first asked for: importlib.metadata
    # would otherwise cost every import of the package a scan of the installed distributions.
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("sqlalchemy-tickets")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        found = "0.0.0"
    globals()["__version__"] = found
    return found


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
