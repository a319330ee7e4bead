"""Ticket databases that go back in time (CONTRACT §9): a dump restored in place under running
processes, one server of an odd/even pair restored, an asynchronous replica promoted after its
primary crashed, a SQLite file replaced by an older copy, and sequences that start below keys
their tables already hold (a table moved from auto-increment, the embedded default replaced by
a fresh dedicated server).

Every scenario ends either with *no id handed out twice* (every id a test got, before and after
the fault, is collected and checked) or with a ``RewindError`` before any id, then the real
``sqlalchemy-tickets sync --above N`` command, after which the same running object issues ids
above ``N`` again. Faults are real: the installed dump/restore tools, real replicas and kills
(``support.rewind``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    RewindError,
    TicketId,
    TicketServer,
    TicketServers,
    TicketServerUnavailable,
    configure,
)
from support.cli import run
from support.processes import WORKERS
from support.rewind import (
    FollowingProxy,
    MariaDbPair,
    PgPair,
    dump,
    mariadb_connect,
    pg_connect,
    restore,
    start_mariadb_pair,
    start_postgresql_pair,
)
from support.rewinding import assert_distinct, rewind_warnings
from support.servers import ServerProcess

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

SERVERS = ("postgresql", "mysql")
ALL = ("sqlite", "postgresql", "mysql")
#: Seconds a loop waiting for a cache or a failover may run before the test fails.
DEADLINE = 30.0


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def snapshot(url: str, path: Path) -> Path:
    """A backup of the database ``url`` names: ``pg_dump``/``mariadb-dump``, or a copy of a
    SQLite file made with ``shutil.copy``."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        assert u.database
        shutil.copy(u.database, path)
        return path
    return dump(url, path)


def put_back(url: str, path: Path) -> None:
    """Restore :func:`snapshot` in place: ``pg_restore``/``mariadb`` into the live database
    (clients stay connected), or the SQLite file replaced by a copy of the backup
    (``os.replace``: a new inode, as a restore from a backup makes)."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        assert u.database
        staged = Path(f"{u.database}.restoring")
        shutil.copy(path, staged)
        os.replace(staged, u.database)
        return
    restore(url, path)


def last_id(url: str, sequence: str = "photos") -> int | None:
    """The sequence's last issued id as the database shows it (a read: checks nothing)."""
    server = TicketServer(url, create_missing=False)
    try:
        info = server.describe(sequence)
    finally:
        server.close()
    return None if info is None else info.last_id


def draw(source: Any, count: int, sequence: str = "photos") -> list[int]:
    """``count`` ids from ``source``, as singles and blocks of 7 in turn."""
    ids: list[int] = []
    while len(ids) < count:
        if len(ids) % 2:
            ids.append(source.next_id(sequence))
        else:
            ids.extend(source.next_block(sequence, min(7, count - len(ids))))
    return ids


def draw_through(source: Any, count: int, errors: list[str]) -> list[int]:
    """``count`` ids from ``source``, asking again when a server is unreachable for a moment
    (a crash, a failover, a connection to a replaced file); what it said goes to ``errors``."""
    ids: list[int] = []
    deadline = time.monotonic() + DEADLINE
    while len(ids) < count:
        try:
            ids.extend(draw(source, 1))
        except TicketServerUnavailable as error:
            errors.append(str(error))
            assert time.monotonic() < deadline, f"still unavailable: {errors[-3:]}"
            time.sleep(0.1)
    return ids


def sync_above(url: str, above: int, *sequences: str) -> None:
    """The operator's fix, as the console script runs it."""
    result = run("sync", "--url", url, "--above", str(above), *sequences)
    assert result.returncode == 0, result.stderr
    assert "identity recorded" in result.stdout


def _issue_in_child(url: str, count: int, queue: Any) -> None:
    """In a spawned process: ``count`` ids of ``photos`` from a TicketServer of its own."""
    server = TicketServer(url)
    try:
        queue.put(draw(server, count))
    finally:
        server.close()


def issued_by_another_process(url: str, count: int) -> list[int]:
    queue = WORKERS.Queue()
    child = WORKERS.Process(target=_issue_in_child, args=(url, count, queue))
    child.start()
    try:
        ids: list[int] = queue.get(timeout=120)
    finally:
        child.join(30)
    assert child.exitcode == 0
    return ids


