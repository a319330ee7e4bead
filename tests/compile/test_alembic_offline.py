"""Alembic support without a server: offline ``--sql`` scripts of the examples, the operations'
arguments, reverse() and autogenerate rendering, the imports rendered scripts get, and the
plugin."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import types
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import render_python_code
from alembic.autogenerate.api import AutogenContext
from alembic.autogenerate.render import render_op_text
from alembic.migration import MigrationContext
from alembic.operations import Operations, ops
from sqlalchemy.engine import make_url

from sqlalchemy_tickets import UUID7, PrefixedId, TicketId
from sqlalchemy_tickets.alembic import (
    CreateDatacenterTablesOp,
    CreateTicketTableOp,
    CreateTicketTablesOp,
    DropDatacenterTablesOp,
    DropTicketTableOp,
    DropTicketTablesOp,
    SyncTicketSequenceOp,
    include_object,
    is_ticket_table_name,
    plugin,
)
from sqlalchemy_tickets.alembic.render import IMPORT_LINE, add_type_imports
from sqlalchemy_tickets.errors import TicketsError
from sqlalchemy_tickets.sources.datacenter import (
    datacenter_table_statements,
    drop_datacenter_table_statements,
)
from support import forked
from support.alembic_tier import run_alembic, tier_project

EXAMPLES = Path(__file__).resolve().parents[2] / "migrations_examples"

OFFLINE_URLS = {
    "sqlite": "sqlite:///offline.db",
    "postgresql": "postgresql+psycopg://user@db.invalid/app",
    "mysql": "mysql+pymysql://root@db.invalid/app",
    "mariadb": "mariadb+pymysql://root@db.invalid/app",
}

#: The named table's CREATE and seed INSERT, as each dialect must quote them (``offset`` is
#: reserved on PostgreSQL and MariaDB; a ``mysql`` URL cannot tell MySQL from MariaDB offline).
NAMED_CREATE = {
    "sqlite": "CREATE TABLE IF NOT EXISTS tickets__photos (\n    stub CHAR(1) NOT NULL, \n"
    '    id BIGINT NOT NULL, \n    "increment" INTEGER NOT NULL, \n    "offset" INTEGER NOT NULL, ',
    "postgresql": "CREATE TABLE IF NOT EXISTS tickets__photos (\n    stub CHAR(1) NOT NULL, \n"
    '    id BIGINT NOT NULL, \n    "increment" INTEGER NOT NULL, \n    "offset" INTEGER NOT NULL, ',
    "mysql": "CREATE TABLE IF NOT EXISTS tickets__photos (\n    stub CHAR(1) NOT NULL, \n"
    "    id BIGINT NOT NULL, \n    `increment` INTEGER NOT NULL, \n    `offset` INTEGER NOT NULL, ",
}
NAMED_CREATE["mariadb"] = NAMED_CREATE["mysql"]


def seed_insert(dialect: str, seed_id: int, increment: int, offset: int) -> str:
    values = f"VALUES ('a', {seed_id}, {increment}, {offset})"
    if dialect == "sqlite":
        return f'INSERT OR IGNORE INTO tickets__photos (stub, id, "increment", "offset") {values};'
    if dialect == "postgresql":
        return (
            f'INSERT INTO tickets__photos (stub, id, "increment", "offset") {values} '
            "ON CONFLICT DO NOTHING;"
        )
    return f"INSERT IGNORE INTO tickets__photos (stub, id, `increment`, `offset`) {values};"


def alembic(
    example: str, *args: str, x: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the ``alembic`` command line on an example, from an unrelated working directory."""
    argv = ["-c", str(EXAMPLES / example / "alembic.ini")]
    for key, value in (x or {}).items():
        argv += ["-x", f"{key}={value}"]
    env = {**os.environ, "PYTHONWARNINGS": "error::DeprecationWarning:alembic"}
    return forked.run_module("alembic", *argv, *args, cwd="/", env=env)


def offline(example: str, *args: str, **x: str) -> str:
    result = alembic(example, *args, "--sql", x=x)
    assert result.returncode == 0, result.stderr
    return result.stdout


# -- the examples, offline -----------------------------------------------------------------------


