"""What every subcommand shares: the registry of subcommands, the argument types and the
checks made before anything is read or written, and the rendering of tables."""

from __future__ import annotations

import argparse
import configparser
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .._naming import (
    DEFAULT_TIER_PREFIX,
    normalize_sequence,
    tier_tables,
)
from ..admin import (
    check_identifier,
)
from ..dialects import backend_for
from ..errors import TicketsError
from ..sources import _urls
from ..sources._urls import SourceUrl
from ..sources.server import TicketServer

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



# -- argument types and shared checks -------------------------------------------------------------


def _url(text: str) -> URL | SourceUrl:
    """An argparse type: a database URL whose backend this library supports, or a URL of a
    registered scheme (``zookeeper://h1:2181,h2:2181/path``), checked with no I/O."""
    if _urls.scheme_of(text) is not None:
        try:
            return _urls.parse(text)
        except TicketsError as error:
            raise argparse.ArgumentTypeError(str(error)) from None
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


def resolve_urls(args: argparse.Namespace) -> list[URL | SourceUrl]:
    """The ticket servers' URLs: ``--url``, else ``--config``, else ``$TICKETS_URL``, else
    ``./sqlalchemy-tickets.ini``. Raises :class:`_Usage` naming what is wrong (and the file)."""
    urls: list[URL | SourceUrl] | None = getattr(args, "urls", None)
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


def _urls_from_file(path: Path) -> list[URL | SourceUrl]:
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


def _checked_url(text: str, where: str) -> URL | SourceUrl:
    try:
        return _url(text)
    except argparse.ArgumentTypeError as error:
        raise _Usage(f"{error} ({where})") from None


def _build_servers(urls: Sequence[URL | SourceUrl], options: dict[str, Any]) -> list[Any]:
    """One :class:`TicketServer` per database URL, the source a URL of a registered scheme
    names for the others (an :class:`~sqlalchemy_tickets.sources._urls.AdminTarget`).
    Building one opens no connection."""
    built: list[Any] = []
    try:
        for url in urls:
            if isinstance(url, SourceUrl):
                built.append(url.build(**options))
            else:
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


def _shown(url: URL | SourceUrl | str) -> str:
    return url if isinstance(url, str) else url.render_as_string(hide_password=True)


def foreign(urls: Sequence[URL | SourceUrl]) -> SourceUrl | None:
    """The URL of a registered scheme among ``urls`` (``None``: all are databases); such a
    URL names a whole source, so it comes alone (:class:`_Usage` otherwise)."""
    found = [url for url in urls if isinstance(url, SourceUrl)]
    if not found:
        return None
    if len(urls) > 1:
        raise _Usage(f"a {found[0].scheme.name}:// URL names a source of its own: give it "
                     "alone, not with other --url")
    return found[0]


def is_target(server: object) -> bool:
    """Whether ``server`` (from ``args.servers``) is a source named by a registered URL."""
    return not isinstance(server, TicketServer)
