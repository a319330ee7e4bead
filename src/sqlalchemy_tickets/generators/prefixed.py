"""Prefixed string ids: ``post_01jd5m8w3k…`` — Stripe-style, time-ordered, URL-safe.

An id is ``<prefix>_<26 characters>``. The 26 characters are 130 bits in the lowercase
Crockford base32 alphabet ``0123456789abcdefghjkmnpqrstvwxyz`` (no ``i l o u``; digits sort
before letters, so plain byte order is numeric order). The top two bits are zero, so the first
character is ``0``–``7``. The width is fixed, so lexicographic order of ids is the order of
their 128-bit values. Two layouts:

``format="ulid"`` (default) — a ULID (https://github.com/ulid/spec), lowercase:
    48-bit Unix milliseconds | 40-bit counter | 40 random bits.
    Any ULID library reads the body (``ulid.ULID.from_str(body.upper())``).

``format="typeid"`` — a TypeID (https://github.com/jetify-com/typeid, spec v0.3): the body is
    the base32 of an RFC 9562 UUIDv7:
    48-bit ms | ver 0111 | 12 bits of counter | var 10 | 27 bits of counter | 35 random bits.
    ``typeid.TypeID.from_string(value)`` parses it and gives back the UUID. As the spec allows,
    a TypeID may have no prefix at all (``01h455vb4pex5vsknk084sn02q``, no separator): pass
    ``prefix=""`` with ``format="typeid"``.

Reading ids (:func:`split`, :func:`parse`, :func:`check_value`) follows the TypeID spec for
both formats, whose bodies have the same shape; ``tests/data/typeid`` holds the spec's own
valid and invalid examples, which the test suite checks.

Within one generator, ids are strictly increasing — the RFC 9562 §6.2 "fixed-length dedicated
counter" method: each new millisecond seeds the counter with random bits whose top bit is zero
(so it cannot roll over in practice); later ids in that millisecond add one. If the clock steps
back, the last millisecond is kept and the counter goes on, so order survives. Every id still
carries fresh random bits (40 / 35), so knowing one id does not let anyone guess its neighbour.

Randomness: ``secure=True`` (default) reads the operating system's CSPRNG (``os.urandom``) in
4 KiB blocks; ``secure=False`` uses a ``random.Random`` seeded from ``os.urandom`` — a little
faster, but its output can be predicted by someone who has seen enough ids, so use it only where
ids are not secrets (every request is authorized anyway). Both are re-seeded in a forked child.

Speed: the timestamp characters change once per millisecond and the counter's high characters
once per 1,024 ids, so they are cached; per id the generator does one table lookup, one slice of
pre-made random characters and two string concatenations under a lock.
"""

from __future__ import annotations

import os
import random
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from .. import _process
from .._deprecation import time_ns_keyword
from ..errors import TicketsError

__all__ = [
    "ALPHABET",
    "PrefixedIdGenerator",
    "PrefixedParts",
    "check_prefix",
    "check_value",
    "decode_base32",
    "encode_base32",
    "from_uuid",
    "parse",
    "split",
]

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
BODY_LENGTH = 26
MAX_PREFIX_LENGTH = 63  # TypeID's limit
FORMATS = ("ulid", "typeid")

_PREFIX_RE = re.compile(r"[a-z](?:[a-z_]*[a-z])?\Z")
_PAIRS = tuple(ALPHABET[i >> 5] + ALPHABET[i & 31] for i in range(1024))
_TO_INT_DIGITS = str.maketrans(ALPHABET, "0123456789abcdefghijklmnopqrstuv")
# bytes.translate table: a random byte becomes one base32 character (b & 31: uniform, 256 = 8*32).
_BYTE_TO_CHAR = bytes.maketrans(bytes(range(256)), bytes(ord(ALPHABET[b & 31]) for b in range(256)))
_RANDOM_BLOCK = 4096


def check_prefix_and_format(prefix: object, format: object) -> str:
    """The prefix, checked for ``format`` (``"ulid"`` or ``"typeid"``; only a TypeID may have
    an empty prefix); a :class:`TicketsError` for a bad format or prefix."""
    if format not in FORMATS:
        raise TicketsError(f"format must be one of {FORMATS}, not {format!r}")
    return check_prefix(prefix, allow_empty=format == "typeid")


