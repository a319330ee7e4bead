"""Alembic support on real databases: the example projects online, the operations' semantics,
autogenerate, and bad input refused with nothing written."""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata, produce_migrations, render_python_code
from alembic.config import main as alembic_main
from alembic.migration import MigrationContext
from alembic.operations import Operations, ops

from sqlalchemy_tickets import (
    DatacenterTier,
    StrideMismatchError,
    TicketId,
    TicketServer,
    TicketServers,
)
from sqlalchemy_tickets.alembic import (
    CreateTicketTableOp,
    CreateTicketTablesOp,
    DropTicketTableOp,
    DropTicketTablesOp,
    include_object,
)
from sqlalchemy_tickets.errors import TicketsError
from sqlalchemy_tickets.sources.datacenter import describe_datacenter
from support import forked
from support.alembic_tier import run_alembic, tier_project
from support.tables import drop_ticket_tables_one_by_one, run_script

EXAMPLES = Path(__file__).resolve().parents[2] / "migrations_examples"
BACKENDS = ["sqlite", "postgresql", "mysql"]


# -- helpers ---------------------------------------------------------------------------------


def alembic(example: str | Path, *args: str, **x: Any) -> None:
    """``alembic -c <example>/alembic.ini -x k=v ... <args>``, in process, raising on errors."""
    ini = (
        Path(example) / "alembic.ini"
        if isinstance(example, Path)
        else EXAMPLES / example / "alembic.ini"
    )
    argv = ["-c", str(ini), "--raiseerr"]
    for key, value in x.items():
        argv += ["-x", f"{key}={value}"]
    alembic_main(argv=argv + list(args))


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


#: Seconds a round trip of :func:`draw` may take: a fresh server's first contact (identities
#: read and recorded) on a loaded machine can outlast the default 2 s; nothing here tests
#: timeouts.
DRAW_TIMEOUT = 30.0


def draw(url: str, sequence: str | None, count: int, *, bits: int = 64) -> range:
    """A block from the database's ticket table, which must already exist."""
    server = TicketServer(url, create_missing=False, timeout=DRAW_TIMEOUT)
    try:
        return server.next_block(sequence, count, bits=bits)
    finally:
        server.close()


@contextmanager
def operations(url: str) -> Iterator[Operations]:
    """An ``op`` on a connection to ``url``, committed at the end (as a migration would be)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            yield Operations(MigrationContext.configure(conn))
    finally:
        engine.dispose()


@pytest.fixture
def url(database_url: str) -> Iterator[str]:
    """A fresh, empty database on each backend (``@pytest.mark.backend`` narrows them); its
    ticket tables, hundreds in some tests, are dropped one by one afterwards."""
    yield database_url
    drop_ticket_tables_one_by_one(database_url)


# -- the example projects, online ------------------------------------------------------------


@pytest.mark.backend("sqlite", "postgresql")
def test_app_example_upgrade_downgrade_upgrade(
    backend: str, make_database: Callable[[str], str]
) -> None:
    url = make_database(backend)
    alembic(backend, "upgrade", "head", url=url)
    assert {"photos", "tickets__photos", "alembic_version"} <= table_names(url)
    assert draw(url, "Photos", 3) == range(1, 4)
    assert draw(url, "photos", 2) == range(4, 6)  # one sequence, whatever the case

    alembic(backend, "downgrade", "base", url=url)
    assert table_names(url) & {"photos", "tickets__photos"} == set()

    alembic(backend, "upgrade", "head", url=url)
    assert draw(url, "Photos", 3) == range(1, 4)  # a new table starts again at 1

    # The application table takes the ids: TicketId("Photos") drawing from that database.
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    server = TicketServer(url, create_missing=False)
    photos = sa.Table(
        "photos",
        sa.MetaData(),
        sa.Column("id", TicketId("Photos", source=server), primary_key=True),
        sa.Column("title", sa.String(200)),
    )
    try:
        with engine.begin() as conn:
            conn.execute(photos.insert(), [{"title": "a"}, {"title": "b"}])
        with engine.connect() as conn:
            assert sorted(conn.scalars(sa.select(photos.c.id))) == [4, 5]
    finally:
        server.close()
        engine.dispose()


@pytest.mark.parametrize(("offset", "expected"), [(1, range(1, 7, 2)), (2, range(2, 8, 2))])
def test_postgresql_example_pair_ready(
    offset: int, expected: range, make_database: Callable[[str], str]
) -> None:
    url = make_database("postgresql")
    alembic("postgresql", "upgrade", "head", url=url, increment=2, offset=offset)
    assert draw(url, "Photos", 3) == expected


@pytest.fixture(scope="module")
def flickr_pair(private_mariadb_factory: Callable[..., Any]) -> Iterator[tuple[Any, Any]]:
    """Flickr's two ticket servers: auto_increment_increment=2, offsets 1 and 2 (my.cnf)."""
    servers = [
        private_mariadb_factory(
            extra_args=["--auto-increment-increment=2", f"--auto-increment-offset={offset}"]
        )
        for offset in (1, 2)
    ]
    yield servers[0], servers[1]
    for server in servers:
        server.stop()