@pytest.mark.parametrize("example", ["sqlite", "postgresql"])
@pytest.mark.parametrize("dialect", sorted(OFFLINE_URLS))
def test_app_examples_offline_upgrade(example: str, dialect: str) -> None:
    sql = offline(example, "upgrade", "head", url=OFFLINE_URLS[dialect])
    assert "CREATE TABLE photos (" in sql
    assert NAMED_CREATE[dialect] in sql
    assert seed_insert(dialect, 0, 1, 1) in sql
    # The ticket table comes after the application table, and its seed after its CREATE.
    assert sql.index("CREATE TABLE photos") < sql.index("tickets__photos") < sql.index("INSERT")
    # With the stamp table, before it, and its registration there, after it.
    register = "INTO tickets_stamps (name) VALUES ('tickets__photos')"
    assert sql.index("CREATE TABLE IF NOT EXISTS tickets_stamps") < sql.index(NAMED_CREATE[dialect])
    assert sql.index(seed_insert(dialect, 0, 1, 1)) < sql.index(register)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_postgresql_example_takes_its_stride_from_x_args(dialect: str) -> None:
    sql = offline(
        "postgresql", "upgrade", "head", url=OFFLINE_URLS[dialect], increment="2", offset="2"
    )
    # first id 2, so the row starts at 2 - 2 = 0 with stride 2/2
    assert seed_insert(dialect, 0, 2, 2) in sql
    sql = offline(
        "postgresql", "upgrade", "head", url=OFFLINE_URLS[dialect], increment="2", offset="1"
    )
    assert seed_insert(dialect, -1, 2, 1) in sql


#: How each dialect's ``--sql`` downgrade drops the stamp table with the last ticket table.
STAMPS_DROPPED = {
    "sqlite": "-- sqlalchemy-tickets: tickets_stamps stays: this database cannot drop it only",
    "postgresql": "DO $tickets$ BEGIN IF NOT EXISTS (SELECT 1 FROM tickets_stamps) THEN LOCK "
    "TABLE tickets_stamps IN ACCESS EXCLUSIVE MODE; IF NOT EXISTS (SELECT 1 FROM tickets_stamps)"
    " THEN DROP TABLE tickets_stamps; END IF; END IF; END $tickets$;",
    "mysql": "SET @tickets_drop_if_empty = IF(EXISTS (SELECT 1 FROM tickets_stamps), 'DO 0', "
    "'DROP TABLE IF EXISTS tickets_stamps');\n\nPREPARE tickets_drop_if_empty FROM "
    "@tickets_drop_if_empty;\n\nEXECUTE tickets_drop_if_empty;\n\n"
    "DEALLOCATE PREPARE tickets_drop_if_empty;",
}


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_app_examples_offline_downgrade(dialect: str) -> None:
    sql = offline("sqlite", "downgrade", "0001:base", url=OFFLINE_URLS[dialect])
    assert "DROP TABLE IF EXISTS tickets__photos;" in sql
    assert sql.index("DROP TABLE IF EXISTS") < sql.index("DROP TABLE photos")
    # Its row forgotten, then the stamp table dropped where no row is left (the database
    # decides as the script runs; SQLite's script says it cannot).
    forget = "DELETE FROM tickets_stamps WHERE tickets_stamps.name = 'tickets__photos';"
    assert sql.index("DROP TABLE IF EXISTS tickets__photos;") < sql.index(forget)
    assert sql.index(forget) < sql.index(STAMPS_DROPPED[dialect])


@pytest.mark.parametrize("dialect", ["mysql", "mariadb"])
@pytest.mark.parametrize("offset", [1, 2])
def test_flickr_pair_example_offline(dialect: str, offset: int) -> None:
    sql = offline(
        "mysql-flickr-two-servers", "upgrade", "head", url=OFFLINE_URLS[dialect], offset=str(offset)
    )
    for name, column in (
        ("Tickets64", "BIGINT(20) UNSIGNED"),
        ("Tickets32", "INTEGER(10) UNSIGNED"),
    ):
        assert (
            f"CREATE TABLE IF NOT EXISTS `{name}` (\n    id {column} NOT NULL AUTO_INCREMENT, "
            in sql
        )
        # Flickr's tables start empty: the first REPLACE INTO makes the row.
        assert f"INSERT IGNORE INTO `{name}`" not in sql
        # There is no server to check offline: the script says what it needs.
        assert (
            f"-- sqlalchemy-tickets: {name} takes its stride from the server: run this only on a "
            f"server with auto_increment_increment=2 and auto_increment_offset={offset}"
        ) in sql
    assert "CONSTRAINT stub UNIQUE (stub)" in sql
    if dialect == "mysql":
        # SQLAlchemy 2.0 writes the table options in another order than 2.1; both mean the same.
        assert re.search(
            rf"(ENGINE=InnoDB AUTO_INCREMENT={offset}|AUTO_INCREMENT={offset} ENGINE=InnoDB);", sql
        ), sql
    assert NAMED_CREATE[dialect] in sql
    assert seed_insert(dialect, offset - 2, 2, offset) in sql
    # Flickr's tables come first, so that the online stride check runs before anything exists.
    assert sql.index("`Tickets64`") < sql.index("`Tickets32`") < sql.index("tickets__photos")


