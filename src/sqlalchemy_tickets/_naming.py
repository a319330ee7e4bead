"""Sequence names and the ticket tables they map to.

A named sequence ``Photos`` lives in a one-row table called ``tickets__photos`` (the template is
``tickets__{sequence}``, overridable per source). The double underscore keeps it apart from
application tables: an application table named ``photos`` — or ``tickets_photos`` — never collides.
Names are folded to lower case so that ``"Photos"`` and ``"photos"`` are one sequence on every
backend, whatever its identifier case rules. ``sequence=None`` means Flickr's own ``Tickets64`` /
``Tickets32`` tables, spelled exactly as Flickr published them.

Also here: the checks of the numbers that come with them (bits, strides, seconds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import TicketsError

DEFAULT_TABLE_TEMPLATE = "tickets__{sequence}"
MAX_SEQUENCE_LENGTH = 40
# Both PostgreSQL (63) and MySQL (64) must accept the table name the template makes.
MAX_TABLE_NAME_LENGTH = 63

_SEQUENCE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_TABLE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

VALID_BITS = (32, 64)


def check_bits(bits: object) -> int:
    """Return ``bits`` if it is 32 or 64, else raise a :class:`TicketsError` saying so."""
    if isinstance(bits, bool) or bits not in VALID_BITS:
        raise TicketsError(f"bits must be 32 or 64, not {bits!r}")
    return 64 if bits == 64 else 32


def check_seconds(name: str, value: object, *, finite: bool = False) -> float:
    """``value`` as float seconds if it is a positive number (``finite``: and not infinite),
    else a :class:`TicketsError` naming ``name``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not value > 0
        or (finite and value == float("inf"))
    ):
        raise TicketsError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def max_id(bits: int) -> int:
    """The largest id a sequence of this width may issue (signed: 2**31-1 or 2**63-1)."""
    return (1 << (bits - 1)) - 1


def normalize_sequence(sequence: object) -> str | None:
    """Validate a sequence name and fold it to lower case; ``None`` (Flickr's table) stays."""
    if sequence is None:
        return None
    if not isinstance(sequence, str):
        raise TicketsError(f"a sequence name must be a string, not {type(sequence).__name__}")
    if not sequence or len(sequence) > MAX_SEQUENCE_LENGTH or not _SEQUENCE_RE.match(sequence):
        raise TicketsError(
            f"invalid sequence name {sequence!r}: use a plain identifier of 1 to "
            f"{MAX_SEQUENCE_LENGTH} characters (a letter, then letters, digits or underscores)"
        )
    return sequence.lower()


def check_table_template(template: str) -> str:
    """Check that a table-name template makes valid, distinct names for every sequence."""
    if template.count("{sequence}") != 1:
        raise TicketsError(
            f"table template {template!r} must contain '{{sequence}}' exactly once, "
            "so that each sequence gets a table of its own"
        )
    sample = template.replace("{sequence}", "x" * MAX_SEQUENCE_LENGTH)
    if not _TABLE_RE.match(sample) or len(sample) > MAX_TABLE_NAME_LENGTH:
        raise TicketsError(
            f"table template {template!r} must make plain identifiers of at most "
            f"{MAX_TABLE_NAME_LENGTH} characters"
        )
    return template


@dataclass(frozen=True)
class TicketTable:
    """Where one sequence of one bit width lives: the table name and its kind."""

    sequence: str | None
    bits: int
    name: str

    @property
    def flickr(self) -> bool:
        """True for Flickr's ``Tickets64``/``Tickets32`` schema (``id``, ``stub``, no stride)."""
        return self.sequence is None

    @property
    def max_id(self) -> int:
        return max_id(self.bits)

    @property
    def label(self) -> str:
        """How messages name this sequence."""
        return self.sequence if self.sequence is not None else f"Tickets{self.bits} (Flickr)"


def ticket_table(
    sequence: str | None, bits: int = 64, template: str = DEFAULT_TABLE_TEMPLATE
) -> TicketTable:
    """Describe the ticket table of ``sequence`` (validated and folded) at ``bits`` width."""
    bits = check_bits(bits)
    seq = normalize_sequence(sequence)
    name = f"Tickets{bits}" if seq is None else template.format(sequence=seq)
    return TicketTable(seq, bits, name)


def first_id(start: int, increment: int, offset: int) -> int:
    """The smallest id >= ``start`` that is congruent to ``offset`` modulo ``increment``."""
    return start + (offset - start) % increment


def check_stride(start: int, increment: int, offset: int, bits: int) -> None:
    """Refuse a start/increment/offset that cannot describe a valid id space."""
    for label, value in (("start", start), ("increment", increment), ("offset", offset)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TicketsError(f"{label} must be an integer, not {value!r}")
    if increment < 1 or increment > 65535:
        raise TicketsError(f"increment must be between 1 and 65535, not {increment}")
    if not 1 <= offset <= increment:
        raise TicketsError(
            f"offset must be between 1 and the increment ({increment}), not {offset}: "
            "server i of N issues ids congruent to i (mod N)"
        )
    if start < 1 or first_id(start, increment, offset) > max_id(bits):
        raise TicketsError(f"start must be between 1 and {max_id(bits)}, not {start}")


#: Where each ticket table's identity is recorded (one table per database, see ``docs/rewinds.md``):
#: a single underscore keeps it apart from every sequence table of the default template.
STAMP_TABLE = "tickets_stamps"
#: The longest key of a row there (a tier's upstream lane names its tables and sequence).
STAMP_NAME_LENGTH = 200


#: The table ``SnowflakeId`` leases its worker ids from, unless named otherwise.
DEFAULT_LEASE_TABLE = "tickets_worker_leases"


#: Where a :class:`~sqlalchemy_tickets.sources.datacenter.DatacenterTier` keeps its stock: two
#: tables named ``<prefix>__stock`` and ``<prefix>__state``. A single underscore after
#: ``tickets`` keeps them apart from every sequence table of the default template
#: (``tickets__<letter>…``), as the worker-lease table (``tickets_worker_leases``) is.
DEFAULT_TIER_PREFIX = "tickets_dc"


@dataclass(frozen=True)
class TierTables:
    """The names of a datacenter tier's two tables."""

    stock: str
    state: str


def tier_tables(prefix: str = DEFAULT_TIER_PREFIX) -> TierTables:
    """The table names of a datacenter tier whose tables start with ``prefix`` (validated)."""
    if not isinstance(prefix, str) or not _TABLE_RE.match(prefix):
        raise TicketsError(f"invalid tier table prefix {prefix!r}: use a plain identifier")
    if len(prefix) + len("__stock") > MAX_TABLE_NAME_LENGTH:
        raise TicketsError(
            f"tier table prefix {prefix!r} is too long: at most "
            f"{MAX_TABLE_NAME_LENGTH - len('__stock')} characters"
        )
    if prefix.lower().startswith("tickets__"):
        raise TicketsError(
            f"tier table prefix {prefix!r} would make names of the form of sequence tables "
            "(tickets__<sequence>); use e.g. 'tickets_dc'"
        )
    return TierTables(stock=f"{prefix}__stock", state=f"{prefix}__state")
