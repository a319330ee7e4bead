"""``init``, ``status`` and ``sync`` on a source named by a URL of a registered scheme
(``zookeeper://h1:2181,h2:2181/path``, see :mod:`sqlalchemy_tickets.sources._urls`): the same
arguments, output and exit codes as on ticket databases, where they mean something for a
source that is not a database. ``next`` needs nothing of its own: the target is a source.

Each function takes the parsed arguments, whose ``servers`` hold the one target the driver
built (:func:`~._common.foreign` made sure it came alone)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from typing import Any

from .._commands import init_command
from .._naming import max_id, normalize_sequence
from ..admin import WARN_SHARE, SequenceStatus, ServerHealth, _forecast
from ..errors import TicketsError, UnknownSequenceError
from ..sources._urls import AdminTarget, SourceUrl
from ._common import _shown, _Usage

#: Options of ``init`` that only ticket databases have.
_DATABASE_ONLY_INIT = (("increment", "--increment"), ("offset", "--offset"),
                       ("worker_leases", "--worker-leases"),
                       ("datacenter_tier", "--datacenter-tier"), ("from_file", None))


def check_init(args: argparse.Namespace, url: SourceUrl) -> None:
    """``init`` options a source that is not a database cannot honour: exit 2."""
    for attribute, flag in _DATABASE_ONLY_INIT:
        if flag is not None and getattr(args, attribute) not in (None, False):
            raise _Usage(f"{flag} is for ticket databases; a {url.scheme.name}:// source has "
                         "sequences only (give SEQUENCE ... [--bits] [--start])")
    if args.start > max_id(args.bits):
        raise _Usage(f"--start must be between 1 and {max_id(args.bits):,} for {args.bits}-bit "
                     f"sequences, not {args.start}")
    args.strides = [(1, 1)]
    args.stride_asked = False


def _label(sequence: str | None, bits: int) -> str:
    return f"{sequence}" if sequence is not None else f"Tickets{bits}"


def run_init(args: argparse.Namespace) -> int:
    target: AdminTarget = args.servers[0]
    names: list[str | None] = list(dict.fromkeys(
        normalize_sequence(name) for name in args.sequences)) or [None]
    for name in names:
        made = target.create(name, bits=args.bits, start=args.start)
        info = target.describe(name, bits=args.bits)
        last = "-" if info is None or info.last < 1 else f"{info.last:,}"
        state = "created" if made else "there already, left as it is"
        print(f"{_label(name, args.bits)}: ready ({state}; last id {last}) on "
              f"{_shown(target.url)}")
    return 0


def status_rows(target: AdminTarget, sample: float) -> list[SequenceStatus]:
    """Every sequence of ``target``: last id, share of the id spaces used; with ``sample``,
    read twice that many seconds apart for the rate and the date each id space runs out."""
    found = target.sequences()
    if not found:
        raise TicketsError(f"no sequences on {_shown(target.url)}: create them with "
                           f"`{init_command(_shown(target.url), 'SEQUENCE', '...')}`")
    first = {key: target.describe(key[0], bits=key[1]) for key in found}
    second = first
    if sample > 0:
        time.sleep(sample)
        second = {key: target.describe(key[0], bits=key[1]) for key in found}
    today = dt.datetime.now(dt.timezone.utc)
    rows = []
    for (sequence, bits), info in second.items():
        last = None if info is None else int(info.last)
        before = first[sequence, bits]
        rate = None
        if sample > 0 and last is not None and before is not None:
            rate = max(0.0, (last - before.last) / sample)
        used = {b: min(1.0, max(0.0, (last or 0) / max_id(b))) for b in (32, 64)}
        relevant = [32] if bits == 32 else [32, 64] if sequence else [64]
        warnings = [
            f"{used[b]:.0%} of the {b}-bit id space is used"
            + (" (matters if a 32-bit column uses it)" if sequence and b == 32 else "")
            for b in relevant if WARN_SHARE <= used[b] < 1
        ]
        rows.append(SequenceStatus(
            server=_shown(target.url), sequence=_label(sequence, bits),
            table=f"{_label(sequence, bits)}/{bits}", last_id=last, increment=1, offset=1,
            paused=False, used_32=used[32], used_64=used[64], rate=rate,
            exhausted_32_at=_forecast(today, last, rate, 32),
            exhausted_64_at=_forecast(today, last, rate, 64),
            identity=None, identity_now=None, behind=None, warnings=warnings,
        ))
    return rows


def run_status(args: argparse.Namespace, render: Any) -> int:
    """``status`` of the target: ``render(rows, sampled=...)`` draws the table."""
    rows = status_rows(args.servers[0], args.sample)
    if args.json:
        print(json.dumps([{"kind": "sequence", **row.as_dict()} for row in rows], indent=2))
    else:
        print(render(rows, sampled=args.sample > 0))
    warnings = [f"{row.sequence} on {row.server}: {w}" for row in rows for w in row.warnings]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 3 if warnings else 0


def health(url: SourceUrl) -> ServerHealth:
    """Whether the source ``url`` names answers (``status --upstream``), and how fast."""
    shown = _shown(url)
    try:
        target = url.build(create_missing=False)
    except TicketsError as error:
        return ServerHealth(shown, False, None, None, [], str(error))
    try:
        started = time.perf_counter()
        target.sequences()
        connect = time.perf_counter() - started
        started = time.perf_counter()
        found = target.sequences()
        latency = time.perf_counter() - started
    except TicketsError as error:
        return ServerHealth(shown, False, None, None, [], str(error).splitlines()[0])
    finally:
        target.close()
    names = [f"{_label(s, b)}/{b}" if s else _label(s, b) for s, b in found]
    return ServerHealth(shown, True, connect, latency, names, None)


def run_sync(args: argparse.Namespace, floor: int, why: str) -> int:
    """Move the named sequences (none named: every one) so every new id is above ``floor``.
    Every sequence is checked first: one whose last id is above ``floor`` already is a
    failure (exit 1) and nothing is changed — sync never lowers."""
    target: AdminTarget = args.servers[0]
    if args.flickr:
        keys: list[tuple[str | None, int]] = [(None, args.bits)]
    elif args.sequences:
        keys = [(normalize_sequence(name), args.bits) for name in dict.fromkeys(args.sequences)]
    else:
        keys = target.sequences()
        if not keys:
            raise TicketsError(f"no sequences on {_shown(target.url)}")
    for sequence, bits in keys:
        if floor >= max_id(bits):
            raise TicketsError(f"--above {floor:,} leaves no id to a {bits}-bit sequence (the "
                               f"last is {max_id(bits):,}); nothing changed")
        info = target.describe(sequence, bits=bits)
        if info is None:
            raise UnknownSequenceError(
                f"sequence {_label(sequence, bits)}/{bits} does not exist on "
                f"{_shown(target.url)}; nothing changed (create it with "
                f"`{init_command(_shown(target.url), *([sequence] if sequence else []))}`)")
        if info.last > floor:
            raise TicketsError(
                f"{_label(sequence, bits)}/{bits} on {_shown(target.url)} has issued up to "
                f"{info.last:,}, above {floor:,}: sync never lowers a sequence; nothing changed"
            )
    for sequence, bits in keys:
        info = target.sync_above(sequence, floor, bits=bits)
        print(f"{_label(sequence, bits)} on {_shown(target.url)}: {why}; every new id is "
              f"above it (last id now {info.last})")
    return 0