def test_flickr_pair_example_needs_the_servers_position() -> None:
    result = alembic(
        "mysql-flickr-two-servers", "upgrade", "head", "--sql", x={"url": OFFLINE_URLS["mysql"]}
    )
    assert result.returncode != 0
    assert "-x offset=1" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("example", ["sqlite", "postgresql", "mysql-flickr-two-servers"])
def test_examples_say_how_to_pass_the_database(example: str) -> None:
    result = alembic(example, "upgrade", "head", "--sql")
    assert result.returncode != 0
    assert "-x url=" in result.stderr and "Traceback" not in result.stderr


def test_flickr_stride_is_refused_where_the_server_cannot_supply_it() -> None:
    result = alembic(
        "mysql-flickr-two-servers",
        "upgrade",
        "head",
        "--sql",
        x={"url": OFFLINE_URLS["postgresql"], "offset": "2"},
    )
    assert result.returncode != 0
    assert "TicketsError" in result.stderr and "Tickets64" in result.stderr
    assert "CREATE TABLE IF NOT EXISTS" not in result.stdout


# -- the operations, in process -------------------------------------------------------------------


def _ops(dialect: str, *, literal_binds: bool = True) -> tuple[Operations, io.StringIO]:
    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name=dialect,
        opts={"as_sql": True, "output_buffer": buffer, "literal_binds": literal_binds},
    )
    return Operations(context), buffer


@pytest.mark.parametrize("literal_binds", [True, False])
def test_seed_values_are_inlined_offline(literal_binds: bool) -> None:
    op, buffer = _ops("postgresql", literal_binds=literal_binds)
    op.create_ticket_table("Photos", start=10, increment=3, offset=2)  # type: ignore[attr-defined]
    # first id 11 (the smallest id >= 10 that is 2 mod 3): the row starts one stride below
    assert seed_insert("postgresql", 8, 3, 2) in buffer.getvalue()


def test_flickr_tables_offline_on_every_dialect() -> None:
    for dialect, quote in (("sqlite", '"'), ("postgresql", '"'), ("mysql", "`")):
        op, buffer = _ops(dialect)
        op.create_ticket_table(bits=32)  # type: ignore[attr-defined]
        op.drop_ticket_table(bits=32)  # type: ignore[attr-defined]
        sql = buffer.getvalue()
        assert f"CREATE TABLE IF NOT EXISTS {quote}Tickets32{quote} (" in sql
        assert f"DROP TABLE IF EXISTS {quote}Tickets32{quote};" in sql


@pytest.mark.parametrize(
    "kwargs",
    [
        {"bits": 16},
        {"increment": 0},
        {"increment": 2, "offset": 3},
        {"offset": 0},
        {"start": 0},
        {"start": 2**31, "bits": 32},
        {"increment": True},
    ],
)
def test_bad_arguments_raise_before_any_sql(kwargs: dict[str, int]) -> None:
    op, buffer = _ops("sqlite")
    with pytest.raises(TicketsError):
        op.create_ticket_table("Photos", **kwargs)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


@pytest.mark.parametrize("sequence", ["bad-name", "", "1photos", "x" * 41, "a b"])
def test_bad_sequence_names_raise_before_any_sql(sequence: str) -> None:
    op, buffer = _ops("postgresql")
    with pytest.raises(TicketsError):
        op.create_ticket_table(sequence)  # type: ignore[attr-defined]
    with pytest.raises(TicketsError):
        op.drop_ticket_table(sequence)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""
    with pytest.raises(ValueError):  # TicketsError is a ValueError
        CreateTicketTableOp(sequence)


def test_reverse_round_trip() -> None:
    create = CreateTicketTableOp("Photos", bits=32, start=10, increment=3, offset=2)
    drop = create.reverse()
    assert isinstance(drop, DropTicketTableOp)
    assert (drop.table_name, drop.bits) == ("tickets__photos", 32)
    again = drop.reverse()
    assert isinstance(again, CreateTicketTableOp)
    assert (again.start, again.increment, again.offset) == (10, 3, 2)
    # A drop written by hand reverses to a create with the default stride.
    plain = DropTicketTableOp("photos").reverse()
    assert (plain.table_name, plain.bits, plain.start, plain.increment, plain.offset) == (
        "tickets__photos",
        64,
        1,
        1,
        1,
    )
    assert DropTicketTableOp().reverse().table_name == "Tickets64"


