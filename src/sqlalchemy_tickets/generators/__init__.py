"""Ids computed in the application, no database round trip: Snowflake, UUIDv7, prefixed
(ULID / TypeID) and MongoDB ObjectIds. The column types wrapping them live in
:mod:`sqlalchemy_tickets.columns`; worker-id leases for Snowflake (which need a database) in
:mod:`sqlalchemy_tickets.sources.lease`, re-exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .objectid import ObjectIdGenerator, check_object_id, object_id_time
from .prefixed import PrefixedIdGenerator, PrefixedParts, check_prefix
from .prefixed import parse as parse_prefixed
from .snowflake import (
    TWITTER_EPOCH_MS,
    SnowflakeGenerator,
    SnowflakeLayout,
    SnowflakeParts,
)
from .snowflake import parse as parse_snowflake
from .uuid7 import UUID7Generator, uuid7, uuid7_from_fields, uuid7_time

if TYPE_CHECKING:
    from ..sources.lease import (
        DEFAULT_LEASE_TABLE,
        LeaseGrant,
        LeaseRow,
        WorkerLease,
        create_lease_table,
        drop_lease_table_statements,
        lease_table,
        lease_table_statements,
    )

# The lease names are imported from sources.lease when first asked for: importing it imports
# every source and the dialect modules, which the generators (and the column types built on
# them, imported with the package) do not need.
_FROM_LEASE = frozenset(
    {
        "DEFAULT_LEASE_TABLE",
        "LeaseGrant",
        "LeaseRow",
        "WorkerLease",
        "create_lease_table",
        "drop_lease_table_statements",
        "lease_table",
        "lease_table_statements",
    }
)


def __getattr__(name: str) -> object:
    if name not in _FROM_LEASE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ..sources import lease

    value: object = getattr(lease, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "DEFAULT_LEASE_TABLE",
    "TWITTER_EPOCH_MS",
    "LeaseGrant",
    "LeaseRow",
    "ObjectIdGenerator",
    "PrefixedIdGenerator",
    "PrefixedParts",
    "SnowflakeGenerator",
    "SnowflakeLayout",
    "SnowflakeParts",
    "UUID7Generator",
    "WorkerLease",
    "check_object_id",
    "check_prefix",
    "create_lease_table",
    "drop_lease_table_statements",
    "lease_table",
    "lease_table_statements",
    "object_id_time",
    "parse_prefixed",
    "parse_snowflake",
    "uuid7",
    "uuid7_from_fields",
    "uuid7_time",
]
