"""The ``sqlalchemy-tickets`` command: ``demo``, ``init``, ``next``, ``status``, ``sync``,
``restride``, ``lookup``.

Ticket servers come from ``--url`` (repeatable), else ``--config FILE``, else the
``TICKETS_URL`` environment variable (URLs separated by spaces or commas), else
``sqlalchemy-tickets.ini`` in the current directory (``[tickets]`` section, ``urls =`` one per
line).

Every run has two phases. First the arguments are checked — URLs parsed and their backends
known, sequence and identifier names, strides, counts, the config file — with nothing read or
written; a bad argument exits 2. Then the command runs; a failure (a server that does not
answer, an unknown sequence, a stride that disagrees) prints one line on stderr and exits 1.
Never a traceback (``-v`` logs it).

Exit codes: 0 done; 1 the operation failed; 2 bad arguments; 3 ``status`` found something to
act on (a sequence past 80 % of an id space, an ``--upstream`` that does not answer, a datacenter
tier whose upstream is exhausted or whose runway is under ``--min-runway``); 4 ``lookup`` found
no row with the id.

``lookup --url URL --models MODULE ID`` is the one command about the application's own rows:
``--url`` is the application's database, not a ticket server.

Subcommands are entries of :data:`COMMANDS`, each registered with :func:`command`: a name, a
help line, a function adding its arguments, a ``check`` run in the first phase and a ``run``.
"""

from __future__ import annotations

import argparse
import configparser
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from . import __version__
from ._naming import (
    DEFAULT_TIER_PREFIX,
    check_stride,
    normalize_sequence,
    ticket_table,
    tier_tables,
)
from .admin import (
    SequenceStatus,
    ServerHealth,
    check_identifier,
    restride,
    sequence_status,
    sequences,
    server_health,
    sync_sequence,
    table_max,
)
from .dialects import DriverNotInstalledError, backend_for
from .errors import TicketsError, UnknownSequenceError
from .sources.datacenter import TierStatus, create_datacenter_tables, describe_datacenter
from .sources.lease import create_lease_table
from .sources.server import TicketServer
from .sources.servers import TicketServers

logger = logging.getLogger("sqlalchemy_tickets")

DEMO_FILE = "tickets-demo.db"
CONFIG_FILE = "sqlalchemy-tickets.ini"
#: The most ids one ``next`` may draw: a larger ``--count`` is a bad argument (exit 2), so a
#: typo cannot burn billions of ids. Draw more by running it again.
MAX_COUNT = 1_000_000
#: ``next`` asks for at most this many ids per round trip and prints each block as it arrives.
BLOCK = 10_000


class _Usage(Exception):
    """A bad argument, found before anything was read or written: exit 2."""


@dataclass(frozen=True)
class Command:
    """One subcommand.

    Attributes:
        name: what the user types.
        help: one line for ``--help``.
        arguments: adds the subcommand's arguments to its parser.
        run: does the work; returns the exit code. Runs after ``check``.
        check: validates the parsed arguments with no I/O at all; raises :class:`_Usage`.
        servers: how the command reaches ticket servers: ``None`` (it does not), or the
            keyword arguments of the :class:`TicketServer` objects built (with no I/O) from
            ``--url``/``--config``/``TICKETS_URL`` into ``args.servers`` before ``run``.
        existing: the command only reads or moves what exists: a database that does not exist
            is a failure (exit 1), never created by looking.
    """

    name: str
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    check: Callable[[argparse.Namespace], None] | None = None
    servers: dict[str, Any] | None = None
    existing: bool = False


#: The subcommands, in ``--help`` order.
COMMANDS: dict[str, Command] = {}