def test_render() -> None:
    upgrade = ops.UpgradeOps(
        ops=[
            CreateTicketTableOp("photos"),
            CreateTicketTableOp("tags", bits=32),
            CreateTicketTableOp(),
            CreateTicketTableOp(bits=32, increment=2, offset=2),
            CreateTicketTableOp("Photos", start=10, increment=3, offset=2),
            DropTicketTableOp("photos"),
            DropTicketTableOp(bits=32),
        ]
    )
    code = render_python_code(upgrade)
    lines = [line.strip() for line in code.splitlines() if line.strip().startswith("op.")]
    assert lines == [
        "op.create_ticket_table('photos')",
        "op.create_ticket_table('tags', bits=32)",
        "op.create_ticket_table()",
        "op.create_ticket_table(bits=32, increment=2, offset=2)",
        "op.create_ticket_table('Photos', start=10, increment=3, offset=2)",
        "op.drop_ticket_table('photos')",
        "op.drop_ticket_table(bits=32)",
    ]


# -- many tables at once --------------------------------------------------------------------------


def test_ticket_tables_offline_on_every_dialect() -> None:
    for dialect in ("sqlite", "postgresql", "mysql"):
        op, buffer = _ops(dialect)
        op.create_ticket_tables(["Photos", "tags", "photos"], start=10, increment=3, offset=2)  # type: ignore[attr-defined]
        op.drop_ticket_tables(["Photos", "tags"])  # type: ignore[attr-defined]
        # The statements (SQLite's script also says in a comment what it cannot do).
        sql = "\n".join(line for line in buffer.getvalue().splitlines()
                        if not line.startswith("--"))
        # Each table once (Photos and photos are one sequence), its seed after its CREATE.
        assert sql.count("CREATE TABLE IF NOT EXISTS") == 3  # two ticket tables, the stamps
        assert NAMED_CREATE[dialect] in sql
        assert seed_insert(dialect, 8, 3, 2) in sql
        assert sql.index("tickets__photos") < sql.index("INSERT") < sql.index("tickets__tags")
        # Dropped, and their recorded identities forgotten in one statement.
        assert sql.count("DROP TABLE IF EXISTS tickets__") == 2
        assert sql.count("DELETE FROM tickets_stamps") == 1
        assert "IN ('tickets__photos', 'tickets__tags')" in sql


def test_flickr_in_a_list_of_ticket_tables_offline() -> None:
    op, buffer = _ops("mysql")
    op.create_ticket_tables([None, "photos"], increment=2, offset=1)  # type: ignore[attr-defined]
    sql = buffer.getvalue()
    # There is no server to check offline: the script says what it needs, before the table.
    note = ("-- sqlalchemy-tickets: Tickets64 takes its stride from the server: run this only on "
            "a server with auto_increment_increment=2 and auto_increment_offset=1")
    assert sql.index(note) < sql.index("`Tickets64`") < sql.index("tickets__photos")
    assert "INSERT IGNORE INTO `Tickets64`" not in sql
    # Elsewhere Flickr's table has no stride: refused with nothing written.
    op, buffer = _ops("postgresql")
    with pytest.raises(TicketsError, match="Tickets64"):
        op.create_ticket_tables(["photos", None], increment=2, offset=1)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


@pytest.mark.parametrize(
    ("sequences", "kwargs"),
    [
        (["photos", "bad-name"], {}),
        (["photos", ""], {}),
        (["photos", "x" * 41], {}),
        (["photos", 7], {}),
        (["photos"], {"bits": 16}),
        (["photos"], {"increment": 2, "offset": 3}),
        (["photos"], {"start": 0}),
        ("photos", {}),  # a string is not a list of names
    ],
)
def test_ticket_tables_bad_arguments_raise_before_any_sql(
    sequences: Any, kwargs: dict[str, int]
) -> None:
    op, buffer = _ops("postgresql")
    with pytest.raises(TicketsError):
        op.create_ticket_tables(sequences, **kwargs)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


@pytest.mark.parametrize(
    ("sequences", "bits"),
    [(["photos", "bad-name"], 64), (["photos", None], 16), ("photos", 64)],
)
def test_drop_ticket_tables_bad_arguments_raise_before_any_sql(sequences: Any, bits: int) -> None:
    op, buffer = _ops("postgresql")
    with pytest.raises(TicketsError):
        op.drop_ticket_tables(sequences, bits=bits)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


def test_ticket_tables_reverse_round_trip() -> None:
    create = CreateTicketTablesOp(["Photos", "tags"], bits=32, start=10, increment=3, offset=2)
    drop = create.reverse()
    assert isinstance(drop, DropTicketTablesOp)
    assert (drop.table_names, drop.bits) == (["tickets__photos", "tickets__tags"], 32)
    assert drop.reverse() is create  # stride and start included
    # A drop written by hand reverses to a create with the default stride.
    plain = DropTicketTablesOp(["photos", None]).reverse()
    assert isinstance(plain, CreateTicketTablesOp)
    assert plain.table_names == ["tickets__photos", "Tickets64"]
    assert (plain.bits, plain.start, plain.increment, plain.offset) == (64, 1, 1, 1)
    assert plain.to_diff_tuple()[0] == "add_ticket_tables"
    assert plain.reverse().to_diff_tuple()[0] == "remove_ticket_tables"


