"""MongoDB ObjectIds: 12 bytes, written as 24 lowercase hex characters.

Layout (the MongoDB ObjectId specification), big-endian::

    4 bytes: Unix seconds | 5 bytes: random, once per process | 3 bytes: counter

The counter starts at a random value and adds one per id (wrapping at 2**24), so ids of one
process are increasing within a second unless the counter wraps; across processes they are
ordered by second only. The 5 random bytes are drawn again in a forked child, as the
specification requires, so parent and child never collide. ``bson.ObjectId(value)`` accepts
every id made here, and ``str(bson.ObjectId())`` is a valid value for the ``ObjectId`` column.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from datetime import datetime, timezone

from .. import _process
from .._deprecation import time_ns_keyword
from ..errors import TicketsError

__all__ = ["ObjectIdGenerator", "check_object_id", "object_id_time"]

_HEX_RE = re.compile(r"[0-9a-f]{24}\Z")


def check_object_id(value: object) -> str:
    """``value`` as 24 lowercase hex characters, or :class:`TicketsError`.

    Accepts a 24-character hex string (any case), 12 bytes, or an object with a 12-byte
    ``binary`` attribute (``bson.ObjectId``).
    """
    if isinstance(value, str):
        text = value.lower()
        if _HEX_RE.match(text):
            return text
        raise TicketsError(f"{value!r} is not an ObjectId: expected 24 hexadecimal characters")
    raw = getattr(value, "binary", value)
    if isinstance(raw, (bytes, bytearray)) and len(raw) == 12:
        return bytes(raw).hex()
    raise TicketsError(
        f"an ObjectId is 24 hex characters, 12 bytes or a bson.ObjectId, not {type(value).__name__}"
    )


def object_id_time(value: str) -> datetime:
    """The creation time (UTC, whole seconds) an ObjectId carries."""
    return datetime.fromtimestamp(int(check_object_id(value)[:8], 16), tz=timezone.utc)


class ObjectIdGenerator:
    """Thread-safe ObjectId generator.

    Args:
        time_ns: reads the time, as integer nanoseconds since the Unix epoch (default
            ``time.time_ns``; tests inject one). ``clock=`` is a deprecated alias.
    """

    def __init__(
        self,
        *,
        time_ns: Callable[[], int] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.time_ns = time_ns_keyword("ObjectIdGenerator", time_ns, clock)
        self._lock = threading.Lock()
        self._process = os.urandom(5).hex()
        self._counter = int.from_bytes(os.urandom(3), "big")
        _process.track(self)

    def new_id(self) -> str:
        """A new ObjectId as 24 lowercase hex characters."""
        seconds = self.time_ns() // 1_000_000_000
        if not 0 <= seconds < 1 << 32:
            raise TicketsError(f"clock reads {seconds} s since 1970: outside ObjectId's 32 bits")
        with self._lock:
            counter = self._counter = (self._counter + 1) & 0xFFFFFF
            process = self._process
        return f"{seconds:08x}{process}{counter:06x}"

    def new_ids(self, count: int) -> list[str]:
        new_id = self.new_id
        return [new_id() for _ in range(count)]

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()
        self._process = os.urandom(5).hex()

    def __repr__(self) -> str:
        return "ObjectIdGenerator()"