def _new_database(server_url: str, name: str) -> str:
    engine = sa.create_engine(server_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
            conn.exec_driver_sql(f"CREATE DATABASE `{name}`")
    finally:
        engine.dispose()
    return f"{server_url.rstrip('/')}/{name}"


TICKET_TABLES = {"Tickets64", "Tickets32", "tickets__photos"}


def test_flickr_pair_example(flickr_pair: tuple[Any, Any]) -> None:
    urls = [_new_database(server.url, "tickets") for server in flickr_pair]
    for offset, url in enumerate(urls, start=1):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=url, offset=offset)
        assert TICKET_TABLES <= table_names(url)

    odd, even = urls
    assert draw(odd, "Photos", 3) == range(1, 7, 2)
    assert draw(even, "Photos", 3) == range(2, 8, 2)
    # Flickr's own tables take the stride from the servers.
    for bits in (64, 32):
        assert draw(odd, None, 1, bits=bits) == range(1, 2)
        assert draw(even, None, 1, bits=bits) == range(2, 3)
        assert draw(odd, None, 3, bits=bits) == range(3, 9, 2)
        assert draw(even, None, 3, bits=bits) == range(4, 10, 2)

    # The pair, as the application sees it: each server checked against its position.
    pair = TicketServers(urls)
    try:
        ids = [pair.next_id("Photos") for _ in range(4)]
    finally:
        pair.close()
    assert len(set(ids)) == 4 and {i % 2 for i in ids} == {0, 1}

    for url in urls:
        alembic("mysql-flickr-two-servers", "downgrade", "base", url=url)
        assert table_names(url) & TICKET_TABLES == set()
    for offset, url in enumerate(urls, start=1):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=url, offset=offset)
    assert draw(odd, "Photos", 2) == range(1, 5, 2)
    assert draw(even, None, 1) == range(2, 3)


def test_flickr_pair_example_refuses_the_wrong_server(flickr_pair: tuple[Any, Any]) -> None:
    url = _new_database(flickr_pair[0].url, "tickets_wrong")  # the odd server ...
    with pytest.raises(StrideMismatchError, match="auto_increment_offset=1"):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=url, offset=2)  # ... as even
    assert table_names(url) & TICKET_TABLES == set()


def _offline_sql(example: str, **x: Any) -> str:
    argv = ["-c", str(EXAMPLES / example / "alembic.ini")]
    for key, value in x.items():
        argv += ["-x", f"{key}={value}"]
    result = forked.run_module("alembic", *argv, "upgrade", "head", "--sql")
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize(
    ("backend", "example", "x"),
    [
        ("sqlite", "sqlite", {}),
        ("postgresql", "sqlite", {}),
        ("mysql", "sqlite", {}),
        ("postgresql", "postgresql", {}),
        ("postgresql", "postgresql", {"increment": 2, "offset": 2}),
        ("sqlite", "postgresql", {"increment": 3, "offset": 1}),
        ("mysql", "postgresql", {"increment": 2, "offset": 2}),
        ("mysql", "mysql-flickr-two-servers", {"increment": 1, "offset": 1}),
    ],
)
def test_offline_scripts_run(
    backend: str, example: str, x: dict[str, int], make_database: Callable[[str], str]
) -> None:
    """The ``--sql`` output of the examples runs as is (``offset`` quoted for MariaDB too)."""
    url = make_database(backend)
    run_script(url, _offline_sql(example, url=url, **x))
    increment, offset = x.get("increment", 1), x.get("offset", 1)
    assert draw(url, "Photos", 3) == range(offset, offset + 3 * increment, increment)
    if example.startswith("mysql"):
        assert draw(url, None, 1) == range(1, 2)
        assert draw(url, None, 1, bits=32) == range(1, 2)


# -- the operations -----------------------------------------------------------------------------


def test_create_reverse_drop_round_trip(url: str) -> None:
    create = CreateTicketTableOp("Photos", bits=32, start=5, increment=2, offset=1)
    with operations(url) as op:
        op.invoke(create)
    assert "tickets__photos" in table_names(url)
    assert draw(url, "Photos", 2, bits=32) == range(5, 9, 2)

    drop = create.reverse()
    assert isinstance(drop, DropTicketTableOp)
    with operations(url) as op:
        op.invoke(drop)
    assert "tickets__photos" not in table_names(url)

    with operations(url) as op:
        op.invoke(drop.reverse())  # the create it came from, stride included
    assert draw(url, "Photos", 2, bits=32) == range(5, 9, 2)

    with operations(url) as op:
        op.drop_ticket_table("Photos", bits=32)  # type: ignore[attr-defined]
        op.create_ticket_table()  # type: ignore[attr-defined]  # Flickr's Tickets64
    names = table_names(url)
    assert "tickets__photos" not in names and "Tickets64" in names
    assert draw(url, None, 1) == range(1, 2)
    with operations(url) as op:
        op.invoke(CreateTicketTableOp().reverse())
    assert "Tickets64" not in table_names(url)