def test_ticket_tables_render() -> None:
    upgrade = ops.UpgradeOps(
        ops=[
            CreateTicketTablesOp(["photos", "tags"]),
            CreateTicketTablesOp(["Photos", None], bits=32, start=10, increment=3, offset=2),
            CreateTicketTablesOp(["a"], table_template="ids_{sequence}_tickets"),
            DropTicketTablesOp(["photos", "tags"]),
            DropTicketTablesOp([None], bits=32),
        ]
    )
    lines = [
        line.strip()
        for line in render_python_code(upgrade).splitlines()
        if line.strip().startswith("op.")
    ]
    assert lines == [
        "op.create_ticket_tables(['photos', 'tags'])",
        "op.create_ticket_tables(['Photos', None], bits=32, start=10, increment=3, offset=2)",
        "op.create_ticket_tables(['a'], table_template='ids_{sequence}_tickets')",
        "op.drop_ticket_tables(['photos', 'tags'])",
        "op.drop_ticket_tables([None], bits=32)",
    ]
    autogen_context = _autogen_context()
    render_op_text(autogen_context, CreateTicketTablesOp(["photos"]))
    assert autogen_context.imports == {IMPORT_LINE}


def test_custom_table_template() -> None:
    op, buffer = _ops("sqlite")
    op.create_ticket_table("Photos", table_template="ids_{sequence}_tickets")  # type: ignore[attr-defined]
    assert "CREATE TABLE IF NOT EXISTS ids_photos_tickets" in buffer.getvalue()
    code = render_python_code(
        ops.UpgradeOps(ops=[CreateTicketTableOp("photos", table_template="ids_{sequence}_tickets")])
    )
    assert "op.create_ticket_table('photos', table_template='ids_{sequence}_tickets')" in code
    with pytest.raises(TicketsError):
        CreateTicketTableOp("photos", table_template="no_placeholder")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tickets__photos", True),
        ("TICKETS__Photos", True),
        ("Tickets64", True),
        ("tickets32", True),
        ("photos", False),
        ("tickets_photos", False),
        ("tickets__", False),
        ("Tickets16", False),
    ],
)
def test_ticket_table_names(name: str, expected: bool) -> None:
    assert is_ticket_table_name(name) is expected
    # include_object hides reflected ticket tables only
    assert include_object(None, name, "table", True, None) is (not expected)
    assert include_object(None, name, "table", False, object()) is True
    assert include_object(None, "id", "column", True, None) is True


# -- datacenter tiers ---------------------------------------------------------------------------

TIER_DIALECTS = ["sqlite", "postgresql", "mysql", "mariadb"]


def _tier_ddl(dialect: str, prefix: str, *, drop: bool = False) -> list[str]:
    """The tier's own DDL compiled for ``dialect``: what the operations must write."""
    name = "mysql" if dialect == "mariadb" else dialect
    make = drop_datacenter_table_statements if drop else datacenter_table_statements
    compiled_dialect = make_url(OFFLINE_URLS[dialect]).get_dialect()()
    return [
        # Alembic writes a tab as four spaces, and values inlined.
        str(statement.compile(  # type: ignore[attr-defined]
            dialect=compiled_dialect, compile_kwargs={"literal_binds": True}
        )).replace("\t", "    ").strip()
        for statement in make(dialect=name, table_prefix=prefix)
    ]


_TABLE_OPTION = re.compile(r"\w+=(?:'(?:[^']|'')*'|\S+)")


def _written(ddl: str, script: str) -> bool:
    """``ddl`` is a statement of ``script``. MySQL's table options after the closing parenthesis
    are compared as a set: SQLAlchemy 2.0 writes them in an order that differs between
    processes (2.1 keeps one order)."""
    body, _, options = ddl.rpartition(")")
    start = script.find(body + ")")
    if start < 0:
        return False
    written = script[start + len(body) + 1 : script.index(";", start + len(body))]
    return sorted(_TABLE_OPTION.findall(written)) == sorted(_TABLE_OPTION.findall(options))


