"""``sync`` and ``restride``: move sequences up; give servers new strides."""

from __future__ import annotations

import argparse

from .._naming import (
    ticket_table,
)
from ..admin import (
    restride,
    sequences,
    sync_sequence,
    table_max,
)
from ..errors import TicketsError
from ..sources._urls import SourceUrl
from ..sources.server import TicketServer
from . import _sources
from ._common import (
    _identifier,
    _int_between,
    _require_database,
    _sequence,
    _server_arguments,
    _shown,
    _url,
    _Usage,
    command,
    foreign,
    is_target,
    resolve_urls,
)

# -- sync ---------------------------------------------------------------------------------------


def _sync_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("--above", type=_int_between(0, 2**63 - 1), metavar="N",
                     help="move the sequences so every new id is above N (after a restore or "
                     "a failover: N at least the highest id ever issued)")
    sub.add_argument("--from", dest="source_url", type=_url, metavar="URL",
                     help="instead of --above: the database holding an application table, "
                     "whose largest key is N (cut-over from auto-increment)")
    sub.add_argument("--table", type=_identifier("table"), help="that table (with --from)")
    sub.add_argument("--column", default="id", type=_identifier("column"),
                     help="its integer key (default id)")
    sub.add_argument("--bits", type=int, choices=(32, 64), default=64)
    sub.add_argument("sequences", nargs="*", type=_sequence, metavar="SEQUENCE",
                     help="the sequences to move (with --above and none named: every "
                     "sequence on the servers)")
    sub.add_argument("--flickr", action="store_true",
                     help="move Flickr's Tickets64 (--bits 32: Tickets32) instead")


def _sync_check(args: argparse.Namespace) -> None:
    if (args.above is None) == (args.source_url is None):
        raise _Usage("give --above N, or --from URL --table TABLE (the largest key of a table)")
    if args.source_url is not None and args.table is None:
        raise _Usage("--from needs --table: the application table whose largest key to read")
    if args.source_url is None and args.table is not None:
        raise _Usage("--table goes with --from URL")
    if args.flickr and args.sequences:
        raise _Usage("name sequences or give --flickr, not both")
    if args.source_url is not None and not args.flickr and len(args.sequences) != 1:
        raise _Usage("with --from, name the one sequence to move (or --flickr)")
    if isinstance(args.source_url, SourceUrl):
        raise _Usage("--from takes the database holding the application table, not "
                     f"{args.source_url.scheme.name}://")
    foreign(resolve_urls(args))  # a zookeeper:// URL comes alone


@command("sync", "move sequences above N (--above) or above max(id) of a table (--from): "
         "after a restore or a failover, or a cut-over from auto-increment; re-records each "
         "table's identity", _sync_arguments, check=_sync_check,
         servers={"create_missing": False}, existing=True)
def _sync(args: argparse.Namespace) -> int:
    servers: list[TicketServer] = args.servers
    if args.source_url is not None:
        _require_database(args.source_url)
        floor = table_max(args.source_url, args.table, args.column)
        why = f"max({args.table}.{args.column}) = {floor}"
    else:
        floor = args.above
        why = f"--above {floor}"
    if any(is_target(server) for server in servers):
        return _sources.run_sync(args, floor, why)
    for server in servers:
        if args.flickr:
            targets = [ticket_table(None, args.bits)]
        elif args.sequences:
            targets = [ticket_table(name, args.bits, server.table_template)
                       for name in args.sequences]
        else:
            targets = sequences(server)
            if not targets:
                raise TicketsError(f"no ticket tables on {_shown(server.url)}")
        for table in targets:
            info = sync_sequence(server, table.sequence, floor, bits=table.bits)
            print(f"{table.label} on {_shown(server.url)}: {why}; every new id is above it "
                  f"(last id now {info.last_id}; identity recorded)")
    return 0


# -- restride -----------------------------------------------------------------------------------


def _restride_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("sequences", nargs="*", type=_sequence, metavar="SEQUENCE",
                     help="sequences to restride (default: every named sequence)")


def _restride_check(args: argparse.Namespace) -> None:
    found = foreign(resolve_urls(args))
    if found is not None:
        raise _Usage(f"restride is for ticket databases; a {found.scheme.name}:// source has "
                     "no strides")


@command("restride", "give N servers (the new, full list, in order) the strides 1..N of N",
         _restride_arguments, check=_restride_check, servers={})
def _restride(args: argparse.Namespace) -> int:
    servers: list[TicketServer] = args.servers
    highest = restride(servers, args.sequences or None)
    print(f"restrided {len(servers)} server(s): increment {len(servers)}, offsets "
          f"1..{len(servers)}, every new id above {highest}")
    return 0