def test_create_is_idempotent(url: str) -> None:
    with operations(url) as op:
        op.create_ticket_table("Photos")  # type: ignore[attr-defined]
    assert draw(url, "Photos", 2) == range(1, 3)
    with operations(url) as op:
        op.create_ticket_table("Photos")  # type: ignore[attr-defined]  # existing table kept
    assert draw(url, "Photos", 1) == range(3, 4)


@pytest.mark.parametrize(
    ("start", "increment", "offset", "first"),
    [
        (1, 1, 1, 1),
        (10, 3, 2, 11),
        (10, 3, 1, 10),
        (11, 3, 2, 11),
        (1, 2, 2, 2),
        (7, 1, 1, 7),
        (1, 10, 10, 10),
        (2**31 - 3, 1, 1, 2**31 - 3),
    ],
)
def test_first_id_is_the_smallest_at_or_after_start_in_the_servers_class(
    url: str, start: int, increment: int, offset: int, first: int
) -> None:
    with operations(url) as op:
        op.create_ticket_table(  # type: ignore[attr-defined]
            "Photos", start=start, increment=increment, offset=offset
        )
        op.create_ticket_table(  # type: ignore[attr-defined]
            "Small", bits=32, start=start, increment=increment, offset=offset
        )
    assert draw(url, "Photos", 3) == range(first, first + 3 * increment, increment)
    assert draw(url, "Small", 1, bits=32) == range(first, first + 1)


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("start", [1, 100])
def test_flickr_table_start(url: str, start: int, bits: int) -> None:
    with operations(url) as op:
        op.create_ticket_table(bits=bits, start=start)  # type: ignore[attr-defined]
    assert draw(url, None, 1, bits=bits) == range(start, start + 1)
    assert draw(url, None, 2, bits=bits) == range(start + 1, start + 3)


def test_flickr_tables_of_both_widths_coexist(url: str) -> None:
    with operations(url) as op:
        op.create_ticket_table()  # type: ignore[attr-defined]
        op.create_ticket_table(bits=32)  # type: ignore[attr-defined]
    assert {"Tickets64", "Tickets32"} <= table_names(url)


# -- bad input: refused with nothing written ------------------------------------------------


@pytest.mark.parametrize(
    ("sequence", "kwargs"),
    [
        ("Photos", {"bits": 16}),
        ("Photos", {"increment": 0}),
        ("Photos", {"increment": 2, "offset": 3}),
        ("Photos", {"start": 0}),
        ("bad-name", {}),
    ],
)
def test_bad_input_writes_nothing(url: str, sequence: str, kwargs: dict[str, int]) -> None:
    before = table_names(url)
    with pytest.raises(TicketsError), operations(url) as op:
        op.create_ticket_table(sequence, **kwargs)  # type: ignore[attr-defined]
    assert table_names(url) == before
    assert not any(name.lower().startswith("tickets") for name in table_names(url))


def test_flickr_stride_the_server_cannot_supply(url: str) -> None:
    """SQLite and PostgreSQL have no server stride; MySQL's shared server runs at 1/1."""
    with pytest.raises(TicketsError), operations(url) as op:
        op.create_ticket_table(increment=2, offset=2)  # type: ignore[attr-defined]
    assert "Tickets64" not in table_names(url)


# -- many tables at once --------------------------------------------------------------------------

MANY = [f"seq{i:03d}" for i in range(250)]
MANY_TABLES = {f"tickets__{name}" for name in MANY}


def ticket_rows(url: str, names: Iterable[str]) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of each named ticket table: ``(id, increment, offset)``."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return {
                name: [
                    tuple(row)
                    for row in conn.execute(sa.select(sa.table(
                        name, sa.column("id"), sa.column("increment"), sa.column("offset")
                    )))
                ]
                for name in names
            }
    finally:
        engine.dispose()


def test_create_ticket_tables_reverse_and_again(url: str) -> None:
    create = CreateTicketTablesOp(MANY, increment=2, offset=2)
    with operations(url) as op:
        op.invoke(create)
    assert MANY_TABLES <= table_names(url)
    assert ticket_rows(url, MANY_TABLES) == {name: [(0, 2, 2)] for name in MANY_TABLES}
    assert draw(url, MANY[-1], 2) == range(2, 6, 2)

    with operations(url) as op:  # again: the existing tables are left as they are
        op.create_ticket_tables(MANY)  # type: ignore[attr-defined]
    assert draw(url, MANY[-1], 1) == range(6, 7)

    drop = create.reverse()
    assert isinstance(drop, DropTicketTablesOp)
    with operations(url) as op:
        op.invoke(drop)
    assert table_names(url) & MANY_TABLES == set()
    with operations(url) as op:
        op.invoke(drop.reverse())  # the create it came from, stride included
    assert draw(url, MANY[0], 1) == range(2, 3)
    with operations(url) as op:
        op.drop_ticket_tables(MANY)  # type: ignore[attr-defined]
    assert table_names(url) & MANY_TABLES == set()


