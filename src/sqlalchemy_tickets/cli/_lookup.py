"""``lookup``: the row a prefixed id names."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import SQLAlchemyError

from ..dialects import backend_for
from ..errors import TicketsError
from ._common import (
    _Usage,
    command,
)

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
    from ..generators.prefixed import split
    from ..prefix_lookup import owner_of

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

    from ..prefix_lookup import lookup
    from ..timeouts import apply_timeouts

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