@pytest.mark.parametrize("dialect", TIER_DIALECTS)
def test_datacenter_tables_in_a_sql_script(dialect: str, tmp_path: Path) -> None:
    """``alembic upgrade head --sql`` / ``downgrade --sql`` of a project whose revision calls
    ``op.create_datacenter_tables`` write the tier's DDL for the script's dialect."""
    project = tier_project(tmp_path, "tickets_eu")
    up = run_alembic(project, "upgrade", "head", "--sql", url=OFFLINE_URLS[dialect])
    assert up.returncode == 0, up.stderr
    stock, state, stamps, register = _tier_ddl(dialect, "tickets_eu")
    assert stock.startswith("CREATE TABLE IF NOT EXISTS tickets_eu__stock (")
    assert state.startswith("CREATE TABLE IF NOT EXISTS tickets_eu__state (")
    # Where the tier records its identity and its upstream lanes' marks.
    assert stamps.startswith("CREATE TABLE IF NOT EXISTS tickets_stamps (")
    assert _written(stamps, up.stdout)
    assert _written(stock, up.stdout) and _written(state, up.stdout)
    assert f"{register};" in up.stdout  # the tier registered, which keeps the stamp table
    assert up.stdout.index("tickets_eu__stock") < up.stdout.index("tickets_eu__state")
    if dialect in ("mysql", "mariadb"):
        assert "ENGINE=InnoDB" in stock  # row locks: a take and its state row move together
    down = run_alembic(project, "downgrade", "0001:base", "--sql", url=OFFLINE_URLS[dialect])
    assert down.returncode == 0, down.stderr
    drops = _tier_ddl(dialect, "tickets_eu", drop=True)
    assert drops[:2] == [
        "DROP TABLE IF EXISTS tickets_eu__state",
        "DROP TABLE IF EXISTS tickets_eu__stock",
    ]
    # Then its rows in the stamp table forgotten, and the stamp table dropped where no row
    # is left (SQLite's script cannot say so: tested with the scripts run, backend tests).
    assert all(f"{d};" in down.stdout for d in drops)
    assert "CREATE TABLE" not in down.stdout


def test_datacenter_tables_in_process_offline() -> None:
    for dialect, engine in (("sqlite", ""), ("postgresql", ""), ("mysql", "ENGINE=InnoDB")):
        op, buffer = _ops(dialect)
        op.create_datacenter_tables()  # type: ignore[attr-defined]
        op.drop_datacenter_tables()  # type: ignore[attr-defined]
        sql = buffer.getvalue()
        assert "CREATE TABLE IF NOT EXISTS tickets_dc__stock (" in sql
        assert "CREATE TABLE IF NOT EXISTS tickets_dc__state (" in sql
        assert sql.index("DROP TABLE IF EXISTS tickets_dc__state;") < sql.index(
            "DROP TABLE IF EXISTS tickets_dc__stock;"
        )
        assert engine in sql


@pytest.mark.parametrize(
    "prefix", ["bad-name", "", "1dc", "tickets__photos", "x" * 80, "a b", "dc; DROP TABLE x"]
)
def test_bad_tier_prefix_raises_before_any_sql(prefix: str) -> None:
    op, buffer = _ops("postgresql")
    with pytest.raises(TicketsError):
        op.create_datacenter_tables(table_prefix=prefix)  # type: ignore[attr-defined]
    with pytest.raises(TicketsError):
        op.drop_datacenter_tables(table_prefix=prefix)  # type: ignore[attr-defined]
    assert buffer.getvalue() == ""


def test_datacenter_tables_reverse_and_render() -> None:
    create = CreateDatacenterTablesOp(table_prefix="tickets_eu")
    drop = create.reverse()
    assert isinstance(drop, DropDatacenterTablesOp)
    assert (drop.names.stock, drop.names.state) == ("tickets_eu__stock", "tickets_eu__state")
    assert isinstance(drop.reverse(), CreateDatacenterTablesOp)
    assert drop.reverse().table_prefix == "tickets_eu"
    code = render_python_code(
        ops.UpgradeOps(ops=[CreateDatacenterTablesOp(), create, DropDatacenterTablesOp(), drop])
    )
    lines = [line.strip() for line in code.splitlines() if line.strip().startswith("op.")]
    assert lines == [
        "op.create_datacenter_tables()",
        "op.create_datacenter_tables(table_prefix='tickets_eu')",
        "op.drop_datacenter_tables()",
        "op.drop_datacenter_tables(table_prefix='tickets_eu')",
    ]


def test_include_object_hides_the_default_tier_tables() -> None:
    for name in ("tickets_dc__stock", "tickets_dc__state"):
        assert include_object(None, name, "table", True, None) is False
        assert include_object(None, name, "table", False, object()) is True
    assert include_object(None, "orders__state", "table", True, None) is True


# -- the cut-over: op.sync_ticket_sequence --------------------------------------------------------


