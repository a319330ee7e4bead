"""``status``: every sequence, every datacenter tier, the upstream's health."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import URL

from .._naming import (
    tier_tables,
)
from ..admin import (
    SequenceStatus,
    ServerHealth,
    sequence_status,
    sequences,
    server_health,
)
from ..errors import TicketsError, UnknownSequenceError
from ..sources._urls import SourceUrl
from ..sources.datacenter import TierStatus, describe_datacenter
from ..sources.server import TicketServer
from . import _sources
from ._common import (
    _build_servers,
    _server_arguments,
    _shown,
    _tier_prefix_argument,
    _url,
    command,
    is_target,
)

# -- status -------------------------------------------------------------------------------------


def _status_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("--json", action="store_true", help="JSON for machines")
    sub.add_argument("--sample", type=_float_between(0.0, 3600.0), default=0.0,
                     metavar="SECONDS",
                     help="measure the burn rate over this many seconds (at most 3600), and "
                     "forecast when each id space runs out")
    _tier_prefix_argument(sub)
    sub.add_argument("--upstream", action="append", type=_url, default=[], metavar="URL",
                     help="a server the datacenter tier refills from (repeat for each): "
                     "report whether it answers, and its latency (exit 3 if it does not)")
    sub.add_argument("--min-runway", type=_float_between(0.0, 10 * 365 * 86400.0), default=0.0,
                     metavar="SECONDS",
                     help="warn (exit 3) when a datacenter tier's stock lasts less than this "
                     "at its current rate (default 0: never)")


def _float_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, not {text}")
        return value

    parse.__name__ = "number"
    return parse


@command("status", "every sequence on every server: last id, share of its id space used; "
         "each datacenter tier's stock, rate and runway; the upstream's health",
         _status_arguments, servers={"create_missing": False}, existing=True)
def _status(args: argparse.Namespace) -> int:
    if any(is_target(server) for server in args.servers):
        return _sources.run_status(args, _table)
    servers: list[TicketServer] = args.servers
    tables = {id(server): bool(sequences(server)) for server in servers}
    tiers = {id(server): _tier_status(server, args.tier_prefix) for server in servers}
    empty = [s for s in servers if not tables[id(s)] and tiers[id(s)] is None]
    if len(empty) == len(servers):
        where = ", ".join(_shown(server.url) for server in servers)
        names = tier_tables(args.tier_prefix)
        raise TicketsError(f"no ticket tables and no datacenter tier ({names.stock}, "
                           f"{names.state}) on {where}: create them with `sqlalchemy-tickets "
                           "init --url URL [SEQUENCE ...]` (a tier: `init --url URL "
                           "--datacenter-tier`)")
    with_tables = [server for server in servers if tables[id(server)]]
    rows = sequence_status(with_tables, sample=args.sample) if with_tables else []
    tier_rows = [(server, status) for server in servers for status in tiers[id(server)] or []]
    upstreams = _upstream_health(args.upstream)
    if args.json:
        document: list[dict[str, Any]] = [{"kind": "sequence", **row.as_dict()} for row in rows]
        document += [
            {"kind": "tier", "database": _shown(server.url), "table_prefix": args.tier_prefix,
             **status.as_dict()}
            for server, status in tier_rows
        ]
        document += [{"kind": "upstream", **health.as_dict()} for health in upstreams]
        print(json.dumps(document, indent=2))
    else:
        parts = []
        if rows:
            parts.append(_table(rows, sampled=args.sample > 0))
        if any(tier is not None for tier in tiers.values()):
            parts.append(_tier_table(tier_rows) if tier_rows else
                         "datacenter tier: no sequence has drawn from it yet")
        if upstreams:
            parts.append(_upstream_table(upstreams))
        print("\n\n".join(parts))
    for server in empty:
        print(f"note: no ticket tables or datacenter tier on {_shown(server.url)}",
              file=sys.stderr)
    warnings = [f"{row.sequence} on {row.server}: {warning}"
                for row in rows for warning in row.warnings]
    warnings += [
        f"{_tier_label(status)} in the datacenter tier on {_shown(server.url)}: {problem}"
        for server, status in tier_rows
        if (problem := _tier_problem(status, args.min_runway)) is not None
    ]
    warnings += [
        f"upstream {health.server} does not answer: {health.error}"
        for health in upstreams if not health.up
    ]
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 3 if warnings else 0


def _tier_status(server: TicketServer, prefix: str) -> list[TierStatus] | None:
    """The datacenter tier in ``server``'s database (``None``: its tables are not there)."""
    try:
        return describe_datacenter(server.url, table_prefix=prefix, timeout=server.timeout)
    except UnknownSequenceError:
        return None