def command(
    name: str,
    help: str,
    arguments: Callable[[argparse.ArgumentParser], None],
    *,
    check: Callable[[argparse.Namespace], None] | None = None,
    servers: dict[str, Any] | None = None,
    existing: bool = False,
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Register the decorated function as the ``run`` of subcommand ``name``."""

    def register(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        if name in COMMANDS:
            raise ValueError(f"subcommand {name!r} is registered twice")
        COMMANDS[name] = Command(name, help, arguments, run, check, servers, existing)
        return run

    return register


# -- the driver ---------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # argparse: --help, --version (0) or a malformed command line (2)
        return done.code if isinstance(done.code, int) else 2
    level = logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    cmd = COMMANDS[args.command]
    args.servers = []
    try:
        try:
            if cmd.check is not None:
                cmd.check(args)
            if cmd.servers is not None:
                args.servers = _build_servers(resolve_urls(args), cmd.servers)
        except DriverNotInstalledError as error:
            return _fail(error, 1)  # the environment lacks something; the arguments are fine
        except (_Usage, TicketsError) as error:
            return _fail(error, 2)
        if cmd.existing:
            for server in args.servers:
                _require_database(server.url)
        return int(cmd.run(args))
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: nothing left to say, and nowhere to say it.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's flush quiet
        return 0
    except KeyboardInterrupt:
        return 130
    except _Usage as error:
        return _fail(error, 2)
    except Exception as error:  # noqa: BLE001 - the promise is one line, never a traceback
        logger.debug("%s failed", cmd.name, exc_info=True)
        return _fail(error, 1)
    finally:
        for server in args.servers:
            server.close()


def _fail(error: BaseException, code: int) -> int:
    text = str(error).strip()
    known = isinstance(error, (_Usage, TicketsError, SQLAlchemyError, OSError))
    message = text.splitlines()[0] if text else ""
    if not known or not message:
        message = f"{type(error).__name__}: {message}" if message else type(error).__name__
    print(f"sqlalchemy-tickets: error: {message}", file=sys.stderr)
    return code


def parser() -> argparse.ArgumentParser:
    """The argument parser, with a subparser per entry of :data:`COMMANDS`."""
    top = argparse.ArgumentParser(
        prog="sqlalchemy-tickets",
        description="Globally unique, compact, time-ordered primary keys for SQLAlchemy.",
        epilog="Exit codes: 0 done, 1 failed, 2 bad arguments, 3 status warns (id space 80% "
        "used, an upstream down, a tier's runway short), 4 lookup found no such row.",
    )
    top.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    top.add_argument("-v", "--verbose", action="count", default=0,
                     help="log more (-vv: debug, with the traceback of a failure)")
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for cmd in COMMANDS.values():
        sub = commands.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.arguments(sub)
    return top


# -- argument types and shared checks -------------------------------------------------------------


def _url(text: str) -> URL:
    """An argparse type: a database URL whose backend this library supports (no I/O)."""
    try:
        url = make_url(text)
    except (ArgumentError, ValueError, TypeError):
        raise argparse.ArgumentTypeError(
            f"invalid database URL {text!r}: expected e.g. "
            "'postgresql+psycopg://user@host/db', 'mysql+pymysql://user@host/db' or "
            "'sqlite:///tickets.db'"
        ) from None
    try:
        backend_for(url.get_backend_name())
    except TicketsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return url


def _int_between(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer in ``low..high``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low:,} and {high:,}" if high is not None else f"at least {low:,}"
            raise argparse.ArgumentTypeError(f"must be {bound}, not {text}")
        return value

    parse.__name__ = "integer"  # what argparse names in "invalid integer value"
    return parse


def _sequence(text: str) -> str:
    """An argparse type: a valid sequence name (kept as typed, for messages)."""
    try:
        normalize_sequence(text)
    except TicketsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _tier_prefix(text: str) -> str:
    """An argparse type: a datacenter tier's table prefix (``<prefix>__stock``, ``__state``)."""
    try:
        tier_tables(text)
    except TicketsError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _tier_prefix_argument(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--tier-prefix", type=_tier_prefix, default=DEFAULT_TIER_PREFIX,
                     metavar="PREFIX",
                     help="the datacenter tier's tables are PREFIX__stock and PREFIX__state "
                     f"(default {DEFAULT_TIER_PREFIX}, as DatacenterTier's table_prefix)")


def _identifier(kind: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check_identifier(kind, text)
        except TicketsError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parse.__name__ = f"{kind} name"
    return parse


def _server_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--url", action="append", dest="urls", type=_url, metavar="URL",
                     help="ticket database URL (repeat for several servers, in position order)")
    sub.add_argument("--config", metavar="FILE",
                     help=f"INI file with a [tickets] section, urls = one per line (default: "
                     f"$TICKETS_URL, else ./{CONFIG_FILE})")


def resolve_urls(args: argparse.Namespace) -> list[URL]:
    """The ticket servers' URLs: ``--url``, else ``--config``, else ``$TICKETS_URL``, else
    ``./sqlalchemy-tickets.ini``. Raises :class:`_Usage` naming what is wrong (and the file)."""
    urls: list[URL] | None = getattr(args, "urls", None)
    config: str | None = getattr(args, "config", None)
    if urls and config:
        raise _Usage("give --url or --config, not both")
    if urls:
        return urls
    if config:
        return _urls_from_file(Path(config))
    env = os.environ.get("TICKETS_URL", "").replace(",", " ").split()
    if env:
        return [_checked_url(text, "in $TICKETS_URL") for text in env]
    default = Path(CONFIG_FILE)
    if default.exists():
        return _urls_from_file(default)
    raise _Usage(f"no ticket server: give --url URL, --config FILE, set TICKETS_URL, or write "
                 f"./{CONFIG_FILE}")


def _urls_from_file(path: Path) -> list[URL]:
    if not path.is_file():
        raise _Usage(f"config file {path}: no such file")
    config = configparser.ConfigParser()
    try:
        with path.open(encoding="utf-8") as stream:
            config.read_file(stream)
    except (OSError, UnicodeDecodeError, configparser.Error) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise _Usage(f"config file {path}: cannot read it: {first}") from None
    if not config.has_section("tickets"):
        raise _Usage(f"config file {path} has no [tickets] section (expected [tickets] with "
                     "urls = one URL per line)")
    texts = config.get("tickets", "urls", fallback="").replace(",", " ").split()
    if not texts:
        raise _Usage(f"config file {path}: [tickets] has no urls = (one URL per line)")
    return [_checked_url(text, f"in {path}") for text in texts]


def _checked_url(text: str, where: str) -> URL:
    try:
        return _url(text)
    except argparse.ArgumentTypeError as error:
        raise _Usage(f"{error} ({where})") from None


def _build_servers(urls: Sequence[URL], options: dict[str, Any]) -> list[TicketServer]:
    """One :class:`TicketServer` per URL. Building one opens no connection."""
    built: list[TicketServer] = []
    try:
        for url in urls:
            built.append(TicketServer(url, **options))
    except TicketsError:
        for server in built:
            server.close()
        raise
    return built


def _require_database(url: URL) -> None:
    """Fail (exit 1) on a database that does not exist, rather than create it by connecting."""
    problem = backend_for(url.get_backend_name()).missing_database(url)
    if problem is not None:
        raise TicketsError(f"{problem}: nothing to read there (create it with "
                           "`sqlalchemy-tickets init --url ...`)")


def _shown(url: URL) -> str:
    return url.render_as_string(hide_password=True)


# -- demo ---------------------------------------------------------------------------------------


def _demo_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--file", default=DEMO_FILE, help=f"database file (default {DEMO_FILE})")


@command("demo", "show ticket ids at work on a SQLite file here (no arguments needed)",
         _demo_arguments)
def _demo(args: argparse.Namespace) -> int:
    from ._demo import run_demo  # the demo's models are only needed here

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


# -- next ---------------------------------------------------------------------------------------


def _next_arguments(sub: argparse.ArgumentParser) -> None:
    _server_arguments(sub)
    sub.add_argument("sequence", nargs="?", type=_sequence, default=None, metavar="SEQUENCE",
                     help="the sequence (none: Flickr's Tickets64, --bits 32: Tickets32)")
    sub.add_argument("--bits", type=int, choices=(32, 64), default=64)
    sub.add_argument("--count", type=_int_between(1, MAX_COUNT), default=1,
                     help=f"how many ids, 1 to {MAX_COUNT:,} (default 1)")


@command("next", "print ids, one per line, as they arrive", _next_arguments,
         servers={"create_missing": False}, existing=True)
def _next(args: argparse.Namespace) -> int:
    servers: list[TicketServer] = args.servers
    source: TicketServer | TicketServers = (
        servers[0] if len(servers) == 1 else TicketServers(servers)
    )
    out = sys.stdout
    for block in _blocks(source, args.sequence, args.count, args.bits):
        out.write("".join(f"{i}\n" for i in block))
        out.flush()
    return 0


def _blocks(
    source: TicketServer | TicketServers, sequence: str | None, count: int, bits: int
) -> Iterable[range]:
    """``count`` ids of ``sequence`` in blocks of at most :data:`BLOCK`, each drawn when the
    previous one has been printed: ids are never all held at once."""
    left = count
    while left > 0:
        block = source.next_block(sequence, min(left, BLOCK), bits=bits)
        if len(block) == 0:
            raise TicketsError(f"{source!r} returned an empty block for {sequence!r}")
        yield block[:left]
        left -= len(block[:left])


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


def _upstream_health(urls: Sequence[URL]) -> list[ServerHealth]:
    """Each ``--upstream`` server asked, on a :class:`TicketServer` that creates nothing."""
    if not urls:
        return []
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


@command("restride", "give N servers (the new, full list, in order) the strides 1..N of N",
         _restride_arguments, servers={})
def _restride(args: argparse.Namespace) -> int:
    servers: list[TicketServer] = args.servers
    highest = restride(servers, args.sequences or None)
    print(f"restrided {len(servers)} server(s): increment {len(servers)}, offsets "
          f"1..{len(servers)}, every new id above {highest}")
    return 0


# -- lookup -------------------------------------------------------------------------------------

#: Exit code of ``lookup`` when the id is well formed and its class known, but no row has it.
NOT_FOUND = 4


def _lookup_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--url", required=True, type=_app_url, metavar="URL",
                     help="the application's database (where the rows are)")
    sub.add_argument("--models", action="append", required=True, metavar="MODULE",
                     help="module that declares the mapped classes, e.g. myapp.models "
                     "(repeatable; imported with the current directory on the path)")
    sub.add_argument("--json", action="store_true", help="print the row as one JSON object")
    sub.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS",
                     help="give up on a database that does not answer within this (default 10)")
    sub.add_argument("value", metavar="ID",
                     help="a prefixed id, e.g. post_01h455vb4pex5vsknk084sn02q")


