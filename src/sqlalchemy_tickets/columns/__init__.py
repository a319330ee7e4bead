"""Column types: what a model declares. Each gives its rows an id before any SQL runs
(:mod:`._assign`): ``TicketId`` from a ticket source, the others computed in the application."""

from __future__ import annotations

from ._assign import AssignedIdType
from .objectid import ObjectId
from .prefixed import PrefixedId
from .snowflake import SnowflakeId
from .ticket import TicketId
from .uuid7 import UUID7

__all__ = ["UUID7", "AssignedIdType", "ObjectId", "PrefixedId", "SnowflakeId", "TicketId"]
