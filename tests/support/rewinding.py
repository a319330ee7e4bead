"""Rewinds made for tests: a ticket table's row set back, a database's backup restored in
place, and what tests check after them (no id twice, the rewind WARNINGs)."""

from __future__ import annotations

import logging
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from support.rewind import dump, restore


def assert_distinct(ids: list[int]) -> None:
    twice = sorted(i for i, n in Counter(ids).items() if n > 1)
    assert not twice, f"{len(twice)} ids handed out twice, e.g. {twice[:10]}"


def rewind_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sqlalchemy_tickets"
        and r.levelno == logging.WARNING
        and "went back in time" in r.getMessage()
    ]


def snapshot(url: str, path: Path) -> Path:
    """A backup: ``pg_dump``/``mariadb-dump``, or a copy of the SQLite file."""
    database = make_url(url).database
    if make_url(url).get_backend_name() == "sqlite":
        assert database
        shutil.copy(database, path)
        return path
    return dump(url, path)


def put_back(url: str, path: Path) -> None:
    """:func:`snapshot` restored in place (SQLite: the file replaced by a copy, a new inode)."""
    database = make_url(url).database
    if make_url(url).get_backend_name() == "sqlite":
        assert database
        staged = Path(f"{database}.restoring")
        shutil.copy(path, staged)
        os.replace(staged, database)
        return
    restore(url, path)


def set_back(url: str, last: int, table: str = "tickets__photos") -> None:
    """The ticket table's row set back to ``last``, as an owner restoring an older copy of
    the row does (the table, and so its identity, unchanged)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"UPDATE {table} SET id = :last"), {"last": last})
    finally:
        engine.dispose()