def _app_url(text: str) -> URL:
    """An argparse type: the URL of an application database, of any dialect SQLAlchemy has."""
    try:
        url = make_url(text)
        url.get_dialect()  # imports the dialect's module only; nothing is connected
    except Exception:  # noqa: BLE001 - ArgumentError, NoSuchModuleError, ValueError...
        raise argparse.ArgumentTypeError(
            f"invalid database URL {text!r}: expected e.g. 'postgresql+psycopg://user@host/db', "
            "'mysql+pymysql://user@host/db' or 'sqlite:///app.db'"
        ) from None
    return url


def _seconds(text: str) -> float:
    """An argparse type: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {text}")
    return value


def _lookup_check(args: argparse.Namespace) -> None:
    from .generators.prefixed import split
    from .prefix_lookup import owner_of

    try:
        split(args.value)  # a malformed id is refused before any module is imported
    except TicketsError as error:
        raise _Usage(str(error)) from None
    here = os.getcwd()
    if here not in sys.path:  # as `python -m`, Alembic and Flask do: the project's own package
        sys.path.insert(0, here)
    for name in args.models:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - whatever the module raised, in one line
            first = (str(error).strip().splitlines() or [""])[0]
            raise _Usage(f"--models {name}: cannot import it: {type(error).__name__}: "
                         f"{first}") from None
    try:
        args.owner = owner_of(args.value)
    except (TicketsError, SQLAlchemyError) as error:
        raise _Usage(str(error)) from None


@command("lookup", f"print the row a prefixed id names (exit {NOT_FOUND}: no such row)",
         _lookup_arguments, check=_lookup_check)
def _lookup(args: argparse.Namespace) -> int:
    from sqlalchemy import create_engine, inspect
    from sqlalchemy.orm import Session
    from sqlalchemy.pool import NullPool

    from .prefix_lookup import lookup
    from .timeouts import apply_timeouts

    url: URL = args.url
    try:
        backend = backend_for(url.get_backend_name())
    except TicketsError:
        backend = None  # a dialect the library has no ticket backend for: look up all the same
    problem = backend.missing_database(url) if backend is not None else None
    if problem is not None:
        raise TicketsError(f"{problem}: no record to look up there")
    owner = f"{args.owner.__module__}.{args.owner.__qualname__}"
    engine = apply_timeouts(create_engine(url, poolclass=NullPool), args.timeout)
    try:
        with Session(engine) as session:
            found = lookup(session, args.value)
            if found is None:
                print(f"sqlalchemy-tickets: no row has the id {args.value} ({owner})",
                      file=sys.stderr)
                return NOT_FOUND
            cls = type(found)
            # The object's own mapper: a subclass shows its own columns too.
            values = {attr.key: getattr(found, attr.key)
                      for attr in inspect(found).mapper.column_attrs}
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"class": f"{cls.__module__}.{cls.__qualname__}", "id": args.value,
                          "values": values}, default=str))
        return 0
    print(f"{cls.__qualname__} {args.value}")
    for key, value in values.items():
        print(f"  {key}: {value}")
    return 0