def _upstream_health(urls: Sequence[URL | SourceUrl]) -> list[ServerHealth]:
    """Each ``--upstream`` server asked, on a :class:`TicketServer` that creates nothing (a
    source a registered URL names, such as ``zookeeper://``, asked for its sequences)."""
    if not urls:
        return []
    if any(isinstance(url, SourceUrl) for url in urls):
        return [_sources.health(url) if isinstance(url, SourceUrl)
                else _upstream_health([url])[0] for url in urls]
    upstream = _build_servers(urls, {"create_missing": False})
    try:
        return server_health(upstream)
    finally:
        for server in upstream:
            server.close()


def _tier_label(status: TierStatus) -> str:
    return f"{status.sequence or 'Tickets'}/{status.bits}"


def _tier_problem(status: TierStatus, min_runway: float) -> str | None:
    """Why a tier's sequence needs attention (``None``: it does not)."""
    if status.exhausted:
        return "upstream has no ids left for it (move to a 64-bit or a new sequence)"
    if min_runway > 0 and status.runway is not None and status.runway < min_runway:
        return (f"runway {_duration(status.runway)} ({status.stock:,} ids at "
                f"{status.rate:,.1f} ids/s) is under --min-runway {_duration(min_runway)}")
    return None


def _duration(seconds: float | None) -> str:
    """``42 s``, ``15 min``, ``2.5 h``, ``3.0 d`` (``-``: unknown)."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return f"{seconds:.0f} s"
    if seconds < 120:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _columns(header: list[str], lines: list[list[str]]) -> str:
    """``header`` and ``lines`` as aligned columns, with a rule under the header."""
    table = [header, *lines]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    rendered = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in table
    ]
    rendered.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(r.rstrip() for r in rendered)


def _clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters (the whole of it goes to stderr's warning)."""
    return text if len(text) <= width else text[: width - 1] + "…"


def _tier_table(rows: Sequence[tuple[TicketServer, TierStatus]]) -> str:
    header = ["datacenter tier", "sequence", "stock", "given back", "ids/s", "runway",
              "refill claim", "last refill", "issued"]
    lines = []
    for server, s in rows:
        if s.claim_owner is None:
            claim = "-"
        elif s.claim_expires_in is not None and s.claim_expires_in < 0:
            claim = f"{s.claim_owner} (void)"
        else:
            claim = f"{s.claim_owner} ({_duration(s.claim_expires_in)} left)"
        lines.append([
            _shown(server.url),
            _tier_label(s) + (" (exhausted)" if s.exhausted else ""),
            f"{s.stock:,}",
            f"{s.given_back_in_stock:,}",
            f"{s.rate:,.1f}",
            _duration(s.runway),
            claim,
            "never" if s.last_refill_age is None else f"{_duration(s.last_refill_age)} ago",
            f"{s.issued:,}",
        ])
    return _columns(header, lines)


def _upstream_table(rows: Sequence[ServerHealth]) -> str:
    header = ["upstream", "state", "latency", "connect", "sequences"]
    lines = [
        [
            h.server,
            "up" if h.up else "DOWN",
            "-" if h.latency is None else f"{h.latency * 1000:.1f} ms",
            "-" if h.connect is None else f"{h.connect * 1000:.1f} ms",
            ", ".join(h.sequences) if h.up else _clip(h.error or "", 60),
        ]
        for h in rows
    ]
    return _columns(header, lines)


def _table(rows: Sequence[SequenceStatus], *, sampled: bool) -> str:
    header = ["server", "sequence", "last id", "inc", "off", "32-bit used", "64-bit used",
              "identity"]
    if sampled:
        header += ["ids/s", "32-bit ends", "64-bit ends"]
    lines: list[list[str]] = []
    for row in rows:
        line = [
            row.server,
            row.sequence + (" (paused)" if row.paused else ""),
            "-" if row.last_id is None or row.last_id < 1 else f"{row.last_id:,}",
            str(row.increment),
            str(row.offset),
            f"{row.used_32:.4%}",
            f"{row.used_64:.2e}",
            _identity_cell(row),
        ]
        if sampled:
            line += [
                "-" if row.rate is None else f"{row.rate:,.1f}",
                row.exhausted_32_at or "-",
                row.exhausted_64_at or "-",
            ]
        lines.append(line)
    return _columns(header, lines)


def _identity_cell(row: SequenceStatus) -> str:
    if row.identity_now is None:
        return "-"
    if row.identity is None:
        return "not recorded"
    return "as recorded" if row.identity == row.identity_now else "CHANGED"
