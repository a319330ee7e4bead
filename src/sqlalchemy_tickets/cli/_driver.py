"""The driver: the parser built from the registered subcommands, and ``main``."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from sqlalchemy.exc import SQLAlchemyError

from .. import __version__
from ..dialects import DriverNotInstalledError
from ..errors import TicketsError
from ._common import (
    COMMANDS,
    _build_servers,
    _require_database,
    _Usage,
    is_target,
    resolve_urls,
)

# -- the driver ---------------------------------------------------------------------------------

logger = logging.getLogger("sqlalchemy_tickets")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    try:
        args = parser().parse_args(argv)
    except SystemExit as done:  # argparse: --help, --version (0) or a malformed command line (2)
        return done.code if isinstance(done.code, int) else 2
    level = logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    if args.verbose < 2:
        # kazoo (zookeeper:// URLs) logs each lost connection as a WARNING; a failure is
        # reported once, in the command's own line (-vv shows kazoo's).
        logging.getLogger("kazoo").setLevel(logging.CRITICAL)
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
                if not is_target(server):  # a source named by a URL creates nothing
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