def test_create_ticket_tables_in_batches_in_an_autocommit_block(url: str) -> None:
    """Inside ``autocommit_block()`` the tables are committed batch by batch, each batch under
    the creation locks of ``TicketServer.create_tables``: 250 tables, three batches."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn)
            with context.begin_transaction():
                with context.autocommit_block():
                    Operations(context).create_ticket_tables(MANY)  # type: ignore[attr-defined]
    finally:
        engine.dispose()
    assert ticket_rows(url, MANY_TABLES) == {name: [(0, 1, 1)] for name in MANY_TABLES}
    assert draw(url, MANY[100], 1) == range(1, 2)


@pytest.mark.backend("postgresql")
def test_create_ticket_tables_share_the_migrations_transaction(url: str) -> None:
    """PostgreSQL: in the migration's transaction, a migration that fails leaves no table;
    in an autocommit block, the batches are committed as they go."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)

    def migrate(autocommit: bool) -> None:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn)
            with pytest.raises(RuntimeError), context.begin_transaction():
                op = Operations(context)
                op.create_table("before", sa.Column("id", sa.Integer, primary_key=True))
                if autocommit:
                    with context.autocommit_block():
                        op.create_ticket_tables(MANY)  # type: ignore[attr-defined]
                else:
                    op.create_ticket_tables(MANY)  # type: ignore[attr-defined]
                raise RuntimeError("a later step of the migration fails")

    try:
        migrate(autocommit=False)
        assert not {"before", *MANY_TABLES} & table_names(url)
        migrate(autocommit=True)
        # The autocommit block committed what came before it, and its own batches.
        assert {"before", *MANY_TABLES} <= table_names(url)
    finally:
        engine.dispose()


def _offline_script(dialect: str, *calls: Callable[[Operations], None]) -> str:
    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name=dialect, opts={"as_sql": True, "output_buffer": buffer}
    )
    for call in calls:
        call(Operations(context))
    return buffer.getvalue()


def test_create_and_drop_ticket_tables_offline_scripts_run(url: str, backend: str) -> None:
    dialect = sa.engine.make_url(url).get_dialect().name
    names = MANY[:120]
    tables = {f"tickets__{name}" for name in names}
    create = _offline_script(
        dialect,
        lambda op: op.create_ticket_tables(names, start=10, increment=3, offset=2),  # type: ignore[attr-defined]
    )
    assert create.count("CREATE TABLE IF NOT EXISTS") == 121  # and the stamp table
    run_script(url, create)
    # first id 11 (the smallest >= 10 that is 2 mod 3)
    assert ticket_rows(url, tables) == {name: [(8, 3, 2)] for name in tables}
    assert draw(url, names[7], 2) == range(11, 17, 3)
    run_script(url, create)  # written to run again: the tables are left as they are
    assert draw(url, names[7], 1) == range(17, 18)

    drop = _offline_script(dialect, lambda op: op.drop_ticket_tables(names))  # type: ignore[attr-defined]
    statements = "\n".join(line for line in drop.splitlines() if not line.startswith("--"))
    assert statements.count("DROP TABLE IF EXISTS") == 120 + (backend == "mysql")
    assert statements.count("DELETE FROM") == 1
    run_script(url, drop)
    assert table_names(url) & tables == set()
    # The last ticket table gone, the stamp table goes too; SQLite's script cannot say so.
    assert ("tickets_stamps" in table_names(url)) is (backend == "sqlite")


@pytest.mark.parametrize(
    ("sequences", "kwargs"),
    [
        ([*MANY[:100], "bad-name", *MANY[100:]], {}),
        (MANY, {"increment": 2, "offset": 3}),
        (MANY, {"bits": 16}),
        ("photos", {}),
        ([*MANY, None], {"increment": 2, "offset": 2}),  # Flickr's table has no stride here
    ],
)
def test_create_ticket_tables_bad_input_writes_nothing(
    url: str, sequences: Any, kwargs: dict[str, int]
) -> None:
    with pytest.raises(TicketsError), operations(url) as op:
        op.create_ticket_tables(sequences, **kwargs)  # type: ignore[attr-defined]
    assert not any(name.lower().startswith("tickets") for name in table_names(url))


# -- autogenerate -------------------------------------------------------------------------------


