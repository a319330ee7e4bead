"""The ``sqlalchemy-tickets`` command: ``demo``, ``init``, ``next``, ``status``, ``sync``,
``restride``.

Ticket servers come from ``--url`` (repeatable), else the ``TICKETS_URL`` environment variable
(URLs separated by spaces or commas), else ``--config FILE`` / ``sqlalchemy-tickets.ini`` in the
current directory (``[tickets]`` section, ``urls =`` one per line).

Exit codes: 0 done; 1 the operation failed (one line on stderr, never a traceback); 2 bad
arguments or no server given; 3 ``status`` found a sequence past 80 % of an id space.
"""

from __future__ import annotations

import argparse
import configparser
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError

from . import __version__
from ._naming import normalize_sequence
from .admin import SequenceStatus, restride, sequence_status, sync_sequence, table_max
from .errors import TicketsError
from .generators.lease import create_lease_table
from .sources.base import take
from .sources.server import TicketServer
from .sources.servers import TicketServers

DEMO_FILE = "tickets-demo.db"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args))
    except _Usage as error:
        print(f"sqlalchemy-tickets: error: {error}", file=sys.stderr)
        return 2
    except (TicketsError, SQLAlchemyError, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(f"sqlalchemy-tickets: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: nothing left to say, and nowhere to say it.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's flush quiet
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sqlalchemy-tickets",
        description="Globally unique, compact, time-ordered primary keys for SQLAlchemy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="show ticket ids at work on a SQLite file here")
    demo.add_argument("--file", default=DEMO_FILE, help=f"database file (default {DEMO_FILE})")
    demo.set_defaults(run=_demo)

    init = commands.add_parser("init", help="create ticket tables")
    _urls(init)
    init.add_argument("sequences", nargs="*", metavar="SEQUENCE",
                      help="sequence names (none: Flickr's Tickets64/Tickets32)")
    init.add_argument("--bits", type=int, choices=(32, 64), default=64)
    init.add_argument("--start", type=int, default=1, help="smallest first id (default 1)")
    init.add_argument("--increment", type=int, default=1, help="stride: number of servers")
    init.add_argument("--offset", type=int, default=1, help="this server's position, 1-based")
    init.add_argument("--worker-leases", action="store_true",
                      help="also create the table SnowflakeId leases worker ids from (alone: "
                      "only that table)")
    init.set_defaults(run=_init)

    nxt = commands.add_parser("next", help="print ids, one per line")
    _urls(nxt)
    nxt.add_argument("sequence", nargs="?", default=None, metavar="SEQUENCE")
    nxt.add_argument("--bits", type=int, choices=(32, 64), default=64)
    nxt.add_argument("--count", type=_positive, default=1)
    nxt.set_defaults(run=_next)

    status = commands.add_parser("status", help="every sequence on every server")
    _urls(status)
    status.add_argument("--json", action="store_true", help="JSON for machines")
    status.add_argument("--sample", type=float, default=0.0, metavar="SECONDS",
                        help="measure the burn rate over this many seconds, and forecast")
    status.set_defaults(run=_status)

    sync = commands.add_parser(
        "sync", help="move a sequence above max(id) of a table (cut-over from auto-increment)"
    )
    _urls(sync)
    sync.add_argument("--from", dest="source_url", required=True, metavar="URL",
                      help="the database holding the table")
    sync.add_argument("--table", required=True)
    sync.add_argument("--column", default="id")
    sync.add_argument("--bits", type=int, choices=(32, 64), default=64)
    sync.add_argument("sequence", nargs="?", default=None, metavar="SEQUENCE")
    sync.set_defaults(run=_sync)

    restride = commands.add_parser(
        "restride", help="give N servers (the new, full list, in order) the strides 1..N of N"
    )
    _urls(restride)
    restride.add_argument("sequences", nargs="*", metavar="SEQUENCE",
                          help="sequences to restride (default: every named sequence)")
    restride.set_defaults(run=_restride)
    return parser


def _urls(command: argparse.ArgumentParser) -> None:
    command.add_argument("--url", action="append", dest="urls", metavar="URL",
                         help="ticket database URL (repeat for several servers)")
    command.add_argument("--config", metavar="FILE", help="INI file with [tickets] urls =")


def _servers(args: argparse.Namespace, **options: Any) -> list[TicketServer]:
    urls = _resolve_urls(args)
    return [TicketServer(url, **options) for url in urls]


def _resolve_urls(args: argparse.Namespace) -> list[str]:
    if args.urls:
        return list(args.urls)
    env = os.environ.get("TICKETS_URL", "").replace(",", " ").split()
    if env:
        return env
    path = Path(args.config) if args.config else Path("sqlalchemy-tickets.ini")
    if args.config and not path.exists():
        raise _Usage(f"config file {path} does not exist")
    if path.exists():
        parser = configparser.ConfigParser()
        parser.read(path)
        urls = parser.get("tickets", "urls", fallback="").replace(",", " ").split()
        if urls:
            return urls
    raise _Usage("no ticket server: give --url URL, set TICKETS_URL, or write a config file")


class _Usage(Exception):
    """Bad arguments found after parsing: exit 2."""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _init(args: argparse.Namespace) -> int:
    names: list[str | None] = args.sequences or ([] if args.worker_leases else [None])
    for name in names:
        normalize_sequence(name)  # every name is checked before any table is created
    for server in _servers(args):
        if args.worker_leases:
            create_lease_table(server.engine)
            print("worker leases: ready")
        try:
            for name in names:
                server.create(name, bits=args.bits, start=args.start,
                              increment=args.increment, offset=args.offset)
                table = server.describe(name, bits=args.bits)
                label = name or f"Tickets{args.bits}"
                increment = table.increment if table else args.increment
                offset = table.offset if table else args.offset
                print(f"{label}: ready (increment {increment}, offset {offset})")
        finally:
            server.dispose()
    return 0


def _next(args: argparse.Namespace) -> int:
    servers = _servers(args, create_missing=False)
    source: Any = servers[0] if len(servers) == 1 else TicketServers(servers)
    try:
        ids = take(source, args.sequence, args.count, args.bits)
    finally:
        for server in servers:
            server.dispose()
    sys.stdout.write("".join(f"{i}\n" for i in ids))
    return 0


def _status(args: argparse.Namespace) -> int:
    servers = _servers(args, create_missing=False)
    try:
        rows = sequence_status(servers, sample=args.sample)
    finally:
        for server in servers:
            server.dispose()
    if args.json:
        print(json.dumps([row.as_dict() for row in rows], indent=2))
    else:
        print(_table(rows, sampled=args.sample > 0))
    warned = [row for row in rows if row.warning]
    for row in warned:
        print(f"warning: {row.sequence} on {row.server}: {row.warning}", file=sys.stderr)
    return 3 if warned else 0


def _table(rows: Sequence[SequenceStatus], *, sampled: bool) -> str:
    header = ["server", "sequence", "last id", "inc", "off", "32-bit used", "64-bit used"]
    if sampled:
        header += ["ids/s", "32-bit ends", "64-bit ends"]
    lines = [header]
    for row in rows:
        line = [
            row.server,
            row.sequence + (" (paused)" if row.paused else ""),
            "-" if row.last_id is None or row.last_id < 1 else f"{row.last_id:,}",
            str(row.increment),
            str(row.offset),
            f"{row.used_32:.4%}",
            f"{row.used_64:.2e}",
        ]
        if sampled:
            line += [
                "-" if row.rate is None else f"{row.rate:,.1f}",
                row.exhausted_32_at or "-",
                row.exhausted_64_at or "-",
            ]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    ]
    rendered.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(r.rstrip() for r in rendered)


def _sync(args: argparse.Namespace) -> int:
    normalize_sequence(args.sequence)
    servers = _servers(args, create_missing=False)
    try:
        floor = table_max(args.source_url, args.table, args.column)
        for server in servers:
            info = sync_sequence(server, args.sequence, floor, bits=args.bits)
            print(f"{args.sequence or 'Tickets' + str(args.bits)} on {server.url}: "
                  f"max({args.table}.{args.column}) = {floor}; next id above it "
                  f"(last id now {info.last_id})")
    finally:
        for server in servers:
            server.dispose()
    return 0


def _restride(args: argparse.Namespace) -> int:
    servers = _servers(args)
    try:
        highest = restride(servers, args.sequences or None)
    finally:
        for server in servers:
            server.dispose()
    print(f"restrided {len(servers)} server(s): increment {len(servers)}, offsets "
          f"1..{len(servers)}, every new id above {highest}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(Path(args.file))
