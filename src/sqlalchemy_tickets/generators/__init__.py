"""Ids computed in the application, no database round trip: Snowflake, UUIDv7, prefixed
(ULID / TypeID) and MongoDB ObjectIds. The column types wrapping them live in
:mod:`sqlalchemy_tickets.columns`; worker-id leases for Snowflake (which need a database) in
:mod:`sqlalchemy_tickets.sources.lease`, re-exported here.
"""

from __future__ import annotations

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