def app_metadata(source: Any = None) -> sa.MetaData:
    """Models whose ids come from ``source`` (default: the embedded default)."""
    metadata = sa.MetaData()
    sa.Table(
        "photos",
        metadata,
        sa.Column("id", TicketId("Photos", source=source), primary_key=True),
        sa.Column("title", sa.String(200), nullable=False),
    )
    sa.Table(
        "tags",
        metadata,
        sa.Column("id", TicketId("tags", bits=32, source=source), primary_key=True),
        # A foreign key to a ticket id draws nothing: no ticket table for it.
        sa.Column("owner_id", TicketId("owners"), sa.ForeignKey("photos.id")),
    )
    sa.Table("legacy", metadata, sa.Column("id", TicketId(source=source), primary_key=True))
    sa.Table("notes", metadata, sa.Column("id", TicketId("Photos", source=source),
                                          primary_key=True))
    return metadata


def migrated_metadata(url: str) -> tuple[sa.MetaData, TicketServer | None]:
    """Models whose ids come from the database ``url`` itself: the embedded default, except on
    a SQLite file (whose embedded tickets live in a sibling file), where a TicketServer on the
    file is the source."""
    if url.startswith("sqlite"):
        server = TicketServer(url, create_missing=False)
        return app_metadata(server), server
    return app_metadata(), None


def _autogenerate(url: str, metadata: sa.MetaData, **opts: Any) -> tuple[ops.MigrationScript, Any]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts=opts)
            return produce_migrations(context, metadata), compare_metadata(context, metadata)
    finally:
        engine.dispose()


def _ticket_ops(container: ops.OpContainer) -> list[ops.MigrateOperation]:
    found: list[ops.MigrateOperation] = []
    for op in container.ops:
        if isinstance(op, ops.OpContainer):
            found += _ticket_ops(op)
        elif isinstance(op, (CreateTicketTableOp, DropTicketTableOp)) or (
            isinstance(op, ops.DropTableOp) and op.table_name.lower().startswith("tickets")
        ):
            found.append(op)
    return found


def test_autogenerate_proposes_missing_ticket_tables(url: str) -> None:
    metadata, server = migrated_metadata(url)
    script, diffs = _autogenerate(url, metadata)
    if server is not None:
        server.close()
    assert script.upgrade_ops is not None and script.downgrade_ops is not None
    created = [op for op in script.upgrade_ops.ops if isinstance(op, CreateTicketTableOp)]
    assert sorted((op.table_name, op.bits) for op in created) == [
        ("Tickets64", 64),
        ("tickets__photos", 64),
        ("tickets__tags", 32),
    ]
    code = render_python_code(script.upgrade_ops)
    for line in (
        "op.create_ticket_table('photos')",
        "op.create_ticket_table('tags', bits=32)",
        "op.create_ticket_table()",
    ):
        assert line in code
    assert "_ticket_table('owners'" not in code
    downgrade = render_python_code(script.downgrade_ops)
    assert "op.drop_ticket_table('photos')" in downgrade
    assert "op.drop_ticket_table('tags', bits=32)" in downgrade
    assert [d[0] for d in diffs].count("add_ticket_table") == 3


def test_autogenerate_is_quiet_once_the_tables_exist(url: str) -> None:
    metadata, source = migrated_metadata(url)
    if source is not None:
        source.close()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        metadata.create_all(engine)
    finally:
        engine.dispose()
    server = TicketServer(url)
    try:
        server.create("photos")
        server.create("tags", bits=32)
        server.create(None)  # Tickets64: "Tickets64" on PostgreSQL, quoted, exactly as reported
    finally:
        server.close()

    script, diffs = _autogenerate(url, metadata)
    assert script.upgrade_ops is not None
    assert _ticket_ops(script.upgrade_ops) == []
    assert diffs == []

    # Metadata without the models: the app tables would be dropped, the ticket tables never.
    script, _ = _autogenerate(url, sa.MetaData())
    assert script.upgrade_ops is not None
    dropped = {op.table_name for op in script.upgrade_ops.ops if isinstance(op, ops.DropTableOp)}
    assert dropped == {"photos", "tags", "legacy", "notes"}

    # include_object alone (the comparator switched off) hides them too.
    script, _ = _autogenerate(
        url, sa.MetaData(), include_object=include_object, sqlalchemy_tickets_autogenerate=False
    )
    assert script.upgrade_ops is not None
    dropped = {op.table_name for op in script.upgrade_ops.ops if isinstance(op, ops.DropTableOp)}
    assert dropped == {"photos", "tags", "legacy", "notes"}
    # ... and without either, Alembic would drop them (which is why both exist).
    script, _ = _autogenerate(url, sa.MetaData(), sqlalchemy_tickets_autogenerate=False)
    assert script.upgrade_ops is not None
    dropped = {op.table_name for op in script.upgrade_ops.ops if isinstance(op, ops.DropTableOp)}
    assert {"tickets__photos", "tickets__tags"} <= dropped


