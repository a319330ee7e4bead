"""The ``sqlalchemy-tickets`` command: ``demo``, ``init``, ``next``.

Every error prints one line on stderr and exits non-zero (1: the operation failed; 2: bad
arguments); a traceback is a bug.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from . import __version__
from ._naming import normalize_sequence
from .errors import TicketsError
from .sources.server import TicketServer

DEMO_FILE = "tickets-demo.db"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.run(args))
    except (TicketsError, SQLAlchemyError, OSError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        print(f"sqlalchemy-tickets: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


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
    init.add_argument("--url", required=True, help="ticket database URL")
    init.add_argument("sequences", nargs="*", metavar="SEQUENCE",
                      help="sequence names (none: Flickr's Tickets64/Tickets32)")
    init.add_argument("--bits", type=int, choices=(32, 64), default=64)
    init.add_argument("--start", type=int, default=1, help="smallest first id (default 1)")
    init.add_argument("--increment", type=int, default=1, help="stride: number of servers")
    init.add_argument("--offset", type=int, default=1, help="this server's position, 1-based")
    init.set_defaults(run=_init)

    nxt = commands.add_parser("next", help="print ids, one per line")
    nxt.add_argument("--url", required=True, help="ticket database URL")
    nxt.add_argument("sequence", nargs="?", default=None, metavar="SEQUENCE")
    nxt.add_argument("--bits", type=int, choices=(32, 64), default=64)
    nxt.add_argument("--count", type=_positive, default=1)
    nxt.set_defaults(run=_next)
    return parser


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _init(args: argparse.Namespace) -> int:
    server = TicketServer(args.url)
    names = args.sequences or [None]
    for name in names:
        normalize_sequence(name)  # every name is checked before any table is created
    try:
        for name in names:
            server.create(name, bits=args.bits, start=args.start,
                          increment=args.increment, offset=args.offset)
            table = server.describe(name, bits=args.bits)
            label = name or f"Tickets{args.bits}"
            print(f"{label}: ready (increment {table.increment if table else args.increment}, "
                  f"offset {table.offset if table else args.offset})")
    finally:
        server.dispose()
    return 0


def _next(args: argparse.Namespace) -> int:
    server = TicketServer(args.url, create_missing=False)
    try:
        block = server.next_block(args.sequence, args.count, bits=args.bits)
    finally:
        server.dispose()
    sys.stdout.write("".join(f"{i}\n" for i in block))
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo

    return run_demo(Path(args.file))
