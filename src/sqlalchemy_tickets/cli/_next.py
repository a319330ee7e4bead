"""``next``: print ids as they arrive."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from ..errors import TicketsError
from ..sources.base import TicketSource
from ..sources.server import TicketServer
from ..sources.servers import TicketServers
from ._common import (
    BLOCK,
    MAX_COUNT,
    _int_between,
    _sequence,
    _server_arguments,
    command,
    foreign,
    resolve_urls,
)

# -- next ---------------------------------------------------------------------------------------


def _next_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("sequence", nargs="?", type=_sequence, default=None, metavar="SEQUENCE",
                     help="the sequence (none: Flickr's Tickets64, --bits 32: Tickets32)")
    sub.add_argument("--bits", type=int, choices=(32, 64), default=64)
    sub.add_argument("--count", type=_int_between(1, MAX_COUNT), default=1,
                     help=f"how many ids, 1 to {MAX_COUNT:,} (default 1)")


def _next_check(args: argparse.Namespace) -> None:
    foreign(resolve_urls(args))  # a zookeeper:// URL comes alone


@command("next", "print ids, one per line, as they arrive", _next_arguments,
         check=_next_check, servers={"create_missing": False}, existing=True)
def _next(args: argparse.Namespace) -> int:
    servers: list[TicketServer] = args.servers
    # One server, or the source a registered URL names (zookeeper://...), is used as it is.
    source: TicketSource = servers[0] if len(servers) == 1 else TicketServers(servers)
    out = sys.stdout
    for block in _blocks(source, args.sequence, args.count, args.bits):
        out.write("".join(f"{i}\n" for i in block))
        out.flush()
    return 0


def _blocks(source: TicketSource, sequence: str | None, count: int, bits: int) -> Iterable[range]:
    """``count`` ids of ``sequence`` in blocks of at most :data:`BLOCK`, each drawn when the
    previous one has been printed: ids are never all held at once."""
    left = count
    while left > 0:
        block = source.next_block(sequence, min(left, BLOCK), bits=bits)
        if len(block) == 0:
            raise TicketsError(f"{source!r} returned an empty block for {sequence!r}")
        yield block[:left]
        left -= len(block[:left])