@pytest.mark.backend("sqlite", "postgresql")
def test_revision_autogenerate_end_to_end(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    """``alembic revision --autogenerate`` writes a script that creates the ticket table."""
    project = tmp_path / backend
    shutil.copytree(EXAMPLES / backend, project, ignore=shutil.ignore_patterns("__pycache__"))
    for revision in (project / "versions").glob("*.py"):
        revision.unlink()
    url = make_database(backend)
    alembic(project, "revision", "--autogenerate", "-m", "initial", url=url)
    (script,) = (project / "versions").glob("*.py")
    text = script.read_text()
    assert "import sqlalchemy_tickets.alembic" in text
    assert "sqlalchemy_tickets.TicketId('photos')" in text  # hence the template's import
    assert "\nimport sqlalchemy_tickets  #" in text
    assert "op.create_ticket_table('photos')" in text
    assert "op.drop_ticket_table('photos')" in text

    alembic(project, "upgrade", "head", url=url)
    assert draw(url, "Photos", 3) == range(1, 4)
    # Up to date: a second autogenerate finds nothing to do.
    alembic(project, "revision", "--autogenerate", "-m", "nothing", url=url)
    (second,) = [p for p in (project / "versions").glob("*.py") if p != script]
    assert "op." not in second.read_text().split("def upgrade")[1].split("def downgrade")[0]


# -- autogenerate: only the ticket tables of the database being migrated ------------------------

PROJECT_ENV = '''
import os
import sys

import sqlalchemy as sa
from alembic import context

sys.path.insert(0, os.path.dirname(__file__))

import sqlalchemy_tickets.alembic  # noqa: F401
from sqlalchemy_tickets.alembic import include_object
from models import target_metadata  # the application's models, which may configure() a source

engine = sa.create_engine(context.get_x_argument(as_dictionary=True)["url"],
                          poolclass=sa.pool.NullPool)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=target_metadata,
                      include_object=include_object)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
'''

MODELS_HEAD = '''
import os

import sqlalchemy as sa
from sqlalchemy_tickets import CachedSource, TicketId, TicketServer, TicketServers, configure

APP = os.environ["APP_URL"]
TICKETS = os.environ.get("TICKETS_URL", "")
target_metadata = sa.MetaData()
'''


def alembic_project(tmp_path: Path, models: str) -> Path:
    """A fresh Alembic project in ``tmp_path``: the examples' ``script.py.mako``, an ``env.py``
    that imports ``models.py`` (as an application's would), no revisions yet."""
    project = tmp_path / "project"
    (project / "versions").mkdir(parents=True)
    shutil.copy(EXAMPLES / "postgresql" / "alembic.ini", project / "alembic.ini")
    shutil.copy(EXAMPLES / "postgresql" / "script.py.mako", project / "script.py.mako")
    (project / "env.py").write_text(PROJECT_ENV)
    (project / "models.py").write_text(MODELS_HEAD + models)
    return project


def alembic_cli(project: Path, *args: str, app: str, tickets: str = "") -> str:
    """``alembic`` in a process of its own (the models' ``configure()`` stays there)."""
    env = {**__import__("os").environ, "APP_URL": app, "TICKETS_URL": tickets}
    result = forked.run_module(
        "alembic", "-c", str(project / "alembic.ini"), "-x", f"url={app}", *args,
        env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def autogenerated(project: Path, *, app: str, tickets: str = "") -> str:
    alembic_cli(project, "revision", "--autogenerate", "-m", "models", app=app, tickets=tickets)
    (script,) = (project / "versions").glob("*.py")
    return script.read_text()


def ticket_tables_in(url: str) -> set[str]:
    return {n for n in table_names(url) if n.lower().startswith("tickets")}


@pytest.mark.backend("postgresql", "mysql")
def test_autogenerate_proposes_nothing_for_a_configured_dedicated_server(
    backend: str, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    app, tickets = make_database(backend), make_database(backend)
    project = alembic_project(tmp_path, """
configure(TICKETS)   # a dedicated ticket server, as the models module says
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos"), primary_key=True))
sa.Table("tags", target_metadata, sa.Column("id", TicketId("tags", bits=32), primary_key=True))
sa.Table("legacy", target_metadata, sa.Column("id", TicketId(), primary_key=True))
""")
    script = autogenerated(project, app=app, tickets=tickets)
    assert "op.create_table('photos'" in script
    assert "sqlalchemy_tickets.TicketId('photos')" in script
    assert "_ticket_table" not in script
    # So autogenerate wrote no `import sqlalchemy_tickets.alembic`, but the import the TicketId
    # columns need (beside the one this project's script.py.mako still has: two are harmless).
    assert "import sqlalchemy_tickets.alembic" not in script
    assert "\nimport sqlalchemy_tickets\n" in script
    assert "\nimport sqlalchemy_tickets  #" in script
    alembic_cli(project, "upgrade", "head", app=app, tickets=tickets)
    assert {"photos", "tags", "legacy"} <= table_names(app)
    assert ticket_tables_in(app) == set()  # nothing unused in the application's database
    assert ticket_tables_in(tickets) == set()  # nor written to the ticket server


def test_autogenerate_proposes_only_the_embedded_default_columns(
    make_database: Callable[[str], str], tmp_path: Path
) -> None:
    app = make_database("postgresql")
    odd, even = make_database("postgresql"), make_database("postgresql")
    project = alembic_project(tmp_path, f"""
pair = TicketServers([{odd!r}, {even!r}])
one = TicketServer(TICKETS)
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos", source=pair),
                                              primary_key=True))
sa.Table("notes", target_metadata, sa.Column("id", TicketId("notes", source=one),
                                             primary_key=True))
sa.Table("cached", target_metadata,
         sa.Column("id", TicketId("cached", source=CachedSource(pair)), primary_key=True))
# Its own database, through a cache: drawn from the migrated database, so proposed.
sa.Table("local", target_metadata,
         sa.Column("id", TicketId("local", source=CachedSource(TicketServer(APP))),
                   primary_key=True))
# The embedded default: proposed.
sa.Table("accounts", target_metadata, sa.Column("id", TicketId("Accounts"), primary_key=True))
""")
    tickets = make_database("postgresql")
    script = autogenerated(project, app=app, tickets=tickets)
    proposed = sorted(re.findall(r"op\.create_ticket_table\((.*?)\)", script))
    assert proposed == ["'accounts'", "'local'"]
    alembic_cli(project, "upgrade", "head", app=app, tickets=tickets)
    # With the stamp table, which the migration makes with them.
    assert ticket_tables_in(app) == {"tickets__accounts", "tickets__local", "tickets_stamps"}
    assert ticket_tables_in(odd) == ticket_tables_in(even) == set()


def test_autogenerate_with_a_source_configured_on_the_migrated_database(
    make_database: Callable[[str], str], tmp_path: Path
) -> None:
    app = make_database("postgresql")
    project = alembic_project(tmp_path, """
configure(APP)   # a cache over the application's own database: not a dedicated server
sa.Table("photos", target_metadata, sa.Column("id", TicketId("Photos"), primary_key=True))
""")
    script = autogenerated(project, app=app)
    assert "op.create_ticket_table('photos')" in script


def test_autogenerate_on_a_sqlite_file_leaves_the_embedded_tickets_to_their_own_file(
    make_database: Callable[[str], str],
) -> None:
    """The embedded default keeps a SQLite file's tickets in a sibling file, made on first use:
    a ticket table in the application's file would never be used, so none is proposed."""
    url = make_database("sqlite")
    script, _ = _autogenerate(url, app_metadata())
    assert script.upgrade_ops is not None
    assert _ticket_ops(script.upgrade_ops) == []


# -- the Flickr pair example takes its stride from the server --------------------------------------


def _session_stride_url(url: str, increment: int, offset: int) -> str:
    """``url`` whose connections run with these auto_increment_* session values: a server of a
    Flickr pair, as far as every client on this URL can tell (the shared test server's global
    settings stay untouched)."""
    command = (f"SET SESSION auto_increment_increment={increment}, "
               f"auto_increment_offset={offset}")
    return sa.engine.make_url(url).update_query_dict({"init_command": command}).render_as_string(
        hide_password=False
    )


def test_flickr_pair_example_reads_the_stride_from_the_server(
    make_database: Callable[[str], str],
) -> None:
    odd = _session_stride_url(make_database("mysql"), 2, 1)
    even = _session_stride_url(make_database("mysql"), 2, 2)
    for url in (odd, even):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=url)  # no -x offset
        assert TICKET_TABLES <= table_names(url)
    assert draw(odd, "Photos", 3) == range(1, 7, 2)
    assert draw(even, "Photos", 3) == range(2, 8, 2)
    assert draw(odd, None, 2) == range(1, 5, 2)
    assert draw(even, None, 2, bits=32) == range(2, 6, 2)
    pair = TicketServers([odd, even])
    try:
        assert sorted(pair.next_id("Photos") for _ in range(4)) == [7, 8, 9, 10]
    finally:
        pair.close()


def test_flickr_pair_example_x_offset_still_wins_and_is_checked(
    make_database: Callable[[str], str],
) -> None:
    url = _session_stride_url(make_database("mysql"), 2, 2)
    # -x offset=2 agrees with the server: fine.
    alembic("mysql-flickr-two-servers", "upgrade", "head", url=url, offset=2)
    assert draw(url, "Photos", 2) == range(2, 6, 2)
    # -x offset=1 on the even server: refused before anything is created.
    other = _session_stride_url(make_database("mysql"), 2, 2)
    with pytest.raises(StrideMismatchError, match="auto_increment_offset=2"):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=other, offset=1)
    assert table_names(other) & TICKET_TABLES == set()


def test_flickr_pair_example_refuses_a_server_that_is_not_in_a_pair(
    make_database: Callable[[str], str],
) -> None:
    """A server still at auto_increment_increment=1 would give both servers the same ids."""
    from alembic.util import CommandError

    url = make_database("mysql")
    with pytest.raises(CommandError, match="auto_increment_increment=1"):
        alembic("mysql-flickr-two-servers", "upgrade", "head", url=url)
    assert table_names(url) & TICKET_TABLES == set()


# -- datacenter tiers -----------------------------------------------------------------------------


def _tier_works(url: str, prefix: str, tmp_path: Path, *, create: bool = False) -> None:
    """A DatacenterTier that may not create anything (unless ``create``) issues ids from the
    tables as made."""
    upstream = TicketServer(f"sqlite:///{tmp_path / (prefix + '_upstream.db')}")
    tier = DatacenterTier(url, upstream, table_prefix=prefix, create_missing=create,
                          min_block=10, timeout=10.0)
    try:
        assert tier.next_block("photos", 3) == range(1, 4)
    finally:
        tier.close()
        upstream.close()
    (status,) = describe_datacenter(url, table_prefix=prefix)
    assert (status.sequence, status.issued) == ("photos", 3)


def test_datacenter_tables_online_upgrade_downgrade(url: str, tmp_path: Path) -> None:
    project = tier_project(tmp_path, "tickets_eu")
    result = run_alembic(project, "upgrade", "head", url=url)
    assert result.returncode == 0, result.stderr
    assert {"tickets_eu__stock", "tickets_eu__state"} <= table_names(url)
    _tier_works(url, "tickets_eu", tmp_path)

    result = run_alembic(project, "downgrade", "base", url=url)
    assert result.returncode == 0, result.stderr
    assert table_names(url) & {"tickets_eu__stock", "tickets_eu__state"} == set()


def test_datacenter_tables_offline_script_runs(url: str, tmp_path: Path) -> None:
    """The ``--sql`` script, run statement by statement by hand, makes tables the tier uses."""
    project = tier_project(tmp_path)
    result = run_alembic(project, "upgrade", "head", "--sql", url=url)
    assert result.returncode == 0, result.stderr
    run_script(url, result.stdout)
    _tier_works(url, "tickets_dc", tmp_path)


def test_create_datacenter_tables_is_idempotent_beside_a_running_tier(
    url: str, tmp_path: Path
) -> None:
    _tier_works(url, "tickets_dc", tmp_path, create=True)  # tables made on first use
    with operations(url) as op:
        op.create_datacenter_tables()  # type: ignore[attr-defined]
    (status,) = describe_datacenter(url)
    assert status.issued == 3 and status.stock > 0  # nothing lost


def test_autogenerate_proposes_the_tier_tables_once(url: str, tmp_path: Path) -> None:
    project = tier_project(tmp_path, None)
    result = run_alembic(project, "revision", "--autogenerate", "-m", "tier", url=url,
                         tier="tickets_eu")
    assert result.returncode == 0, result.stderr
    (script,) = (project / "versions").glob("*.py")
    text = script.read_text()
    upgrade, downgrade = text.split("def upgrade")[1].split("def downgrade")
    assert "op.create_datacenter_tables(table_prefix='tickets_eu')" in upgrade
    assert "op.create_table" not in upgrade  # one operation, not the two tables
    assert "op.drop_datacenter_tables(table_prefix='tickets_eu')" in downgrade
    assert "import sqlalchemy_tickets.alembic" in text

    result = run_alembic(project, "upgrade", "head", url=url)
    assert result.returncode == 0, result.stderr
    _tier_works(url, "tickets_eu", tmp_path)

    # Up to date (PostgreSQL's missing table comments included): nothing more to do.
    result = run_alembic(project, "revision", "--autogenerate", "-m", "again", url=url,
                         tier="tickets_eu")
    assert result.returncode == 0, result.stderr
    (second,) = [p for p in (project / "versions").glob("*.py") if p != script]
    again = second.read_text().split("def upgrade")[1].split("def downgrade")[0]
    assert "op." not in again, again


def test_autogenerate_never_drops_a_tier_missing_from_the_metadata(
    url: str, tmp_path: Path
) -> None:
    """Tables a running tier made (default and other prefixes) with an empty metadata."""
    _tier_works(url, "tickets_dc", tmp_path, create=True)
    _tier_works(url, "tickets_eu", tmp_path, create=True)
    with operations(url) as op:
        op.create_table("orders__stock", sa.Column("id", sa.Integer, primary_key=True))
    metadata = sa.MetaData()
    script, diffs = _autogenerate(url, metadata)
    code = render_python_code(script.upgrade_ops)
    assert "tickets_dc__" not in code and "tickets_eu__" not in code
    # A table that only looks like one by its name is the user's: dropped as Alembic would.
    assert "op.drop_table('orders__stock')" in code
