"""Operating ticket servers through the real console script: status, sync, restride, cut-over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import (
    PrefixedId,
    TicketsError,
    TicketServer,
    TicketServers,
    TicketServerUnavailable,
)
from sqlalchemy_tickets._naming import max_id
from support.cli import run
from support.processes import WORKERS

EXAMPLES = Path(__file__).resolve().parents[2] / "migrations_examples"


class Base(DeclarativeBase):
    pass


class Post(Base):
    __tablename__ = "posts"
    id: Mapped[str] = mapped_column(PrefixedId("post"), primary_key=True)


def test_status_lists_every_sequence_on_every_server(make_database, backend: str) -> None:
    a, b = make_database(backend), make_database(backend)
    assert run("init", "--url", a, "photos", "accounts", "--increment", "2").returncode == 0
    assert run("init", "--url", b, "photos", "--increment", "2", "--offset", "2").returncode == 0
    assert run("next", "--url", a, "photos", "--count", "5").returncode == 0
    human = run("status", "--url", a, "--url", b)
    assert human.returncode == 0, human.stderr
    assert "photos" in human.stdout and "accounts" in human.stdout
    result = run("status", "--url", a, "--url", b, "--json", "--sample", "0.2")
    rows = json.loads(result.stdout)
    by_key = {(r["table"], r["offset"]): r for r in rows}
    assert by_key["tickets__photos", 1]["last_id"] == 9
    assert by_key["tickets__photos", 2]["increment"] == 2
    assert by_key["tickets__accounts", 1]["rate"] == 0.0
    assert len(rows) == 3


def test_status_warns_at_eighty_percent_and_exits_3(make_database) -> None:
    url = make_database("postgresql")
    TicketServer(url).create(None, bits=32, start=int(max_id(32) * 0.85))
    result = run("status", "--url", url)
    assert result.returncode == 3
    assert "85% of the 32-bit id space is used" in result.stderr


def test_status_reads_urls_from_the_environment_and_a_config_file(
    make_database, tmp_path: Path
) -> None:
    url = make_database("mysql")
    run("init", "--url", url, "photos")
    env = {**os.environ, "TICKETS_URL": url}
    script = run.__globals__["SCRIPT"]
    by_env = subprocess.run([script, "status", "--json"], capture_output=True, text=True,
                            env=env, check=False)
    assert by_env.returncode == 0 and json.loads(by_env.stdout)[0]["sequence"] == "photos"
    (tmp_path / "sqlalchemy-tickets.ini").write_text(f"[tickets]\nurls = {url}\n")
    by_file = run("status", "--json", cwd=tmp_path)
    assert by_file.returncode == 0 and json.loads(by_file.stdout)[0]["sequence"] == "photos"
    missing = subprocess.run([script, "status"], capture_output=True, text=True, check=False,
                             cwd=tmp_path.parent, env={k: v for k, v in os.environ.items()
                                                       if k != "TICKETS_URL"})
    assert missing.returncode == 2 and "no ticket server" in missing.stderr


def test_sync_moves_a_sequence_above_a_tables_max(make_database, backend: str) -> None:
    app, tickets = make_database(backend), make_database(backend)
    engine = sa.create_engine(app)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE photos (id INTEGER PRIMARY KEY, title VARCHAR(20))")
        conn.exec_driver_sql("INSERT INTO photos (id, title) VALUES (1, 'a'), (41, 'b')")
    engine.dispose()
    run("init", "--url", tickets, "photos", "--increment", "2", "--offset", "2")
    result = run("sync", "--url", tickets, "--from", app, "--table", "photos", "--column", "id",
                 "photos")
    assert result.returncode == 0, result.stderr
    ids = run("next", "--url", tickets, "photos", "--count", "2").stdout.split()
    assert ids == ["42", "44"]  # above 41, and still even
    # Never down: syncing again with a smaller max leaves the sequence where it is.
    assert run("sync", "--url", tickets, "--from", app, "--table", "photos",
               "photos").returncode == 0
    assert run("next", "--url", tickets, "photos").stdout.split() == ["46"]


def test_sync_errors_change_nothing(make_database) -> None:
    tickets = make_database("postgresql")
    run("init", "--url", tickets, "photos")
    bad_table = run("sync", "--url", tickets, "--from", tickets, "--table", "no_such_table",
                    "photos")
    assert bad_table.returncode == 1 and "no_such_table" in bad_table.stderr
    injected = run("sync", "--url", tickets, "--from", tickets, "--table", "x; drop table y",
                   "photos")
    assert injected.returncode == 2 and "invalid table name" in injected.stderr  # a bad argument
    down = run("sync", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/x", "--from",
               tickets, "--table", "tickets__photos", "photos")
    assert down.returncode == 1 and "Traceback" not in down.stderr
    assert run("next", "--url", tickets, "photos").stdout.split() == ["1"]


def _draw_until(urls: list[str], stop_file: str, out_file: str) -> None:
    """A client process: draw ids through TicketServers until told to stop."""
    servers = TicketServers(urls, timeout=2.0, backoff=0.05, max_backoff=0.2)
    ids: list[int] = []
    while not os.path.exists(stop_file):
        try:
            ids.extend(servers.next_block("photos", 3))
        except TicketServerUnavailable:
            continue  # every server paused at once, for a moment: ask again
    Path(out_file).write_text(json.dumps(ids))


@pytest.mark.backend("postgresql", "mysql")
def test_restride_under_concurrent_allocation_never_duplicates(
    make_database, tmp_path: Path, backend: str
) -> None:
    a, b, c = (make_database(backend) for _ in range(3))
    run("init", "--url", a, "photos", "--increment", "2", "--offset", "1")
    run("init", "--url", b, "photos", "--increment", "2", "--offset", "2")
    stop = str(tmp_path / "stop")
    ctx = WORKERS
    old = [ctx.Process(target=_draw_until, args=([a, b], stop, str(tmp_path / f"old{i}.json")))
           for i in range(3)]
    for p in old:
        p.start()
    deadline = time.monotonic() + 60
    while TicketServer(a).describe("photos").last_id < 300:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "clients drew nothing"
        time.sleep(0.05)
    result = run("restride", "--url", a, "--url", b, "--url", c)
    assert result.returncode == 0, result.stderr
    new = ctx.Process(target=_draw_until, args=([a, b, c], stop, str(tmp_path / "new.json")))
    new.start()
    while (TicketServer(c).describe("photos").last_id or 0) < 2_000:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the new server issued nothing"
        time.sleep(0.05)
    Path(stop).touch()
    for p in (*old, new):
        p.join(60)
        assert p.exitcode == 0
    drawn = [json.loads((tmp_path / f"old{i}.json").read_text()) for i in range(3)]
    drawn.append(json.loads((tmp_path / "new.json").read_text()))
    every = [i for chunk in drawn for i in chunk]
    assert len(every) > 1_000
    assert len(set(every)) == len(every), "restride issued an id twice"
    assert any(i % 3 == 0 for i in every)  # the third server took part
    status = json.loads(run("status", "--url", a, "--url", b, "--url", c, "--json").stdout)
    assert sorted((r["increment"], r["offset"]) for r in status) == [(3, 1), (3, 2), (3, 3)]


def test_restride_refuses_unknown_sequences_and_changes_nothing(make_database) -> None:
    a = make_database("mysql")
    run("init", "--url", a, "photos")
    result = run("restride", "--url", a, "ghost")
    assert result.returncode == 1 and "ghost" in result.stderr
    assert TicketServer(a).describe("photos").increment == 1  # type: ignore[union-attr]


def test_cut_over_example_upgrade_downgrade_upgrade(make_database) -> None:
    url = make_database("postgresql")
    alembic = [sys.executable, "-m", "alembic", "-c",
               str(EXAMPLES / "postgresql-cutover" / "alembic.ini"), "-x", f"url={url}"]
    for step in (["upgrade", "head"], ["downgrade", "base"], ["upgrade", "head"]):
        done = subprocess.run([*alembic, *step], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
    server = TicketServer(url, create_missing=False)
    assert server.next_id("photos") == 101  # above the 100 legacy rows
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        with pytest.raises(sa.exc.IntegrityError):  # no identity left to generate an id
            conn.exec_driver_sql("INSERT INTO photos (title) VALUES ('no id')")
    engine.dispose()
    server.close()


def test_init_creates_the_worker_lease_table(make_database) -> None:
    url = make_database("postgresql")
    result = run("init", "--url", url, "--worker-leases")
    assert result.returncode == 0, result.stderr
    names = set(sa.inspect(sa.create_engine(url)).get_table_names())
    assert "tickets_worker_leases" in names
    assert "Tickets64" not in names  # --worker-leases alone creates only that table


def test_worker_lease_table_alembic_op_and_its_reverse(make_database, backend: str) -> None:
    from alembic.migration import MigrationContext
    from alembic.operations import Operations

    import sqlalchemy_tickets.alembic as tickets_alembic

    url = make_database(backend)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.create_worker_lease_table()  # type: ignore[attr-defined]
    assert sa.inspect(engine).has_table("tickets_worker_leases")
    with engine.begin() as conn:
        op = Operations(MigrationContext.configure(conn))
        op.invoke(tickets_alembic.CreateWorkerLeaseTableOp().reverse())
    assert not sa.inspect(engine).has_table("tickets_worker_leases")
    engine.dispose()


def test_a_foreign_prefix_is_refused_at_flush_as_a_value_error(make_database) -> None:
    engine = sa.create_engine(make_database("postgresql"))
    Base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add(Post())
        session.add(Post(id="user_01jd0000000000000000000000"))
        with pytest.raises(TicketsError) as caught:
            session.flush()
        assert isinstance(caught.value, ValueError)
        session.rollback()
    with engine.connect() as conn:
        assert conn.scalar(sa.select(sa.func.count()).select_from(Post)) == 0
    engine.dispose()