def _named_ops(dialect: str) -> tuple[Operations, io.StringIO]:
    """An offline ``op`` configured as ``alembic init``'s env.py configures ``--sql`` runs."""
    buffer = io.StringIO()
    context = MigrationContext.configure(
        dialect_name=dialect,
        opts={"as_sql": True, "output_buffer": buffer, "literal_binds": True},
        dialect_opts={"paramstyle": "named"},
    )
    return Operations(context), buffer


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_sync_ticket_sequence_offline_reads_the_floor_when_the_script_runs(dialect: str) -> None:
    op, buffer = _named_ops(dialect)
    op.sync_ticket_sequence("Photos", "photos", "id")  # type: ignore[attr-defined]
    (statement,) = [s.strip() for s in buffer.getvalue().split(";") if s.strip()]
    assert statement.startswith("UPDATE tickets__photos SET id=")
    # max(id) is read by the database as the script runs, not when it was written.
    assert "SELECT coalesce(max(photos.id), 0)" in statement
    assert "%%" not in statement


def test_sync_of_a_flickr_table_makes_its_row_where_it_starts_without_one() -> None:
    """Flickr's table on MySQL/MariaDB has no row until the first REPLACE INTO: an UPDATE alone
    would move nothing. The other backends seed it when they create it."""
    op, buffer = _named_ops("mysql")
    op.sync_ticket_sequence(None, "photos", "id")  # type: ignore[attr-defined]
    insert, update = [s.strip() for s in buffer.getvalue().split(";") if s.strip()]
    assert insert == "INSERT IGNORE INTO `Tickets64` (stub) VALUES ('a')"
    assert update.startswith("UPDATE `Tickets64` SET id=")
    for dialect in ("sqlite", "postgresql"):
        op, buffer = _named_ops(dialect)
        op.sync_ticket_sequence(None, "photos", "id", bits=32)  # type: ignore[attr-defined]
        assert buffer.getvalue().strip().startswith('UPDATE "Tickets32" SET id=')


def test_sync_ticket_sequence_render_reverse_and_diff() -> None:
    sync = SyncTicketSequenceOp("photos", "photos", "id")
    legacy = SyncTicketSequenceOp(None, "legacy", "pk", bits=32)
    code = render_python_code(ops.UpgradeOps(ops=[sync, legacy]))
    lines = [line.strip() for line in code.splitlines() if line.strip().startswith("op.")]
    assert lines == [
        "op.sync_ticket_sequence('photos', 'photos', 'id')",
        "op.sync_ticket_sequence(None, 'legacy', 'pk', bits=32)",
    ]
    # Irreversible: its reverse writes nothing, so a downgrade with nothing else gets `pass`.
    downgrade = render_python_code(ops.UpgradeOps(ops=[sync]).reverse())
    assert "op." not in downgrade and "pass" in downgrade
    assert ops.UpgradeOps(ops=[sync]).as_diffs() == [
        ("sync_ticket_sequence", sync.ticket_table, "photos", "id")
    ]
    with pytest.raises(TicketsError):
        SyncTicketSequenceOp("photos", "photos; DROP TABLE x", "id")


def test_an_embedded_sync_attaches_the_sibling_file_on_sqlite_only() -> None:
    """``embedded=True``: on SQLite the embedded default's ticket table is in the ``-tickets``
    sibling file, which the script attaches (found by the database as the script runs), makes
    the table in where missing, moves, and detaches; elsewhere it is the migrated database's,
    and the script is the plain sync's."""
    op, buffer = _named_ops("sqlite")
    op.sync_ticket_sequence("photos", "photos", "id", embedded=True)  # type: ignore[attr-defined]
    statements = [s.strip() for s in buffer.getvalue().split(";\n") if s.strip()]
    assert statements[0].startswith("ATTACH DATABASE (SELECT CASE WHEN file = '' THEN")
    assert statements[0].endswith(
        "FROM pragma_database_list WHERE name = 'main') AS tickets_embedded"
    )
    assert statements[1].startswith("CREATE TABLE IF NOT EXISTS tickets_embedded.tickets_stamps")
    assert statements[2].startswith("CREATE TABLE IF NOT EXISTS tickets_embedded.tickets__photos")
    assert statements[3].startswith("INSERT OR IGNORE INTO tickets_embedded.tickets__photos")
    assert statements[4].startswith("INSERT OR IGNORE INTO tickets_embedded.tickets_stamps")
    assert statements[5].startswith("UPDATE tickets_embedded.tickets__photos SET id=")
    assert "SELECT coalesce(max(photos.id), 0)" in statements[5]
    assert statements[6:] == ["DETACH DATABASE tickets_embedded"]
    for dialect in ("postgresql", "mysql"):
        plain, embedded = _named_ops(dialect), _named_ops(dialect)
        plain[0].sync_ticket_sequence("photos", "photos", "id")  # type: ignore[attr-defined]
        embedded[0].sync_ticket_sequence("photos", "photos", "id", embedded=True)  # type: ignore[attr-defined]
        assert embedded[1].getvalue() == plain[1].getvalue()
    code = render_python_code(ops.UpgradeOps(ops=[
        SyncTicketSequenceOp("photos", "photos", "id", bits=32, embedded=True)]))
    assert "op.sync_ticket_sequence('photos', 'photos', 'id', bits=32, embedded=True)" in code
    with pytest.raises(TicketsError):
        SyncTicketSequenceOp("photos", "photos", "id", embedded="yes")  # type: ignore[arg-type]


