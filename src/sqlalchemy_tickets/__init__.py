"""sqlalchemy-tickets: globally unique, compact, time-ordered primary keys for SQLAlchemy.

Ids are given to objects before the INSERT — from Flickr-style ticket servers, or computed in the
application — so a unit of work that timed out can be retried with the same keys.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

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

try:
    __version__ = version("sqlalchemy-tickets")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

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