def check_prefix(prefix: object, *, allow_empty: bool = False) -> str:
    """Return ``prefix`` if it is a valid id prefix, else raise :class:`TicketsError`.

    Valid: 1 to 63 lowercase ASCII letters and underscores, starting and ending with a letter
    (TypeID's rule, so every prefix works in both formats). ``allow_empty=True`` also accepts
    ``""``: a TypeID without a type, which the TypeID spec allows.
    """
    if not isinstance(prefix, str):
        raise TicketsError(f"an id prefix must be a string, not {type(prefix).__name__}")
    if not prefix and allow_empty:
        return prefix
    if not prefix and not allow_empty:
        raise TicketsError(
            "an empty id prefix is allowed only with format='typeid' (a TypeID without a "
            "type); give a prefix of lowercase letters, e.g. 'post'"
        )
    if len(prefix) > MAX_PREFIX_LENGTH or not _PREFIX_RE.match(prefix):
        raise TicketsError(
            f"invalid id prefix {prefix!r}: use 1 to {MAX_PREFIX_LENGTH} lowercase letters "
            "a-z and underscores, starting and ending with a letter (e.g. 'post', 'user_key')"
        )
    return prefix


def encode_base32(value: int, width: int = BODY_LENGTH) -> str:
    """``value`` as exactly ``width`` characters of lowercase Crockford base32."""
    if value < 0 or value >> (5 * width):
        raise TicketsError(f"{value} does not fit in {width} base32 characters")
    chars = []
    for _ in range(width):
        chars.append(ALPHABET[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def decode_base32(text: str) -> int:
    """The integer of a lowercase Crockford base32 string (validate the characters first)."""
    if not text or text.strip(ALPHABET):
        raise TicketsError(f"{text!r} is not lowercase Crockford base32 ({ALPHABET})")
    return int(text.translate(_TO_INT_DIGITS), 32)


#: Unix milliseconds of 9999-12-31T23:59:59.999Z, the last instant ``datetime`` can hold.
_MAX_DATETIME_MS = 253_402_300_799_999


@dataclass(frozen=True)
class PrefixedParts:
    """What a prefixed id says about itself."""

    #: The prefix, ``""`` for a TypeID without one.
    prefix: str
    #: Unix milliseconds: the top 48 bits of the body (up to 2**48 - 1, in the year 10889).
    timestamp_ms: int
    #: The 128-bit value of the body.
    value: int

    @property
    def time(self) -> datetime:
        """Creation time (UTC, millisecond precision).

        Raises :class:`TicketsError` for a timestamp after the year 9999, which ``datetime``
        cannot hold (the TypeID spec's ``7zzz…`` example; no id made here is that late):
        read :attr:`timestamp_ms` instead.
        """
        if self.timestamp_ms > _MAX_DATETIME_MS:
            raise TicketsError(
                f"timestamp {self.timestamp_ms} ms is after the year 9999, which a datetime "
                "cannot hold; read .timestamp_ms instead"
            )
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=timezone.utc)

    @property
    def uuid(self) -> uuid.UUID:
        """The body as a UUID (for ``format="typeid"`` this is the UUIDv7 it encodes)."""
        return uuid.UUID(int=self.value)


class _RandomText:
    """Random base32 characters made in bulk: one ``os.urandom`` (or PRNG) call per 4 KiB."""

    __slots__ = ("secure", "_rng")

    def __init__(self, secure: bool) -> None:
        self.secure = secure
        self._rng = random.Random(os.urandom(32)) if not secure else None

    def block(self) -> str:
        raw = os.urandom(_RANDOM_BLOCK) if self._rng is None else self._rng.randbytes(_RANDOM_BLOCK)
        return raw.translate(_BYTE_TO_CHAR).decode("ascii")

    def bits(self, n: int) -> int:
        if self._rng is None:
            return int.from_bytes(os.urandom((n + 7) // 8), "big") >> (-n % 8)
        return self._rng.getrandbits(n)

    def reseed(self) -> None:
        if self._rng is not None:
            self._rng.seed(os.urandom(32))


class PrefixedIdGenerator:
    """Thread-safe generator of ``<prefix>_<body>`` ids; ``new_id()`` returns the next one.

    Args:
        prefix: see :func:`check_prefix`.
        format: ``"ulid"`` (default) or ``"typeid"`` — see the module documentation.
        secure: random bits from the OS CSPRNG (default) or a seeded PRNG (faster, guessable).
        time_ns: reads the time, as integer nanoseconds since the Unix epoch (default
            ``time.time_ns``; tests inject one). ``clock=`` is a deprecated alias.

    Generators are cheap; to keep one column's ids in one increasing sequence, share one
    generator (the ``PrefixedId`` column type does, per prefix and format).
    """

    def __init__(
        self,
        prefix: str,
        *,
        format: Literal["ulid", "typeid"] = "ulid",
        secure: bool = True,
        time_ns: Callable[[], int] | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.prefix = check_prefix_and_format(prefix, format)
        self.format = format
        self.secure = bool(secure)
        self.time_ns = time_ns_keyword("PrefixedIdGenerator", time_ns, clock)
        self._random = _RandomText(self.secure)
        self.new_id: Callable[[], str]
        self._reinit: Callable[[], None]
        self._build()
        _process.track(self)

    def _build(self) -> None:
        clock = self.time_ns
        head_prefix = self.prefix + "_" if self.prefix else ""
        pairs = _PAIRS
        rand = self._random
        typeid = self.format == "typeid"
        # counter width and the number of random characters after it (26 = 10 + counter + random)
        counter_bits, random_chars = (39, 7) if typeid else (40, 8)
        counter_max = (1 << counter_bits) - 1
        seed_bits = (
            counter_bits - 1
        )  # rollover guard: a new millisecond's counter starts below half
        hi_chars = (45 if typeid else 40) // 5 - 2

        def field(counter: int) -> int:
            """The bits between the timestamp and the random tail, counter included."""
            if typeid:
                return (
                    (0b0111 << 41) | ((counter >> 27) << 29) | (0b10 << 27) | (counter & 0x7FFFFFF)
                )
            return counter

        lock = threading.Lock()
        last_ms = -1
        counter = 0
        hi_key = -1
        ts_head = ""
        head = ""
        buf = rand.block()
        pos = 0
        limit = len(buf) - random_chars

        def new_id() -> str:
            nonlocal last_ms, counter, hi_key, ts_head, head, buf, pos
            ms = clock() // 1_000_000
            lock.acquire()
            try:
                if ms > last_ms:
                    c = rand.bits(seed_bits)
                else:
                    c = counter + 1
                    ms = last_ms
                    if c > counter_max:  # 2**39 ids in one millisecond: borrow the next one
                        ms += 1
                        c = rand.bits(seed_bits)
                if ms != last_ms:
                    if ms >> 48:
                        raise TicketsError(f"clock reads {ms} ms since 1970: beyond 48 bits")
                    last_ms = ms
                    ts_head = head_prefix + encode_base32(ms, 10)
                    hi_key = -1
                counter = c
                if c >> 10 != hi_key:
                    hi_key = c >> 10
                    head = ts_head + encode_base32(field(c) >> 10, hi_chars)
                p = pos
                if p > limit:
                    buf = rand.block()
                    p = 0
                pos = p + random_chars
                return head + pairs[c & 1023] + buf[p : p + random_chars]
            finally:
                lock.release()

        def reinit() -> None:
            """In a forked child: a fresh lock and fresh random characters."""
            nonlocal lock, buf, pos
            lock = threading.Lock()
            rand.reseed()
            buf = rand.block()
            pos = 0

        self.new_id = new_id
        self._reinit = reinit

    def check(self, value: object) -> str:
        """Return ``value`` if it is an id of this prefix and format, else raise TicketsError."""
        return check_value(self.prefix, value)

    def parse(self, value: str) -> PrefixedParts:
        """Split an id of this generator's prefix into prefix, time and value."""
        return parse(self.check(value))

    def _after_fork_in_child(self) -> None:
        """The parent's random state and last id must not be reused: start afresh."""
        self._reinit()

    def __repr__(self) -> str:
        return f"PrefixedIdGenerator({self.prefix!r}, format={self.format!r})"


def _pattern(prefix: str) -> re.Pattern[str]:
    found = _patterns.get(prefix)
    if found is None:
        head = re.escape(prefix) + "_" if prefix else ""
        found = re.compile(head + r"[0-7][" + ALPHABET + r"]{25}\Z")
        with _patterns_lock:
            _patterns[prefix] = found
    return found


_patterns: dict[str, re.Pattern[str]] = {}
_patterns_lock = threading.Lock()


def show(value: str, limit: int = 100) -> str:
    """``repr(value)``, cut short so a huge bad value cannot flood a log line."""
    if len(value) <= limit:
        return repr(value)
    return repr(value[:limit]) + f"… ({len(value)} characters)"


def _example(prefix: str) -> str:
    return f"{prefix}_01h455vb4pex5vsknk084sn02q" if prefix else "01h455vb4pex5vsknk084sn02q"


def _split(value: str) -> tuple[str, str] | str:
    """``(prefix, body)`` of a well-formed id, or why it is not one."""
    prefix, sep, body = value.rpartition("_")
    if sep and not prefix:
        return (
            "it starts with '_', with no prefix before it (an id without a prefix has no "
            "separator either)"
        )
    if prefix and (len(prefix) > MAX_PREFIX_LENGTH or not _PREFIX_RE.match(prefix)):
        return (
            f"its prefix {show(prefix, 70)} is not 1 to {MAX_PREFIX_LENGTH} lowercase letters "
            "a-z and underscores, starting and ending with a letter"
        )
    if len(body) != BODY_LENGTH or body.strip(ALPHABET):
        return (
            f"after the prefix and '_' come exactly {BODY_LENGTH} lowercase base32 characters "
            f"({ALPHABET})"
        )
    if body[0] > "7":
        return "its body encodes more than 128 bits (the first of the 26 characters is 0-7)"
    return prefix, body


def split(value: object) -> tuple[str, str]:
    """``(prefix, body)`` of any well-formed prefixed id or TypeID, else raise TicketsError.

    Well-formed (the TypeID spec, v0.3): an optional prefix of 1-63 lowercase letters and
    underscores starting and ending with a letter, then ``_`` (only if there is a prefix), then
    26 lowercase base32 characters of which the first is ``0``-``7`` (at most 128 bits). The
    prefix of a TypeID without one is ``""``.
    """
    if not isinstance(value, str):
        raise TicketsError(
            f"an id must be a string like {_example('post')}, not {type(value).__name__}"
        )
    found = _split(value)
    if isinstance(found, str):
        raise TicketsError(f"{show(value)} is not a prefixed id: {found}")
    return found


def check_value(prefix: str, value: object) -> str:
    """Return ``value`` if it is ``<prefix>_<26 base32 chars>``, else raise TicketsError.

    With ``prefix=""`` the value is a TypeID without a prefix: the 26 characters alone.
    """
    if type(value) is str and _pattern(prefix).match(value):
        return value
    kind = f"a {prefix!r} id" if prefix else "a TypeID without a prefix"
    if not isinstance(value, str):
        raise TicketsError(
            f"{kind} must be a string like {_example(prefix)}, not {type(value).__name__}"
        )
    if _pattern(prefix).match(value):  # a str subclass
        return value
    found = _split(value)
    if isinstance(found, str):
        raise TicketsError(f"{show(value)} is not {kind} (like {_example(prefix)}): {found}")
    other = found[0]
    other_kind = f"a {other!r} id" if other else "a TypeID without a prefix"
    raise TicketsError(
        f"{show(value)} is {other_kind}, not {kind}: an id of another kind was given "
        f"where {prefix + '_…' if prefix else 'a bare TypeID'} belongs; nothing was written"
    )


def parse(value: str) -> PrefixedParts:
    """The prefix, creation time and 128-bit value of any prefixed id (either format) or any
    TypeID, prefix or not; raises TicketsError for anything else."""
    prefix, body = split(value)
    number = decode_base32(body)
    return PrefixedParts(prefix=prefix, timestamp_ms=number >> 80, value=number)


def from_uuid(prefix: str, value: uuid.UUID) -> str:
    """The TypeID string of a UUID: ``<prefix>_<base32 of its 128 bits>`` (no ``_`` if the
    prefix is ``""``)."""
    body = encode_base32(value.int)
    return f"{check_prefix(prefix, allow_empty=True)}_{body}" if prefix else body


def _after_fork_in_child() -> None:
    global _patterns_lock
    _patterns_lock = threading.Lock()  # a parent thread may have held it at fork time


_process.after_fork_in_child(_after_fork_in_child)