def test_cutover_example_offline() -> None:
    sql = offline("postgresql-cutover", "upgrade", "head", url=OFFLINE_URLS["postgresql"])
    assert "UPDATE tickets__photos SET id=" in sql
    assert "SELECT coalesce(max(photos.id), 0)" in sql


# -- imports of the package's column types in rendered scripts ------------------------------------


def _autogen_context(**opts: Any) -> AutogenContext:
    """A context as ``context.configure(**opts)`` in env.py makes it (with its defaults)."""
    defaults = {
        "alembic_module_prefix": "op.", "sqlalchemy_module_prefix": "sa.",
        "user_module_prefix": None,
    }
    context = MigrationContext.configure(dialect_name="postgresql", opts={**defaults, **opts})
    return AutogenContext(context, autogenerate=False)


def _add_column(type_: sa.types.TypeEngine[Any]) -> ops.AddColumnOp:
    return ops.AddColumnOp("photos", sa.Column("x", type_))


def test_type_imports() -> None:
    autogen_context = _autogen_context()
    add_type_imports(autogen_context)
    add_type_imports(autogen_context)  # a second autogenerate run on the same context
    assert "sqlalchemy_tickets.UUID7()" in render_op_text(autogen_context, _add_column(UUID7()))
    assert autogen_context.imports == {"import sqlalchemy_tickets"}
    # SQLAlchemy's own types need nothing more.
    autogen_context.imports.clear()
    render_op_text(autogen_context, _add_column(sa.BigInteger()))
    assert autogen_context.imports == set()


def test_type_imports_leave_the_projects_own_rendering_alone() -> None:
    def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | bool:
        if type_ == "type" and isinstance(obj, TicketId):
            autogen_context.imports.add("from app import types")
            return "types.Ticket()"
        return False

    autogen_context = _autogen_context(render_item=render_item)
    add_type_imports(autogen_context)
    assert "types.Ticket()" in render_op_text(autogen_context, _add_column(TicketId("photos")))
    assert autogen_context.imports == {"from app import types"}
    render_op_text(autogen_context, _add_column(PrefixedId("post")))  # not rendered by the hook
    assert "import sqlalchemy_tickets" in autogen_context.imports

    # With user_module_prefix, Alembic writes the project's prefix: its import is the project's.
    autogen_context = _autogen_context(user_module_prefix="mytypes.")
    add_type_imports(autogen_context)
    assert "mytypes.UUID7()" in render_op_text(autogen_context, _add_column(UUID7()))
    assert autogen_context.imports == set()


# -- the plugin --------------------------------------------------------------------------------


def test_the_plugin_is_published_under_its_name() -> None:
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert f'"{plugin.NAME}" = "{plugin.__name__}"' in text
    published = {e.name: e.value for e in entry_points(group="alembic.plugins")}
    assert published.get(plugin.NAME) == plugin.__name__
    plugin.register()  # again: nothing happens twice
    # Alembic 1.18.0 to 1.19.1 iterate what the entry point names, later ones want a module.
    assert isinstance(plugin, types.ModuleType) and list(plugin) == [plugin]


@pytest.mark.parametrize(
    "first",
    ["import alembic", "import sqlalchemy_tickets.alembic", "import sqlalchemy_tickets"],
)
def test_the_operations_are_registered_whatever_is_imported_first(first: str) -> None:
    """Alembic loads its plugins half-way through its own import: neither order may trip on a
    half-imported module, and Alembic alone (>= 1.18) brings the operations."""
    code = (
        f"{first}\n"
        "import alembic\n"
        "from alembic.operations import Operations\n"
        "import importlib.util\n"
        "if importlib.util.find_spec('alembic.runtime.plugins') is None:\n"
        "    import sqlalchemy_tickets.alembic  # Alembic < 1.18: the manual set-up\n"
        "for name in ('create_ticket_table', 'drop_ticket_table', 'sync_ticket_sequence'):\n"
        "    assert hasattr(Operations, name), name\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/"
    )
    assert result.returncode == 0, result.stderr
