"""RFC 9562 UUIDv7: 48-bit Unix milliseconds, version 7, random bits — as ``uuid.UUID``.

``uuid7()`` is the fastest implementation available, chosen once, on first use (not at import):

1. ``uuid_utils`` (Rust) when installed — the ``fast`` extra. Its generator keeps a counter in
   the bits after the timestamp (RFC 9562 §6.2 method 1), so ids are strictly increasing within
   the process; the tests check this. We build the standard-library ``uuid.UUID`` from its
   integer directly (``object.__new__`` and the two slots), skipping ``UUID.__init__``'s parsing.
2. ``uuid.uuid7`` of the standard library on Python >= 3.14 (same counter method, 42 bits).
   CPython keeps its counter in unlocked module globals; we call it under a lock so concurrent
   threads still get increasing ids.
3. :class:`UUID7Generator`, pure Python, otherwise: 48-bit ms | ver | 42-bit counter (12 bits in
   ``rand_a``, 30 in ``rand_b``) | 32 random bits from ``os.urandom``. A new millisecond seeds the
   counter with 41 random bits (top bit zero: the RFC's rollover guard); later ids in the same
   millisecond add one; if 2**42 ids were ever taken in one millisecond, or the clock stepped
   back, the timestamp is carried forward instead, so order holds whatever the clock does.

Storage (the ``UUID7`` column type uses ``sqlalchemy.Uuid``): PostgreSQL ``UUID`` (16 bytes);
MariaDB >= 10.7 ``UUID`` (16 bytes; v7 values keep their order since MariaDB 10.11.1); MySQL and
SQLite ``CHAR(32)`` hex.
"""

from __future__ import annotations

import os
import sys
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from .. import _process
from .._deprecation import time_ns_keyword
from ..errors import TicketsError

__all__ = [
    "IMPLEMENTATION",
    "UUID7Generator",
    "uuid7",
    "uuid7_from_fields",
    "uuid7_time",
]

_UUID = uuid.UUID
_new = object.__new__
_set_int = _UUID.__dict__["int"].__set__
_set_safe = _UUID.__dict__["is_safe"].__set__
_UNKNOWN = uuid.SafeUUID.unknown

_VERSION_VARIANT = (0x7 << 76) | (0b10 << 62)
_MASK_30 = (1 << 30) - 1
_COUNTER_MAX = (1 << 42) - 1


def _from_int(value: int) -> uuid.UUID:
    """A ``uuid.UUID`` from its 128-bit integer, without ``UUID.__init__``'s argument parsing."""
    u: uuid.UUID = _new(_UUID)
    _set_int(u, value)
    _set_safe(u, _UNKNOWN)
    return u


def uuid7_from_fields(unix_ts_ms: int, rand_a: int, rand_b: int) -> uuid.UUID:
    """Assemble a UUIDv7 from its RFC 9562 fields (48-bit ms, 12-bit rand_a, 62-bit rand_b)."""
    if not (0 <= unix_ts_ms < 1 << 48 and 0 <= rand_a < 1 << 12 and 0 <= rand_b < 1 << 62):
        raise TicketsError(
            "UUIDv7 fields out of range: unix_ts_ms < 2**48, rand_a < 2**12, rand_b < 2**62"
        )
    return _from_int((unix_ts_ms << 80) | _VERSION_VARIANT | (rand_a << 64) | rand_b)


def uuid7_time(value: uuid.UUID) -> datetime:
    """The creation time (UTC, millisecond precision) a UUIDv7 carries."""
    if value.version != 7:
        raise TicketsError(f"{value} is a version {value.version} UUID, not version 7")
    return datetime.fromtimestamp((value.int >> 80) / 1000, tz=timezone.utc)


