"""``demo`` and ``init``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from .._naming import (
    check_stride,
    normalize_sequence,
    ticket_table,
    tier_tables,
)
from ..errors import TicketsError, UnknownSequenceError
from ..sources.datacenter import create_datacenter_tables
from ..sources.lease import create_lease_table
from ..sources.server import TicketServer
from . import _sources
from ._common import (
    DEMO_FILE,
    _int_between,
    _sequence,
    _server_arguments,
    _shown,
    _tier_prefix_argument,
    _Usage,
    command,
    foreign,
    is_target,
    resolve_urls,
)

# -- demo ---------------------------------------------------------------------------------------


def _demo_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--file", default=DEMO_FILE, help=f"database file (default {DEMO_FILE})")


@command("demo", "show ticket ids at work on a SQLite file here (no arguments needed)",
         _demo_arguments)
def _demo(args: argparse.Namespace) -> int:
    from .._demo import run_demo  # the demo's models are only needed here

    return run_demo(Path(args.file))


# -- init ---------------------------------------------------------------------------------------


def _init_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("sequences", nargs="*", type=_sequence, metavar="SEQUENCE",
                     help="sequence names (none: Flickr's Tickets64, --bits 32: Tickets32)")
    sub.add_argument("--from-file", metavar="PATH",
                     help="also the sequence names in PATH, one per line (# starts a comment, "
                     "blank lines are ignored; - reads standard input)")
    sub.add_argument("--bits", type=int, choices=(32, 64), default=64)
    sub.add_argument("--start", type=_int_between(1), default=1,
                     help="smallest first id (default 1)")
    sub.add_argument("--increment", type=_int_between(1, 65535), default=None,
                     help="the stride (default: the number of --url, so 1 for one server)")
    sub.add_argument("--offset", type=_int_between(1, 65535), action="append", default=None,
                     help="a server's position, 1-based (default: its place among the --url); "
                     "with several --url, once per --url")
    sub.add_argument("--worker-leases", action="store_true",
                     help="also create the table SnowflakeId leases worker ids from (alone: "
                     "only that table)")
    sub.add_argument("--datacenter-tier", action="store_true",
                     help="also create a DatacenterTier's tables (alone: only those), on a "
                     "datacenter's database")
    _tier_prefix_argument(sub)


def _init_check(args: argparse.Namespace) -> None:
    urls = resolve_urls(args)
    if args.from_file is not None:
        args.sequences = [*args.sequences, *_sequences_from_file(args.from_file)]
    source_url = foreign(urls)
    if source_url is not None:  # zookeeper://...: sequences only
        _sources.check_init(args, source_url)
        return
    n = len(urls)
    increment = args.increment if args.increment is not None else n
    if increment < n:
        raise _Usage(f"--increment {increment} is less than the number of servers ({n}): "
                     "each server needs its own residue")
    if args.offset is not None and len(args.offset) != n:
        raise _Usage(f"--offset given {len(args.offset)} time(s) for {n} server(s): give it once "
                     "per --url, or leave it out (server i then gets offset i)")
    offsets = list(args.offset) if args.offset is not None else list(range(1, n + 1))
    if len(set(offsets)) != len(offsets):
        raise _Usage(f"--offset values {offsets} repeat: two servers would issue the same ids")
    for offset in offsets:
        try:
            check_stride(args.start, increment, offset, args.bits)
        except TicketsError as error:
            raise _Usage(str(error).replace("increment must", "--increment must")
                         .replace("offset must", "--offset must")) from None
    args.strides = [(increment, offset) for offset in offsets]
    # Asked for a stride (flags, or several servers): an existing table must already have it.
    # Asked for nothing: an existing table is taken as it is.
    args.stride_asked = n > 1 or args.increment is not None or args.offset is not None


def _sequences_from_file(path: str) -> list[str]:
    """The sequence names in ``path`` (``-``: standard input), one per line, each checked;
    raises :class:`_Usage` naming the file and the line."""
    shown = "standard input" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            # utf-8-sig: a byte order mark some editors write is not part of the first name.
            text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise _Usage(f"--from-file {shown}: cannot read it: {reason}") from None
    names: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        try:
            normalize_sequence(name)
        except TicketsError as error:
            raise _Usage(f"--from-file {shown}, line {number}: {error}") from None
        names.append(name)
    if not names:
        raise _Usage(f"--from-file {shown} names no sequence (one name per line; # starts a "
                     "comment)")
    return names


def _unique(names: Iterable[str]) -> list[str]:
    """``names`` without repeats (``Photos`` and ``photos`` are one sequence), first spelling
    kept, in order."""
    seen: dict[str | None, str] = {}
    for name in names:
        seen.setdefault(normalize_sequence(name), name)
    return list(seen.values())


@command("init", "create ticket tables (with several --url: server i gets increment N, "
         "offset i)", _init_arguments, check=_init_check, servers={})
def _init(args: argparse.Namespace) -> int:
    if any(is_target(server) for server in args.servers):
        return _sources.run_init(args)
    servers: list[TicketServer] = args.servers
    alone = args.worker_leases or args.datacenter_tier  # no sequence named: only those tables
    names: list[str | None] = [*_unique(args.sequences)] or ([] if alone else [None])
    if args.stride_asked:
        # Each server knows its position: on the nodes of a Galera cluster, which replicate
        # every table, each position then has tables of its own.
        servers = [server.with_stride(increment, offset)
                   for server, (increment, offset) in zip(servers, args.strides, strict=True)]
        _refuse_other_strides(servers, names, args.strides, args.bits)
    for server, (increment, offset) in zip(servers, args.strides, strict=True):
        if args.worker_leases:
            create_lease_table(server.engine)
            print(f"worker leases: ready on {_shown(server.url)}")
        if args.datacenter_tier:
            tier = tier_tables(args.tier_prefix)
            create_datacenter_tables(server.url, table_prefix=args.tier_prefix,
                                     timeout=server.timeout)
            print(f"datacenter tier: {tier.stock}, {tier.state} ready on {_shown(server.url)}")
        stride = {"increment": increment, "offset": offset} if args.stride_asked else {}
        created = set(server.create_tables(names, bits=args.bits, start=args.start, **stride))
        for name in names:
            label = name or f"Tickets{args.bits}"
            if name is not None and (
                ticket_table(name, args.bits, server.table_template).name in created
            ):
                inc, off = increment, offset  # made just now, with that stride
            else:
                # There before, or Flickr's (on MySQL/MariaDB, the server's stride).
                table = server.describe(name, bits=args.bits)
                inc, off = (table.increment, table.offset) if table else (increment, offset)
            if args.stride_asked and (inc, off) != (increment, offset):
                raise TicketsError(
                    f"{label} on {_shown(server.url)} has increment {inc}, offset {off} after "
                    f"init, not increment {increment}, offset {offset}: another server's "
                    "table is this one (the same database given twice?); nothing issued"
                )
            print(f"{label}: ready (increment {inc}, offset {off}) on {_shown(server.url)}")
    return 0


def _refuse_other_strides(
    servers: Sequence[TicketServer],
    names: Sequence[str | None],
    strides: Sequence[tuple[int, int]],
    bits: int,
) -> None:
    """Before anything is created: every existing table must have the stride asked for."""
    wrong: list[str] = []
    for server, (increment, offset) in zip(servers, strides, strict=True):
        for name in names:
            try:
                info = server.describe(name, bits=bits)
            except UnknownSequenceError:
                continue  # to be created with the stride asked for
            if info is None or (info.increment, info.offset) == (increment, offset):
                continue
            label = name or f"Tickets{bits}"
            wrong.append(
                f"{label} on {_shown(server.url)} has increment {info.increment}, offset "
                f"{info.offset}, not increment {increment}, offset {offset} as asked"
            )
    if wrong:
        more = f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        flickr = None in names
        how = (
            "Flickr's tables have no stride of their own (on MySQL/MariaDB they take the "
            "server's auto_increment_increment/offset): use named sequences for a pair"
            if flickr and len(names) == 1
            else "to change the stride of servers in use, run `sqlalchemy-tickets restride "
            "--url ... --url ...` with the new list of servers"
        )
        raise TicketsError(f"{wrong[0]}{more}; nothing changed: {how}")
