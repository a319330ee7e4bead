"""A project made by a plain ``alembic init``, run by the real ``alembic`` command: with the
package installed, autogenerate proposes its ticket tables, writes the imports its column types
need, and proposes the cut-over of an auto-increment key to ``TicketId``.

The project's files stay as ``alembic init`` wrote them except for the two lines every Alembic
user edits: ``sqlalchemy.url`` in ``alembic.ini`` and ``target_metadata`` in ``env.py``. Alembic
older than 1.18 has no plugins; there ``env.py`` also gets the documented
``import sqlalchemy_tickets.alembic``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import DatacenterTier, TicketId, TicketServer, configure
from sqlalchemy_tickets.sources.lease import create_lease_table
from support import forked

#: Alembic >= 1.18 loads the package's plugin by itself.
PLUGINS = importlib.util.find_spec("alembic.runtime.plugins") is not None

#: What ``alembic init`` writes, and what a user puts there instead.
INI_URL = "sqlalchemy.url = driver://user:pass@localhost/dbname"
ENV_METADATA = "target_metadata = None"
MANUAL_SET_UP = "import sqlalchemy_tickets.alembic  # Alembic < 1.18: no plugins\n"

MODELS_HEAD = '''
import os

import sqlalchemy as sa
from sqlalchemy_tickets import UUID7, PrefixedId, SnowflakeId, TicketId, configure

APP = os.environ["APP_URL"]
target_metadata = sa.MetaData()
'''

#: On a SQLite file the embedded default keeps its tickets in a sibling file that it makes
#: itself, so nothing there is for a migration to create: draw from the application's own file.
DRAW_FROM_THE_APP = '''
if APP.startswith("sqlite"):
    configure(APP)
'''


def _alembic_command(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The ``alembic`` console script (else ``python -m alembic``) in a process of its own."""
    if Path(sys.executable).with_name("alembic").exists():
        return forked.run_script("alembic", *args, cwd=cwd, env=env)
    return forked.run_module("alembic", *args, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def initialized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``alembic init migrations`` writes, once for the module (each test copies it)."""
    where = tmp_path_factory.mktemp("alembic_init")
    result = _alembic_command("init", "migrations", cwd=where)
    assert result.returncode == 0, result.stdout + result.stderr
    return where


@pytest.fixture
def project(initialized: Path, tmp_path: Path) -> Callable[[str], Path]:
    """``project(url) -> directory``: a copy of the ``alembic init`` project, with the two
    lines a user edits: the database URL, and ``target_metadata`` taken from ``models.py``
    (written by each test; ``alembic.ini``'s ``prepend_sys_path = .`` makes it importable)."""

    def make(url: str) -> Path:
        where = tmp_path / "project"
        shutil.copytree(initialized, where)
        ini = where / "alembic.ini"
        text = ini.read_text()
        assert INI_URL in text
        # configparser interpolates "%": a URL's escapes must be doubled.
        ini.write_text(text.replace(INI_URL, "sqlalchemy.url = " + url.replace("%", "%%")))
        env = where / "migrations" / "env.py"
        text = env.read_text()
        assert ENV_METADATA in text and "sqlalchemy_tickets" not in text
        # The only edit to env.py (plus, on Alembic < 1.18, the documented manual set-up).
        edit = "from models import target_metadata\n"
        env.write_text(text.replace(ENV_METADATA, edit if PLUGINS else MANUAL_SET_UP + edit))
        assert "sqlalchemy_tickets" not in (where / "migrations" / "script.py.mako").read_text()
        return where

    return make


def alembic(where: Path, *args: str, app: str) -> str:
    """The real ``alembic`` command in the project's directory; fails the test on an error.
    Returns what it printed, its log (stderr, as ``alembic init`` configures it) included."""
    result = _alembic_command(*args, cwd=where, env={**os.environ, "APP_URL": app})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def autogenerate(where: Path, message: str, *, app: str, log: list[str] | None = None) -> str:
    """``alembic revision --autogenerate``; the text of the script it wrote (``log``: gets
    what the command printed and logged)."""
    before = set((where / "migrations" / "versions").glob("*.py"))
    output = alembic(where, "revision", "--autogenerate", "-m", message, app=app)
    if log is not None:
        log.append(output)
    (script,) = set((where / "migrations" / "versions").glob("*.py")) - before
    return script.read_text()


def upgrade_ops(script: str) -> list[str]:
    """The ``op.`` calls of a script's ``upgrade()``, in order (first line of each)."""
    body = script.split("def upgrade()")[1].split("def downgrade()")[0]
    return [line.strip() for line in body.splitlines() if line.strip().startswith("op.")]


def imported(script: str) -> set[str]:
    return set(re.findall(r"^import ([\w.]+)", script, re.M))


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return {name.lower() for name in sa.inspect(conn).get_table_names()}
    finally:
        engine.dispose()


def next_id(url: str, sequence: str, *, bits: int = 64) -> int:
    """The next id of a ticket table that the migrations made (never one made here)."""
    server = TicketServer(url, create_missing=False)
    try:
        return server.next_id(sequence, bits=bits)
    finally:
        server.close()


@pytest.mark.backend("sqlite", "postgresql", "mysql")
def test_plain_project_autogenerates_and_upgrades(
    backend: str, make_database: Callable[[str], str], project: Callable[[str], Path]
) -> None:
    url = make_database(backend)
    where = project(url)
    (where / "models.py").write_text(MODELS_HEAD + DRAW_FROM_THE_APP + '''
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos"), primary_key=True),
         sa.Column("title", sa.String(200)))
sa.Table("posts", target_metadata, sa.Column("id", PrefixedId("post"), primary_key=True),
         sa.Column("token", UUID7()), sa.Column("event", SnowflakeId()))
''')
    script = autogenerate(where, "models", app=url)

    assert "op.create_ticket_table('photos')" in upgrade_ops(script)
    assert "op.drop_ticket_table('photos')" in script
    for rendered in ("TicketId('photos')", "PrefixedId('post')", "UUID7()", "SnowflakeId()"):
        assert f"sqlalchemy_tickets.{rendered}" in script
    # What the script uses, it imports: the types' module, and the operations' registration.
    assert {"sqlalchemy_tickets", "sqlalchemy_tickets.alembic"} <= imported(script)

    alembic(where, "upgrade", "head", app=url)
    assert {"photos", "posts", "tickets__photos"} <= table_names(url)
    assert next_id(url, "photos") == 1


@pytest.mark.backend("sqlite")
def test_a_script_without_ticket_operations_imports_the_types_it_writes(
    make_database: Callable[[str], str], project: Callable[[str], Path]
) -> None:
    """No operation of the package, so no ``import sqlalchemy_tickets.alembic`` to lean on:
    the columns alone bring ``import sqlalchemy_tickets`` (else: a NameError at upgrade)."""
    url, tickets = make_database("sqlite"), make_database("sqlite")
    where = project(url)
    (where / "models.py").write_text(MODELS_HEAD + f'''
configure({tickets!r})   # a dedicated ticket server: its tables are not this migration's
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos"), primary_key=True))
sa.Table("posts", target_metadata, sa.Column("id", PrefixedId("post"), primary_key=True),
         sa.Column("token", UUID7()), sa.Column("event", SnowflakeId()))
''')
    script = autogenerate(where, "models", app=url)
    assert not any("ticket" in op for op in upgrade_ops(script))
    assert "sqlalchemy_tickets.TicketId('photos')" in script
    assert "sqlalchemy_tickets.alembic" not in script
    assert "sqlalchemy_tickets" in imported(script)

    alembic(where, "upgrade", "head", app=url)
    assert {"photos", "posts"} <= table_names(url)
    assert "tickets__photos" not in table_names(url) | table_names(tickets)


@pytest.mark.backend("sqlite", "postgresql", "mysql")
def test_cut_over_from_auto_increment_moves_the_sequence_above_the_rows(
    backend: str, make_database: Callable[[str], str], project: Callable[[str], Path]
) -> None:
    url = make_database(backend)
    where = project(url)

    _legacy_photos(url)

    # The model switched to TicketId. SQLite cannot change a column's type without batch mode,
    # which a plain env.py does not use: there the 32-bit ids keep the INTEGER column as it is.
    bits = 32 if backend == "sqlite" else 64
    (where / "models.py").write_text(MODELS_HEAD + DRAW_FROM_THE_APP + f'''
sa.Table("photos", target_metadata,
         sa.Column("id", TicketId("Photos", bits={bits}), primary_key=True),
         sa.Column("title", sa.String(200)))
''')
    script = autogenerate(where, "tickets", app=url)
    width = "" if bits == 64 else ", bits=32"
    ops = upgrade_ops(script)
    create = f"op.create_ticket_table('photos'{width})"
    sync = f"op.sync_ticket_sequence('photos', 'photos', 'id'{width})"
    assert create in ops and sync in ops
    assert ops.index(create) < ops.index(sync)
    assert "sync_ticket_sequence" not in script.split("def downgrade()")[1]  # irreversible
    assert "sqlalchemy_tickets.alembic" in imported(script)

    alembic(where, "upgrade", "head", app=url)
    assert next_id(url, "photos", bits=bits) > 500
    # Proposed with the ticket table only: the next autogenerate has nothing to do.
    assert upgrade_ops(autogenerate(where, "nothing", app=url)) == []


def library_tables(url: str) -> set[str]:
    """Every table of the library (each name it makes starts with "tickets")."""
    return {name for name in table_names(url) if name.startswith("tickets")}


def run_tier(url: str, prefix: str, upstream_url: str) -> None:
    """A datacenter tier that made its tables in ``url`` on first use and issued ids (so that
    it recorded its identity and its upstream mark in the stamp table)."""
    upstream = TicketServer(upstream_url)
    tier = DatacenterTier(url, upstream, table_prefix=prefix, min_block=10, timeout=10.0)
    try:
        assert len(tier.next_block("photos", 3)) == 3
    finally:
        tier.close()
        upstream.close()


PHOTOS = '''
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos"), primary_key=True),
         sa.Column("title", sa.String(200)))
'''


@pytest.mark.backend("sqlite", "postgresql", "mysql")
def test_a_second_autogenerate_compares_none_of_the_librarys_tables(
    backend: str, make_database: Callable[[str], str], project: Callable[[str], Path]
) -> None:
    """After the application ran — its stamp table, tiers made on first use (the default
    prefix and another), the worker-lease table — autogenerate proposes nothing and logs
    nothing of them: Alembic never compared them."""
    url = make_database(backend)
    where = project(url)
    (where / "models.py").write_text(MODELS_HEAD + DRAW_FROM_THE_APP + PHOTOS)
    autogenerate(where, "models", app=url)
    alembic(where, "upgrade", "head", app=url)
    assert next_id(url, "photos") == 1
    upstream = make_database("sqlite")
    run_tier(url, "tickets_dc", upstream)
    run_tier(url, "tickets_eu", upstream)
    create_lease_table(url)
    assert library_tables(url) == {
        "tickets__photos", "tickets_stamps", "tickets_dc__stock", "tickets_dc__state",
        "tickets_eu__stock", "tickets_eu__state", "tickets_worker_leases",
    }

    log: list[str] = []
    assert upgrade_ops(autogenerate(where, "nothing", app=url, log=log)) == []
    assert "Detected" not in log[0], log[0]
    # Once more, on the database that revision brought up to date: still nothing.
    alembic(where, "upgrade", "head", app=url)
    assert upgrade_ops(autogenerate(where, "still nothing", app=url, log=log)) == []
    assert "Detected" not in log[1], log[1]


@pytest.mark.backend("sqlite", "postgresql", "mysql")
def test_downgrade_base_after_the_application_ran_leaves_nothing_behind(
    backend: str, make_database: Callable[[str], str], project: Callable[[str], Path]
) -> None:
    url = make_database(backend)
    where = project(url)
    (where / "models.py").write_text(MODELS_HEAD + DRAW_FROM_THE_APP + PHOTOS + '''
sa.Table("tags", target_metadata, sa.Column("id", TicketId("tags", bits=32), primary_key=True))
''')
    autogenerate(where, "models", app=url)
    alembic(where, "upgrade", "head", app=url)
    # The application ran: its identities recorded at first contact.
    assert next_id(url, "photos") == 1
    assert next_id(url, "tags", bits=32) == 1
    assert library_tables(url) == {"tickets__photos", "tickets__tags", "tickets_stamps"}

    alembic(where, "downgrade", "base", app=url)
    assert library_tables(url) == set()
    assert table_names(url) == {"alembic_version"}


def _legacy_photos(url: str) -> None:
    """The application as it was, before it had migrations: an auto-increment key (SERIAL,
    AUTO_INCREMENT, SQLite's rowid) and rows in it, up to id 500."""
    before = sa.MetaData()
    photos = sa.Table("photos", before, sa.Column("id", sa.Integer, primary_key=True),
                      sa.Column("title", sa.String(200)))
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        before.create_all(engine)
        with engine.begin() as conn:
            conn.execute(sa.insert(photos), [{"title": "a"}, {"title": "b"}])
            conn.execute(sa.insert(photos), [{"id": 500, "title": "imported"}])
    finally:
        engine.dispose()


#: The model switched to TicketId, on the embedded default (nothing configured). SQLite cannot
#: change a column's type without batch mode: the 32-bit ids keep the INTEGER column as it is.
EMBEDDED_PHOTOS = '''
sa.Table("photos", target_metadata,
         sa.Column("id", TicketId("Photos", bits=32), primary_key=True),
         sa.Column("title", sa.String(200)))
'''


def first_flush(url: str, caplog: pytest.LogCaptureFixture) -> list[int]:
    """The application's first inserts after the cut-over, on the embedded default, with
    nothing the library logged at WARNING."""
    configure(None)
    photos = sa.Table("photos", sa.MetaData(),
                      sa.Column("id", TicketId("Photos", bits=32), primary_key=True),
                      sa.Column("title", sa.String(200)))
    engine = sa.create_engine(url)
    try:
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            with engine.begin() as conn:
                conn.execute(photos.insert(), [{"title": f"new {n}"} for n in range(3)])
            with engine.connect() as conn:
                ids = sorted(conn.scalars(sa.select(photos.c.id).where(photos.c.id > 500)))
    finally:
        engine.dispose()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    return ids


@pytest.mark.backend("sqlite")
def test_cut_over_of_a_sqlite_file_on_the_embedded_default_issues_right_above_the_rows(
    make_database: Callable[[str], str], project: Callable[[str], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On a SQLite file the embedded default keeps its tickets in the ``-tickets`` sibling:
    autogenerate proposes the sync there, and the first flush after the migration issues the
    ids right above the table's largest (no jump of a margin, no WARNING)."""
    url = make_database("sqlite")
    where = project(url)
    _legacy_photos(url)
    (where / "models.py").write_text(MODELS_HEAD + EMBEDDED_PHOTOS)
    script = autogenerate(where, "tickets", app=url)
    sync = "op.sync_ticket_sequence('photos', 'photos', 'id', bits=32, embedded=True)"
    assert upgrade_ops(script) == [sync]  # no ticket table: the embedded default's file has it
    assert "sync_ticket_sequence" not in script.split("def downgrade()")[1]  # irreversible

    alembic(where, "upgrade", "head", app=url)
    assert "tickets__photos" not in table_names(url)  # in the sibling, where it is used
    assert first_flush(url, caplog) == [501, 502, 503]
    # Made where the embedded default keeps it: the next autogenerate has nothing to do.
    assert upgrade_ops(autogenerate(where, "nothing", app=url)) == []


@pytest.mark.backend("sqlite")
def test_cut_over_of_a_sqlite_file_on_the_embedded_default_offline(
    make_database: Callable[[str], str], project: Callable[[str], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The same migration as a ``--sql`` script, run by hand on another copy of the
    application's file: the script finds that file's sibling itself (ATTACH ...
    pragma_database_list), whatever path it runs with."""
    url = make_database("sqlite")
    where = project(url)
    _legacy_photos(url)
    (where / "models.py").write_text(MODELS_HEAD + EMBEDDED_PHOTOS)
    autogenerate(where, "tickets", app=url)
    script = alembic(where, "upgrade", "head", "--sql", app=url)
    assert "ATTACH DATABASE (SELECT CASE WHEN file = '' THEN ':memory:' ELSE file || " in script
    sql = script.split("INFO  [alembic")[0]  # the log follows the script on the output
    production = make_database("sqlite")
    _legacy_photos(production)
    path = sa.engine.make_url(production).database
    assert path is not None
    with closing(sqlite3.connect(path)) as db:
        db.executescript(sql)
    assert first_flush(production, caplog) == [501, 502, 503]