# --------------------------------------------------------------------------------------------
# 1. A dump restored in place while a process keeps running
# --------------------------------------------------------------------------------------------


@pytest.mark.backend(*SERVERS)
def test_a_running_server_heals_a_restore_in_place(
    backend: str,
    make_database: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = make_database(backend)
    server = TicketServer(url)
    try:
        before = draw(server, 30)
        backup = snapshot(url, tmp_path / "backup")
        before += draw(server, 30)  # ids the backup never saw
        put_back(url, backup)
        assert last_id(url) == 30  # the database did go back

        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            after = draw(server, 30)
        assert_distinct(before + after)
        assert min(after) > max(before)  # healed above everything it issued
        assert server.stats()["rewinds"] >= 1
        assert rewind_warnings(caplog)
    finally:
        server.close()


@pytest.mark.backend(*SERVERS)
def test_a_running_cache_over_a_server_never_repeats_an_id_after_a_restore_in_place(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    url = make_database(backend)
    server = TicketServer(url)
    cache = CachedSource(server, max_block=500)
    try:
        ids = draw(cache, 200)
        backup = snapshot(url, tmp_path / "backup")
        # At or above the dump's counter: the cache's background refills go on meanwhile.
        dumped = last_id(url)
        assert dumped is not None
        # The cache hands out ids past the dump point: the restored counter offers them again.
        deadline = time.monotonic() + DEADLINE
        while max(ids) <= dumped + 100:
            ids.extend(cache.next_block("photos", 50))
            assert time.monotonic() < deadline
        put_back(url, backup)
        # The database went back (unless a background refill already met the restored
        # counter and healed it, which also says it went back).
        assert last_id(url) <= dumped or server.stats()["rewinds"] >= 1

        # Keep drawing until ids come from blocks taken after the restore (healed ones, above
        # the margin): the cache's blocks in hand are used up and refilled from the server.
        while server.stats()["rewinds"] == 0 or max(ids) <= dumped + 1_000_000:
            ids.extend(cache.next_block("photos", 50))
            ids.append(cache.next_id("photos"))
            assert time.monotonic() < deadline, f"no healed block yet: {server.stats()}"
        ids.extend(draw(cache, 200))
        assert_distinct(ids)
        assert server.stats()["rewinds"] >= 1
    finally:
        cache.close()
        server.close()


@pytest.mark.backend(*SERVERS)
def test_a_process_below_the_restored_value_does_not_repeat_another_process_ids(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """Two processes on one ticket database; the other one issued the higher ids. After the
    restore the counter resumes *above* this process's own high-water mark, so only the
    table's changed identity can tell that those ids were handed out already."""
    url = make_database(backend)
    server = TicketServer(url)
    try:
        mine = draw(server, 10)
        checked = time.monotonic()
        backup = snapshot(url, tmp_path / "backup")
        theirs = issued_by_another_process(url, 200)
        assert min(theirs) > max(mine)
        put_back(url, backup)
        assert last_id(url) == max(mine)  # the next id offered is above our own mark
        # This process was idle for longer than the identity interval (checks within it are
        # the subject of test_a_restore_right_after_a_block_is_caught_on_the_next_block).
        time.sleep(max(0.0, server.identity_interval - (time.monotonic() - checked)) + 0.05)

        after = draw(server, 30)
        assert_distinct(mine + theirs + after)
        assert server.stats()["rewinds"] >= 1
        # A third process, started now, carries on without repeating either.
        later = issued_by_another_process(url, 20)
        assert_distinct(mine + theirs + after + later)
    finally:
        server.close()


@pytest.mark.backend(*SERVERS)
def test_a_restore_right_after_a_block_is_caught_on_the_next_block(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """CONTRACT §9: "the first block after such a rewind is recognised". A process that took a
    block a moment before the restore, while another process took the ids the backup lacks,
    must not offer those ids again on its very next block."""
    url = make_database(backend)
    mine, other = TicketServer(url), TicketServer(url)
    try:
        ids = [mine.next_id("photos")]
        backup = snapshot(url, tmp_path / "backup")
        theirs = list(other.next_block("photos", 100))
        put_back(url, backup)
        ids += list(mine.next_block("photos", 10))
        assert_distinct(ids + theirs)
    finally:
        mine.close()
        other.close()


@pytest.mark.backend(*SERVERS)
def test_one_restore_is_healed_once_with_one_warning(
    backend: str,
    make_database: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """CONTRACT §9: a rewind is moved above the floor, "logs one WARNING and counts it". A
    running server that keeps issuing past its identity interval must not heal (and jump by
    another margin) a second time for the same restore."""
    url = make_database(backend)
    server = TicketServer(url)
    try:
        ids = draw(server, 10)
        backup = snapshot(url, tmp_path / "backup")
        ids += draw(server, 10)
        put_back(url, backup)
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            ids += draw(server, 10)
            time.sleep(server.identity_interval + 0.2)  # the next identity check is due
            ids += draw(server, 10)
        assert_distinct(ids)
        assert server.stats()["rewinds"] == 1, rewind_warnings(caplog)
        assert len(rewind_warnings(caplog)) == 1
        assert max(ids) < 20 + server.rewind_margin + 100  # moved above the floor once
    finally:
        server.close()


@pytest.mark.backend(*SERVERS)
def test_a_new_process_trusts_a_sequence_a_running_process_healed(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """Once a running process moved the restored sequence above what it issued (and re-recorded
    what the table is), a process started afterwards issues from there: it does not refuse a
    sequence that is already safe (status shows it as recorded)."""
    url = make_database(backend)
    server = TicketServer(url)
    try:
        ids = draw(server, 10)
        backup = snapshot(url, tmp_path / "backup")
        ids += draw(server, 10)
        put_back(url, backup)
        ids += draw(server, 10)
        assert server.stats()["rewinds"] == 1
    finally:
        server.close()  # the process that healed it ends

    fresh = TicketServer(url)
    try:
        ids += draw(fresh, 10)
        assert_distinct(ids)
    finally:
        fresh.close()
    status = run("status", "--url", url)
    assert status.returncode == 0, status.stdout + status.stderr


@pytest.mark.backend("mysql")
def test_mariadb_a_restore_within_the_second_the_table_was_made_is_noticed(
    make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """CREATE_TIME has one-second resolution; as root (PROCESS privilege) the InnoDB table id
    tells a table restored within that same second from the one dumped."""

    def created(url: str) -> Any:
        conn = mariadb_connect(url)
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT CREATE_TIME FROM information_schema.TABLES "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'tickets__photos'"
                )
                return cur.fetchone()[0]
        finally:
            conn.close()

    for _attempt in range(3):
        url = make_database("mysql")
        time.sleep(1.02 - time.time() % 1)  # start early in a second
        server = TicketServer(url)
        ids = draw(server, 5)
        server.close()
        was = created(url)
        backup = snapshot(url, tmp_path / "backup")
        put_back(url, backup)
        if created(url) == was:
            break
    else:
        pytest.fail("could not restore within the second the table was made")

    fresh = TicketServer(url)
    try:
        with pytest.raises(RewindError, match="--above"):
            fresh.next_id("photos")
        sync_above(url, max(ids), "photos")
        assert min(draw(fresh, 5)) > max(ids)
    finally:
        fresh.close()


# --------------------------------------------------------------------------------------------
# 2. A fresh process after a restore, and on_rewind="refuse": RewindError, then sync
# --------------------------------------------------------------------------------------------


@pytest.mark.backend(*ALL)
def test_a_fresh_process_refuses_a_restored_sequence_until_sync(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    url = make_database(backend)
    writer = TicketServer(url)
    ids = draw(writer, 10)
    backup = snapshot(url, tmp_path / "backup")
    ids += draw(writer, 10)
    writer.close()
    put_back(url, backup)

    fresh = TicketServer(url)  # no history: no floor of its own
    try:
        for attempt in ("next_id", "next_block"):
            with pytest.raises(RewindError) as refused:
                if attempt == "next_id":
                    fresh.next_id("photos")
                else:
                    fresh.next_block("photos", 5)
            message = str(refused.value)
            assert "sqlalchemy-tickets sync" in message and "--above" in message
            assert "photos" in message
        assert last_id(url) == 10  # nothing issued, nothing burned
        assert fresh.stats()["issued"] == 0

        sync_above(url, max(ids), "photos")
        after = draw(fresh, 20)  # the very object that refused
        assert min(after) > max(ids)
        assert_distinct(ids + after)
    finally:
        fresh.close()


@pytest.mark.backend(*SERVERS)
def test_a_running_server_that_refuses_rewinds_resumes_after_sync(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """CONTRACT §9: after the operator's sync "issuing resumes, in running processes too"."""
    url = make_database(backend)
    server = TicketServer(url, on_rewind="refuse")
    try:
        ids = draw(server, 10)
        backup = snapshot(url, tmp_path / "backup")
        ids += draw(server, 10)
        put_back(url, backup)

        issued = server.stats()["issued"]
        with pytest.raises(RewindError, match="--above") as refused:
            server.next_id("photos")
        assert str(max(ids)) in str(refused.value)  # the floor it knows, named
        with pytest.raises(RewindError):
            server.next_block("photos", 5)
        assert server.stats()["rewinds"] == 0  # refused, not healed
        assert server.stats()["issued"] == issued

        above = max(ids) + 1000
        sync_above(url, above, "photos")
        after = draw(server, 20)  # no restart
        assert min(after) > above
        assert_distinct(ids + after)
    finally:
        server.close()


# --------------------------------------------------------------------------------------------
# 3. One server of an odd/even pair restored
# --------------------------------------------------------------------------------------------


@pytest.mark.backend(*SERVERS)
def test_one_server_of_a_pair_restored_heals_above_its_peer(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    odd_url, even_url = make_database(backend), make_database(backend)
    pair = TicketServers([odd_url, even_url])
    try:
        ids = draw(pair, 40)
        assert {i % 2 for i in ids} == {0, 1}
        backup = snapshot(odd_url, tmp_path / "odd")
        ids += draw(pair, 40)
        put_back(odd_url, backup)
        even_last = last_id(even_url)
        assert even_last is not None

        after = draw(pair, 40)
        assert_distinct(ids + after)
        assert pair.stats()["rewinds"] >= 1
        healed = [i for i in after if i % 2 == 1]
        assert healed and min(healed) > even_last  # above its peer, not just above itself

        # The even one restored too, seen first by a new process with no history: the odd
        # server, its peer, is the floor it heals above.
        backup = snapshot(even_url, tmp_path / "even")
        after += draw(pair, 20)
        put_back(even_url, backup)
        fresh = TicketServers([odd_url, even_url])
        try:
            later = draw(fresh, 40)
        finally:
            fresh.close()
        later += draw(pair, 40)
        assert_distinct(ids + after + later)
    finally:
        pair.close()


@pytest.mark.backend(*SERVERS)
def test_status_does_not_call_a_healthy_pair_behind(
    backend: str, make_database: Callable[[str], str]
) -> None:
    """An odd/even pair serving blocks has servers a block apart; neither was restored, so
    ``status`` has nothing to warn about (exit 3 would page an operator for nothing)."""
    odd_url, even_url = make_database(backend), make_database(backend)
    pair = TicketServers([odd_url, even_url])
    try:
        pair.next_id("photos")
        pair.next_id("photos")
        pair.next_block("photos", 1000)
    finally:
        pair.close()
    status = run("status", "--url", odd_url, "--url", even_url)
    assert "behind" not in status.stderr + status.stdout, status.stderr
    assert status.returncode == 0, status.stderr


# --------------------------------------------------------------------------------------------
# 4. An asynchronous replica promoted after the primary crashed
# --------------------------------------------------------------------------------------------


@pytest.fixture
def replica_pair(
    backend: str,
    backend_servers: Any,
    private_mariadb_factory: Callable[..., ServerProcess],
) -> Iterator[PgPair | MariaDbPair]:
    """A private primary and its asynchronous replica, with database ``rw`` on both."""
    pair: PgPair | MariaDbPair
    if backend == "postgresql":
        pair = start_postgresql_pair(backend_servers.postgres_workdir())
        with pg_connect(pair.primary.url) as conn:
            conn.execute("CREATE DATABASE rw")
    else:
        pair = start_mariadb_pair(private_mariadb_factory)
        conn = mariadb_connect(pair.primary.url)
        try:
            with conn.cursor() as cur:
                cur.execute("CREATE DATABASE rw")
        finally:
            conn.close()
    try:
        yield pair
    finally:
        pair.primary.kill()
        pair.replica.kill()


@pytest.mark.backend(*SERVERS)
def test_a_promoted_replica_that_missed_writes_repeats_no_id(
    replica_pair: PgPair | MariaDbPair,
) -> None:
    pair = replica_pair
    primary_url, replica_url = pair.database_urls("rw")
    proxy = FollowingProxy.for_url(primary_url)
    url = proxy.url(primary_url)  # what clients use: it does not change on failover
    server = TicketServer(url, timeout=2.0)
    fresh: TicketServer | None = None
    errors: list[str] = []
    try:
        ids = draw(server, 30)
        pair.wait_caught_up()
        seen_by_replica = max(ids)
        pair.cut_replication()
        ids += draw(server, 30)  # acknowledged, never replicated
        pair.crash_primary()
        pair.promote()
        proxy.follow(replica_url)
        assert last_id(replica_url) == seen_by_replica  # the replica did miss them

        # A process started now has no history: it refuses, before any id.
        fresh = TicketServer(url, timeout=2.0)
        with pytest.raises(RewindError, match="--above"):
            fresh.next_id("photos")
        assert last_id(replica_url) == seen_by_replica

        # The running one heals (its first calls may meet the connections the crash cut).
        after = draw_through(server, 30, errors)
        assert_distinct(ids + after)
        assert min(after) > max(ids)
        assert server.stats()["rewinds"] >= 1

        above = max(ids + after)
        sync_above(url, above, "photos")
        resumed = draw(fresh, 20)  # the object that refused
        assert min(resumed) > above
        later = draw(server, 20)
        assert_distinct(ids + after + resumed + later)
    finally:
        server.close()
        if fresh is not None:
            fresh.close()
        proxy.close()


# --------------------------------------------------------------------------------------------
# 5. Sequences that start below keys already in use: auto-increment cut-over, dedicated server
# --------------------------------------------------------------------------------------------


class Base(DeclarativeBase):
    pass


class Photo(Base):
    __tablename__ = "photos"

    id: Mapped[int] = mapped_column(TicketId("photos"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))


@pytest.fixture
def legacy_photos(backend: str, make_database: Callable[[str], str]) -> Iterator[str]:
    """A database whose ``photos`` table an auto-increment filled up to key 500 (plain SQL);
    nothing configured, and the default source restored afterwards."""
    url = make_database(backend)
    key = {
        "postgresql": "serial PRIMARY KEY",
        "mysql": "INT AUTO_INCREMENT PRIMARY KEY",
        "sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT",
    }[backend]
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"CREATE TABLE photos (id {key}, title VARCHAR(50))"))
            conn.execute(
                sa.text("INSERT INTO photos (title) VALUES (:t)"),
                [{"t": f"legacy {n}"} for n in range(500)],
            )
            assert conn.execute(sa.text("SELECT max(id) FROM photos")).scalar() == 500
    finally:
        engine.dispose()
    configure(None)
    try:
        yield url
    finally:
        configure(None)


def keys(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(sa.select(Photo.id).order_by(Photo.id)).scalars())


def add_photos(engine: Engine, count: int) -> list[int]:
    with Session(engine) as session:
        photos = [Photo(title=f"new {n}") for n in range(count)]
        session.add_all(photos)
        session.commit()
        return [p.id for p in photos]


@pytest.mark.backend(*ALL)
def test_an_auto_increment_table_switched_to_ticket_id_gets_new_keys_above_its_rows(
    legacy_photos: str,
) -> None:
    engine = sa.create_engine(legacy_photos)
    try:
        new = add_photos(engine, 20)  # the embedded default, nothing configured
        assert min(new) > 500
        assert len(keys(engine)) == 520
        assert_distinct(keys(engine))
        more = add_photos(engine, 5)  # the same process carries on
        assert min(more) > 500 and len(keys(engine)) == 525
    finally:
        engine.dispose()


@pytest.mark.backend(*ALL)
def test_moving_from_the_embedded_default_to_a_fresh_dedicated_server(
    backend: str, legacy_photos: str, make_database: Callable[[str], str]
) -> None:
    engine = sa.create_engine(legacy_photos)
    try:
        embedded = add_photos(engine, 20)
        assert min(embedded) > 500
    finally:
        engine.dispose()

    # The application restarts with a dedicated ticket server, new and empty: its sequence
    # starts at 1, below every key the embedded default handed out.
    dedicated = TicketServer(make_database(backend))
    configure(dedicated)
    engine = sa.create_engine(legacy_photos)
    try:
        new = add_photos(engine, 20)
        assert min(new) > max(embedded)
        assert_distinct(keys(engine))
        assert len(keys(engine)) == 540
    finally:
        configure(None)
        engine.dispose()
        dedicated.close()


@pytest.mark.backend(*ALL)
def test_core_inserts_into_a_switched_table_get_keys_above_its_rows(
    backend: str, legacy_photos: str, make_database: Callable[[str], str]
) -> None:
    table = Photo.__table__
    assert isinstance(table, sa.Table)
    # Embedded default: an executemany, then a single row, through Core.
    engine = sa.create_engine(legacy_photos)
    try:
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"title": f"core {n}"} for n in range(10)])
            conn.execute(table.insert(), {"title": "one more"})
        got = keys(engine)
        assert len(got) == 511 and min(got[500:]) > 500
    finally:
        engine.dispose()

    # A fresh dedicated server, met first by Core and ORM bulk inserts.
    dedicated = TicketServer(make_database(backend))
    configure(dedicated)
    engine = sa.create_engine(legacy_photos)
    try:
        before = max(keys(engine))
        with engine.begin() as conn:
            conn.execute(table.insert(), [{"title": f"dedicated {n}"} for n in range(10)])
        with Session(engine) as session:
            session.execute(sa.insert(Photo), [{"title": f"bulk {n}"} for n in range(10)])
            session.commit()
        got = keys(engine)
        assert len(got) == 531 and min(got[511:]) > before
        assert_distinct(got)
    finally:
        configure(None)
        engine.dispose()
        dedicated.close()


# --------------------------------------------------------------------------------------------
# 6. status after a restore, then sync
# --------------------------------------------------------------------------------------------


@pytest.mark.backend(*ALL)
def test_status_flags_a_restored_identity_until_sync(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    url = make_database(backend)
    writer = TicketServer(url)
    try:
        assert draw(writer, 10)[-1] == 10
        backup = snapshot(url, tmp_path / "backup")
        assert draw(writer, 10)[-1] == 20
    finally:
        writer.close()
    put_back(url, backup)

    # No process has seen the restored database yet.
    status = run("status", "--url", url)
    assert status.returncode == 3, status.stdout + status.stderr
    header, _rule, row = status.stdout.splitlines()[:3]
    assert header.split()[-1] == "identity"
    assert row.split()[1] == "photos" and row.split()[-1] == "CHANGED"
    assert "identity changed" in status.stderr and "--above" in status.stderr
    # 11..20 were issued before the restore: the advice never names the restored 10 as enough.
    assert "largest key of the tables this sequence serves" in status.stderr
    assert "N >= 10" not in status.stderr and "N above every id issued" in status.stderr
    (shown,) = json.loads(run("status", "--url", url, "--json").stdout)
    assert shown["identity"] and shown["identity_now"]
    assert shown["identity"] != shown["identity_now"]

    sync_above(url, 20, "photos")
    status = run("status", "--url", url)
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.splitlines()[2].endswith("as recorded")
    reader = TicketServer(url)
    try:
        assert reader.next_id("photos") == 21
    finally:
        reader.close()


# --------------------------------------------------------------------------------------------
# 7. A SQLite file replaced by an older copy under a running server
# --------------------------------------------------------------------------------------------


def test_a_sqlite_file_replaced_by_its_backup_under_a_running_server(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tickets.db'}"
    server = TicketServer(url)
    errors: list[str] = []
    try:
        ids = draw(server, 30)
        backup = snapshot(url, tmp_path / "backup.db")
        ids += draw(server, 30)
        put_back(url, backup)
        assert last_id(url) == 30

        after = draw_through(server, 40, errors)
        assert_distinct(ids + after)
        assert min(after) > max(ids)
        assert server.stats()["rewinds"] >= 1
    finally:
        server.close()


def test_a_sqlite_file_replaced_under_a_running_server_is_healed_without_caller_errors(
    tmp_path: Path,
) -> None:
    """CONTRACT §9: where the server knows a floor, it heals and "callers see nothing". Its
    kept connections still point at the replaced file; a caller must not get their error."""
    url = f"sqlite:///{tmp_path / 'tickets.db'}"
    server = TicketServer(url)
    try:
        ids = draw(server, 30)
        backup = snapshot(url, tmp_path / "backup.db")
        ids += draw(server, 30)
        put_back(url, backup)
        ids += draw(server, 40)  # no retry here: an error fails the test
        assert_distinct(ids)
        assert server.stats()["rewinds"] == 1
    finally:
        server.close()


@pytest.mark.backend(*SERVERS)
def test_one_server_of_a_pair_restored_twice_from_one_backup_repeats_no_id(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """Found by the fault campaign: two processes (two datacenters) over one pair; server a is
    restored, healed by the first process, which takes ids above the heal's target; restored
    again from the same backup and healed by the second process from the same floor (b's last
    id). The second heal must land above what the first process took since."""
    a, b = make_database(backend), make_database(backend)
    first, second = TicketServers([a, b]), TicketServers([a, b])
    try:
        for pair in (first, second):
            pair.servers[0].next_block("photos", 10)
            pair.servers[1].next_block("photos", 10)
        backup = snapshot(a, tmp_path / "a")
        first.servers[0].next_block("photos", 100)
        put_back(a, backup)
        taken_first = list(first.servers[0].next_block("photos", 1000))
        put_back(a, backup)
        taken_second = list(second.servers[0].next_block("photos", 1000))
        assert_distinct(taken_first + taken_second)
    finally:
        first.close()
        second.close()


@pytest.mark.backend(*SERVERS)
def test_a_table_largest_key_from_the_server_ahead_does_not_move_the_other(
    backend: str, make_database: Callable[[str], str], caplog: pytest.LogCaptureFixture
) -> None:
    """The servers of a pair drift apart in normal use: a new process's first flush finds the
    table's largest key among the ids of the server ahead. That is no rewind of the other
    server: no WARNING, no margin spent."""
    a, b = make_database(backend), make_database(backend)
    pair = TicketServers([a, b])
    try:
        pair.servers[0].next_block("photos", 5)
        ahead = pair.servers[1].next_block("photos", 500)
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            assert not pair.ensure_above("photos", ahead[-1])
        assert "went back in time" not in caplog.text
        assert pair.servers[0].next_block("photos", 1).start < ahead[-1]
        assert pair.stats()["rewinds"] == 0
    finally:
        pair.close()


# --------------------------------------------------------------------------------------------
# The third topology: CachedSource(DatacenterTier(dc, upstream=...))
# --------------------------------------------------------------------------------------------


def _tiered(dc: str, upstream: Any) -> tuple[CachedSource, DatacenterTier]:
    tier = DatacenterTier(dc, upstream, min_block=50, supply=1.0, timeout=5.0)
    # Small blocks: the cache holds at most ~75 ids (by default it may hold as many as it
    # issued), so every few dozen ids a take reaches the tier, and its checks, after a restore.
    return CachedSource(tier, min_block=10, max_block=50), tier


def _close(cache: CachedSource, tier: DatacenterTier) -> None:
    cache.close()
    tier.close()


@pytest.mark.backend(*SERVERS)
def test_a_tier_over_a_restored_global_server_repeats_no_id(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """The global server restored under a running tier process, then a fresh one: the tier's
    marks (the highest id it stored from upstream) refuse the offered blocks and move upstream
    above them; the fresh process tells upstream its marks before its first refill."""
    glob, dc = make_database(backend), make_database(backend)
    cache, tier = _tiered(dc, TicketServer(glob))
    ids: list[int] = []
    try:
        ids += draw(cache, 300)
        backup = snapshot(glob, tmp_path / "global")
        ids += draw(cache, 300)
        # Between the tier's refills: a restore racing them fails (MariaDB: the server records
        # its stamp between the dump's DROP TABLE and CREATE TABLE), as restoring any live
        # database would.
        assert cache.wait_idle(10) and tier.wait_idle(10)
        put_back(glob, backup)
        ids += draw(cache, 600)
    finally:
        _close(cache, tier)
    put_back(glob, backup)  # and again, for a process that knows nothing of it
    cache, tier = _tiered(dc, TicketServer(glob))
    try:
        ids += draw(cache, 600)
    finally:
        _close(cache, tier)
    assert_distinct(ids)


@pytest.mark.backend(*SERVERS)
def test_the_tier_database_restored_discards_its_stock_once(
    backend: str,
    make_database: Callable[[str], str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The datacenter's own database restored (its stock back as it was, ranges already handed
    out in it) while a process runs, and before a fresh one starts: the first to see the new
    identity discards the stock and refills from upstream; nothing is issued twice."""
    glob, dc = make_database(backend), make_database(backend)
    upstream = TicketServer(glob)
    cache, tier = _tiered(dc, upstream)
    ids: list[int] = []
    try:
        ids += draw(cache, 200)
        created_by = time.time()
        assert tier.wait_idle(10)
        backup = snapshot(dc, tmp_path / "dc")
        ids += draw(cache, 400)
        # Restored while the process runs, between its takes (a restore racing the tier's
        # own writes fails on its locks or keys, as restoring any live database would).
        assert cache.wait_idle(10) and tier.wait_idle(10)
        # MariaDB's CREATE_TIME, which every take of the tier checks, counts whole seconds: a
        # table re-created within the second the original was created looks the same until the
        # full identity (InnoDB's table id) is read, at identity_interval. No restore comes
        # that soon after the tables were made; this one must not either.
        while int(time.time()) <= int(created_by):
            time.sleep(0.05)
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            put_back(dc, backup)
            ids += draw(cache, 600)
        assert caplog.text.count("discarded its stock") == 1
    finally:
        _close(cache, tier)
    put_back(dc, backup)  # and again, before a fresh process starts
    cache, tier = _tiered(dc, upstream)
    try:
        ids += draw(cache, 600)
        assert tier.stats()["rewinds"] >= 1
    finally:
        _close(cache, tier)
        upstream.close()
    assert_distinct(ids)


@pytest.mark.backend("postgresql")
def test_the_tier_database_failed_over_to_a_replica_that_missed_writes(
    backend: str,
    make_database: Callable[[str], str],
    replica_pair: PgPair,
) -> None:
    """The tier's database is a primary with an asynchronous replica; the replica misses the
    last takes, the primary crashes, the replica is promoted and the tier follows through a
    proxy: the replica's stock still holds ranges already handed out — discarded, refilled."""
    glob = make_database(backend)
    primary_url, replica_url = replica_pair.database_urls("rw")
    upstream = TicketServer(glob)
    with FollowingProxy.for_url(primary_url) as proxy:
        dc = proxy.url(primary_url)
        cache, tier = _tiered(dc, upstream)
        ids: list[int] = []
        errors: list[str] = []
        try:
            ids += draw(cache, 300)
            assert tier.wait_idle(10)
            replica_pair.wait_caught_up()
            replica_pair.cut_replication()
            ids += draw(cache, 300)  # taken from stock the replica never sees taken
            replica_pair.crash_primary()
            replica_pair.promote()
            proxy.follow(replica_url)
            ids += draw_through(cache, 600, errors)
            assert tier.stats()["rewinds"] >= 1
        finally:
            _close(cache, tier)
            upstream.close()
    assert_distinct(ids)


@pytest.mark.backend("mysql")
def test_mariadb_without_the_process_privilege_guards_by_creation_time(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """A ticket user with rights on its database only cannot read InnoDB's table ids: the take
    is guarded by the table's creation time instead, and a running process still notices a
    restore (made in a later second than the table: the creation time counts seconds)."""
    url = make_database(backend)
    u = make_url(url)
    user = f"t{os.getpid()}"
    admin = sa.create_engine(url)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"CREATE USER '{user}'@'%%' IDENTIFIED BY 'pw'")
            conn.exec_driver_sql(f"GRANT ALL ON `{u.database}`.* TO '{user}'@'%%'")
        limited = u.set(username=user, password="pw").render_as_string(hide_password=False)
        server = TicketServer(limited)
        try:
            ids = draw(server, 20)
            created = int(time.time())
            while int(time.time()) == created:  # the restore's CREATE in a later second
                time.sleep(0.05)
            backup = snapshot(url, tmp_path / "backup")
            ids += draw(server, 20)
            put_back(url, backup)
            ids += draw(server, 20)
            assert server.stats()["rewinds"] == 1
            assert_distinct(ids)
            # Its takes are guarded by the creation time (a datetime), not a table id.
            identity = server._known["photos", 64].identity
            assert identity is not None and not isinstance(identity.guard[1], int)
            assert server.backend.guarded_take(identity)[0] == "take_guarded_created"
        finally:
            server.close()
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f"DROP USER '{user}'@'%%'")
        admin.dispose()