class UUID7Generator:
    """Pure-Python, thread-safe UUIDv7 generator (RFC 9562 §6.2 method 1, 42-bit counter).

    Args:
        time_ns: reads the time, as integer nanoseconds since the Unix epoch (default
            ``time.time_ns``; tests inject one). ``clock=`` is a deprecated alias.
        randbytes: ``n -> n random bytes`` (default ``os.urandom``, read 4 KiB at a time).
    """

    def __init__(
        self,
        *,
        time_ns: Callable[[], int] | None = None,
        clock: Callable[[], int] | None = None,
        randbytes: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self.time_ns = time_ns_keyword("UUID7Generator", time_ns, clock)
        self.randbytes = randbytes
        self.new_id: Callable[[], uuid.UUID]
        self._reinit: Callable[[], None]
        self._build()
        _process.track(self)

    def _build(self) -> None:
        clock = self.time_ns
        randbytes = self.randbytes
        lock = threading.Lock()
        last_ms = -1
        counter = 0
        high = 0  # timestamp, version and variant bits of the current millisecond
        pool = b""
        pos = 0
        from_bytes = int.from_bytes
        from_int = _from_int

        def take(n: int) -> int:
            nonlocal pool, pos
            if pos + n > len(pool):
                pool = randbytes(4096)
                pos = 0
            p = pos
            pos = p + n
            return from_bytes(pool[p : p + n], "big")

        def new_id() -> uuid.UUID:
            nonlocal last_ms, counter, high
            ms = clock() // 1_000_000
            lock.acquire()
            try:
                if ms > last_ms:
                    c = take(6) & 0x1FFFFFFFFFF  # 41 random bits: the counter's top bit is zero
                else:
                    ms = last_ms
                    c = counter + 1
                    if c > _COUNTER_MAX:
                        ms += 1
                        c = take(6) & 0x1FFFFFFFFFF
                if ms != last_ms:
                    if ms >> 48 or ms < 0:
                        raise TicketsError(
                            f"clock reads {ms} ms since 1970: outside UUIDv7's 48 bits"
                        )
                    last_ms = ms
                    high = (ms << 80) | _VERSION_VARIANT
                counter = c
                value = high | ((c >> 30) << 64) | ((c & _MASK_30) << 32) | take(4)
            finally:
                lock.release()
            return from_int(value)

        def reinit() -> None:
            nonlocal lock, pool, pos
            lock = threading.Lock()
            pool = b""
            pos = 0

        self.new_id = new_id
        self._reinit = reinit

    def _after_fork_in_child(self) -> None:
        """The parent's random state and last id must not be reused: start afresh."""
        self._reinit()

    def __repr__(self) -> str:
        return "UUID7Generator()"


#: Orders the ids of ``uuid_utils`` (see ``uuid7_fast``); a lock held at a fork is not the child's.
_order = threading.Lock()


def _after_fork_in_child() -> None:
    global _chosen_lock, _order
    _chosen_lock = threading.Lock()
    _order = threading.Lock()


_process.after_fork_in_child(_after_fork_in_child)


def _select() -> tuple[str, Callable[[], uuid.UUID]]:
    try:
        import uuid_utils
    except ImportError:
        pass
    else:
        # The integer-returning entry point (uuid_utils >= 0.10) skips uuid_utils' own object.
        uuid7_int: Callable[[], int] = getattr(
            uuid_utils, "_uuid7_int", lambda: uuid_utils.uuid7().int
        )

        last = 0

        def uuid7_fast() -> uuid.UUID:
            """A new UUIDv7 (``uuid_utils``), increasing within the process."""
            nonlocal last
            value = uuid7_int()
            with _order:
                # uuid_utils 0.12-0.13 (at least) let the counter of a busy millisecond wrap
                # around without moving on: a smaller id, about once in a million. The next
                # millisecond's ids are larger again; wait for one (rare, at most ~1 ms).
                while value <= last:
                    value = uuid7_int()
                last = value
            u: uuid.UUID = _new(_UUID)
            _set_int(u, value)
            _set_safe(u, _UNKNOWN)
            return u

        return "uuid_utils", uuid7_fast
    stdlib: Any = getattr(uuid, "uuid7", None)
    if sys.version_info >= (3, 14) and stdlib is not None:
        lock = threading.Lock()

        def uuid7_stdlib() -> uuid.UUID:
            """A new UUIDv7 (standard library, called under a lock)."""
            with lock:
                value: uuid.UUID = stdlib()
            return value

        return "stdlib", uuid7_stdlib
    return "python", UUID7Generator().new_id


#: Which implementation :func:`uuid7` uses: ``"uuid_utils"``, ``"stdlib"`` or ``"python"``
#: (read lazily through the module's ``__getattr__``: reading it makes the choice).
IMPLEMENTATION: str

# Chosen on first use, not at import: importing the package must not import ``uuid_utils``,
# an optional extra (and a module the user may not want loaded at all).
_chosen: tuple[str, Callable[[], uuid.UUID]] | None = None
_chosen_lock = threading.Lock()


def _choose() -> tuple[str, Callable[[], uuid.UUID]]:
    global _chosen, _impl
    with _chosen_lock:
        if _chosen is None:
            _chosen = _select()
            _impl = _chosen[1]
    return _chosen


def _first_uuid7() -> uuid.UUID:
    return _choose()[1]()


_impl: Callable[[], uuid.UUID] = _first_uuid7


def uuid7() -> uuid.UUID:
    """A new UUIDv7 as ``uuid.UUID``, strictly increasing within the process."""
    return _impl()


def __getattr__(name: str) -> str:
    if name == "IMPLEMENTATION":
        return _choose()[0]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
