"""Rewinds met by many threads at once (CONTRACT §9: one WARNING and one count per rewind).

A ticket database that went back in time is met by every thread drawing from it: each one's
block is at or below what the process issued, or the take finds the table's identity changed.
Exactly one of them heals it — one move above the floor plus one margin, one WARNING, one
count in ``stats()["rewinds"]`` — and the others wait for that heal and go on with the healed
table. A later rewind, separate from the first, is healed again.

Rewinds are real: the ticket table's row set back as an owner restoring an older copy of it
would (the table itself unchanged), or the whole database restored from its dump
(``pg_dump``/``mariadb-dump``, a replaced SQLite file: a new identity).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

from sqlalchemy_tickets import TicketServer, TicketServerUnavailable
from support.rewinding import assert_distinct, put_back, rewind_warnings, set_back, snapshot

ALL = ("sqlite", "postgresql", "mysql")
THREADS = 8
#: Rewinds in a row per test: threads that meet one rewind together race for it; ten in a
#: row lose that race every run when the heal is not single-flight.
REPEATS = 10
MARGIN = 1_000


def together(server: TicketServer, *, replaced_file: bool = False) -> list[int]:
    """Three ids drawn by each of :data:`THREADS` threads released at once (one
    :class:`threading.Barrier`); an error in any of them fails the test. ``replaced_file``:
    a SQLite file was replaced under the server, whose kept connections to the old file may
    fail once with ``disk I/O error`` (a known, separate problem): asked again."""
    barrier = threading.Barrier(THREADS)
    got: list[list[int]] = [[] for _ in range(THREADS)]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            while len(got[i]) < 3:
                try:
                    got[i].append(server.next_id("photos"))
                except TicketServerUnavailable as error:
                    if not replaced_file or "disk I/O error" not in str(error):
                        raise
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads), "a drawing thread hangs"
    assert not errors, errors
    return [i for ids in got for i in ids]


def check_one_heal(
    server: TicketServer,
    caplog: pytest.LogCaptureFixture,
    rewind: Callable[[], Any],
    *,
    replaced_file: bool = False,
) -> None:
    """:data:`REPEATS` rewinds in a row, each met by :data:`THREADS` threads at once: each is
    healed once (one WARNING, one count, one margin), and none repeats an id."""
    issued = [server.next_id("photos") for _ in range(20)]
    for repeat in range(REPEATS):
        issued += [server.next_id("photos") for _ in range(5)]
        before = max(issued)
        rewind()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            after = together(server, replaced_file=replaced_file)
        warnings = rewind_warnings(caplog)
        assert len(warnings) == 1, (repeat, warnings)
        assert server.stats()["rewinds"] == repeat + 1, (repeat, warnings)
        assert min(after) > before, repeat
        # One margin above the highest id issued, not one per thread that met the rewind
        # (a few blocks may be burned on the way).
        assert max(after) < before + server.rewind_margin + 10 * len(after), (
            repeat, before, sorted(after))
        issued += after
        assert_distinct(issued)


def without_stamps(url: str) -> None:
    """The database as a release before the stamp table left it: ticket tables, no
    ``tickets_stamps`` (a client with ``create_missing=False`` goes on without a record)."""
    server = TicketServer(url)
    try:
        server.create("photos")
    finally:
        server.close()
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("DROP TABLE tickets_stamps"))
    finally:
        engine.dispose()


@pytest.mark.backend(*ALL)
@pytest.mark.parametrize("margin", [MARGIN, 0])
def test_a_row_set_back_under_many_threads_is_healed_once(
    backend: str,
    margin: int,
    make_database: Callable[[str], str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The table's identity unchanged: the threads' blocks at or below what was issued show
    the rewind, and one heal moves the mark past all of them (with ``rewind_margin=0`` the
    mark moves to the floor itself, no higher than the blocks the others compared with)."""
    url = make_database(backend)
    server = TicketServer(url, rewind_margin=margin)
    try:
        check_one_heal(server, caplog, lambda: set_back(url, 5))
    finally:
        server.close()


@pytest.mark.backend(*ALL)
@pytest.mark.parametrize("stamps", ["recorded", "no stamp table"])
def test_a_database_restored_under_many_threads_is_healed_once(
    backend: str,
    stamps: str,
    make_database: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The table's identity changed: each thread that compares it finds the rewind. Without a
    stamp table (tables made by a release before it) nothing in the database says it was
    healed: the threads that waited must know it from the one that healed."""
    url = make_database(backend)
    if stamps == "no stamp table":
        without_stamps(url)
    server = TicketServer(url, rewind_margin=MARGIN, create_missing=stamps == "recorded")
    try:
        server.next_id("photos")
        backup = snapshot(url, tmp_path / "backup")
        check_one_heal(server, caplog, lambda: put_back(url, backup),
                       replaced_file=backend == "sqlite")
    finally:
        server.close()
