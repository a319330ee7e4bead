"""Generators (and worker leases) shared per configuration within a process.

Two ``SnowflakeId(worker_id=3)`` columns must draw from one generator, or they could issue the
same id in the same millisecond; two ``PrefixedId("post")`` columns share one for the same
reason. The column types in :mod:`sqlalchemy_tickets.columns` look their generator up here.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING

from .objectid import ObjectIdGenerator
from .prefixed import PrefixedIdGenerator
from .snowflake import SnowflakeGenerator

if TYPE_CHECKING:
    from ..sources.lease import WorkerLease

lock = threading.Lock()
snowflakes: dict[Hashable, SnowflakeGenerator] = {}
leases: dict[Hashable, WorkerLease] = {}
prefixed: dict[Hashable, PrefixedIdGenerator] = {}
object_ids: ObjectIdGenerator | None = None
