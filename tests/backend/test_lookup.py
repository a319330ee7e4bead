"""lookup() / async_lookup() on SQLite, PostgreSQL and MariaDB: both formats, inheritance,
identity-map hits without SQL, every bad value refused before SQL, the duplicate-prefix refusal,
and the TypeID spec's vectors stored and found again."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import PrefixedId, TicketsError, async_lookup, lookup
from sqlalchemy_tickets.generators import parse_prefixed
from support import cli
from support.typeid_spec import INVALID, VALID


class Base(DeclarativeBase):
    pass


class Post(Base):
    __tablename__ = "lk_posts"
    id: Mapped[str] = mapped_column(PrefixedId("bk_post"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(40), default="")


class Payment(Base):
    __tablename__ = "lk_payments"
    id: Mapped[str] = mapped_column(PrefixedId("bk_pay", format="typeid"), primary_key=True)
    cents: Mapped[int] = mapped_column(default=0)


class Account(Base):
    __tablename__ = "lk_accounts"
    id: Mapped[str] = mapped_column(PrefixedId("bk_acct"), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(20))
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "account"}


class Business(Account):  # joined-table inheritance
    __tablename__ = "lk_businesses"
    id: Mapped[str] = mapped_column(sa.ForeignKey("lk_accounts.id"), primary_key=True)
    vat: Mapped[str] = mapped_column(sa.String(20), default="")
    __mapper_args__ = {"polymorphic_identity": "business"}


class Personal(Account):  # single-table inheritance
    __mapper_args__ = {"polymorphic_identity": "personal"}


SPEC_MODELS: dict[str, type[Any]] = {
    prefix: type(
        f"SpecBackend{i}",
        (Base,),
        {
            "__tablename__": f"lk_spec_{i}",
            "__annotations__": {"id": Mapped[str]},
            "id": mapped_column(PrefixedId(prefix, format="typeid"), primary_key=True),
        },
    )
    for i, prefix in enumerate(sorted({v["prefix"] for v in VALID}))
}

ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+aiomysql",
}


class Statements:
    """The statements an engine sends."""

    def __init__(self, engine: sa.Engine) -> None:
        self.sent: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.sent.append(statement)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url)
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_both_formats_inheritance_and_identity_map_hits(engine: sa.Engine) -> None:
    with Session(engine) as session:
        objects = [Post(title="hi"), Payment(cents=250), Account(), Business(vat="x"), Personal()]
        session.add_all(objects)
        session.commit()
        ids = {type(o).__name__: o.id for o in objects}
    statements = Statements(engine)
    with Session(engine) as session:
        held = {name: lookup(session, value) for name, value in ids.items()}
        assert {name: type(o).__name__ for name, o in held.items()} == {n: n for n in ids}
        assert held["Post"].title == "hi" and held["Payment"].cents == 250
        assert len(statements.sent) == len(ids)  # one SELECT each
        statements.sent.clear()
        for name, value in ids.items():
            assert lookup(session, value) is held[name]
        assert statements.sent == []  # identity-map hits
        assert lookup(session, Post.__table__.c.id.type.new_id()) is None
        assert lookup(session, Payment.__table__.c.id.type.new_id()) is None
    assert parse_prefixed(ids["Payment"]).uuid.version == 7


BAD_VALUES: list[object] = [
    7,
    None,
    b"bk_post_01h455vb4pex5vsknk084sn02q",
    "",
    "bk_nobody_01h455vb4pex5vsknk084sn02q",
    "bk_post_01h455vb4pex5vsknk084sn02",
    "bk_post_01H455VB4PEX5VSKNK084SN02Q",
    "bk_post_81h455vb4pex5vsknk084sn02q",
    "bk_post_01h455vb4pex5vsknk084sn02q'; DROP TABLE lk_posts; --",
    "bk_post_" + "0" * 10_000,
]


def test_bad_values_are_refused_before_any_sql(engine: sa.Engine) -> None:
    statements = Statements(engine)
    with Session(engine) as session:
        for value in BAD_VALUES:
            with pytest.raises(TicketsError) as caught:
                lookup(session, value)
            assert "bk_post_…" in str(caught.value) and "bk_pay_…" in str(caught.value)
        assert not session.in_transaction()
    assert statements.sent == []


def test_two_classes_claiming_a_prefix_are_refused_before_anything_is_written(
    database_url: str,
) -> None:
    class Broken(DeclarativeBase):
        pass

    class Invoice(Broken):
        __tablename__ = "lk_invoices"
        id: Mapped[str] = mapped_column(PrefixedId("bk_dup"), primary_key=True)

    class CreditNote(Broken):
        __tablename__ = "lk_credit_notes"
        id: Mapped[str] = mapped_column(PrefixedId("bk_dup"), primary_key=True)

    engine = sa.create_engine(database_url)
    statements = Statements(engine)
    try:
        with Session(engine) as session:
            with pytest.raises(TicketsError, match="CreditNote.*Invoice|Invoice.*CreditNote"):
                session.add(Invoice())
        assert statements.sent == []
    finally:
        Broken.registry.dispose()
        engine.dispose()


def test_the_typeid_spec_vectors_round_trip_through_the_database(engine: sa.Engine) -> None:
    with Session(engine) as session:
        session.add_all(SPEC_MODELS[v["prefix"]](id=v["typeid"]) for v in VALID)
        session.commit()
    statements = Statements(engine)
    with Session(engine) as session:
        for vector in VALID:
            found = lookup(session, vector["typeid"], registry=Base)
            assert type(found) is SPEC_MODELS[vector["prefix"]]
            assert parse_prefixed(found.id).uuid == uuid.UUID(vector["uuid"])
        sent = len(statements.sent)
        for vector in INVALID:
            with pytest.raises(TicketsError):
                lookup(session, vector["typeid"], registry=Base)
        assert len(statements.sent) == sent
    with engine.connect() as conn:
        table = SPEC_MODELS["prefix"].__table__
        stored = conn.execute(sa.select(table.c.id).order_by(table.c.id)).scalars().all()
    assert stored == sorted(v["typeid"] for v in VALID if v["prefix"] == "prefix")


def test_async_lookup(backend: str, engine: sa.Engine) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    with Session(engine) as session:
        post, business = Post(title="async"), Business(vat="v")
        session.add_all([post, business])
        session.commit()
        post_id, business_id = post.id, business.id
    url = engine.url.set(drivername=ASYNC_DRIVERS[backend])

    async def main() -> None:
        async_engine = create_async_engine(url)
        statements = Statements(async_engine.sync_engine)
        try:
            async with AsyncSession(async_engine) as session:
                found = await async_lookup(session, post_id)
                assert type(found) is Post and found.title == "async"
                assert type(await async_lookup(session, business_id)) is Business
                assert await async_lookup(session, Payment.__table__.c.id.type.new_id()) is None
                statements.sent.clear()
                assert await async_lookup(session, post_id) is found
                for value in BAD_VALUES:
                    with pytest.raises(TicketsError, match="known prefixes"):
                        await async_lookup(session, value)
                assert statements.sent == []
        finally:
            await async_engine.dispose()

    asyncio.run(main())


# -- the command line: sqlalchemy-tickets lookup ------------------------------------------------

CLI_MODELS = '''
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import PrefixedId


class Base(DeclarativeBase):
    pass


class Ticket(Base):
    __tablename__ = "cli_tickets"
    id: Mapped[str] = mapped_column(PrefixedId("cli_tkt"), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(20))
    subject: Mapped[str] = mapped_column(sa.String(40))
    __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "ticket"}


class Urgent(Ticket):
    __tablename__ = "cli_urgent"
    id: Mapped[str] = mapped_column(sa.ForeignKey("cli_tickets.id"), primary_key=True)
    level: Mapped[int] = mapped_column(default=1)
    __mapper_args__ = {"polymorphic_identity": "urgent"}


class Refund(Base):
    __tablename__ = "cli_refunds"
    id: Mapped[str] = mapped_column(PrefixedId("cli_ref", format="typeid"), primary_key=True)
    cents: Mapped[int]
'''


@pytest.fixture
def cli_models(tmp_path: Path) -> Iterator[Any]:
    """The module ``cli_lookup_models`` in ``tmp_path`` (the console script runs there), also
    loaded here under another name to write the rows; its registry is disposed after."""
    path = tmp_path / "cli_lookup_models.py"
    path.write_text(CLI_MODELS, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(f"cli_models_{uuid.uuid4().hex}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    module.Base.registry.dispose()


def test_cli_lookup_prints_the_row(database_url: str, cli_models: Any, tmp_path: Path) -> None:
    engine = sa.create_engine(database_url)
    cli_models.Base.metadata.create_all(engine)
    with Session(engine) as session:
        plain = cli_models.Ticket(subject="printer on fire")
        urgent = cli_models.Urgent(subject="server on fire", level=3)
        refund = cli_models.Refund(cents=1250)
        session.add_all([plain, urgent, refund])
        session.commit()
        ids = plain.id, urgent.id, refund.id
    engine.dispose()
    base = ["lookup", "--url", database_url, "--models", "cli_lookup_models"]

    done = cli.run(*base, ids[1], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"Urgent {ids[1]}"
    assert {"  subject: server on fire", "  level: 3", "  kind: urgent"} <= set(lines)
    assert done.stderr == ""

    done = cli.run(*base, "--json", ids[2], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row == {
        "class": "cli_lookup_models.Refund",
        "id": ids[2],
        "values": {"id": ids[2], "cents": 1250},
    }

    done = cli.run(*base, "--json", ids[0], cwd=tmp_path)
    assert json.loads(done.stdout)["values"]["subject"] == "printer on fire"

    missing = cli_models.Refund.__table__.c.id.type.new_id()
    done = cli.run(*base, missing, cwd=tmp_path)
    assert done.returncode == 4 and done.stdout == ""
    assert done.stderr.strip() == (
        f"sqlalchemy-tickets: no row has the id {missing} (cli_lookup_models.Refund)"
    )


def _no_traceback(done: Any) -> None:
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr and lines and "error:" in lines[-1], done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cli_tkt_01h455vb4pex5vsknk084sn0"], "not a prefixed id"),
        (["cli_nope_01h455vb4pex5vsknk084sn02q"], "no mapped class has the prefix 'cli_nope'"),
        (["--models", "no_such_module_xyz", "cli_tkt_01h455vb4pex5vsknk084sn02q"],
         "no_such_module_xyz"),
        (["--url", "nosuchdb://x", "cli_tkt_01h455vb4pex5vsknk084sn02q"], "nosuchdb://x"),
        (["--url", "not a url", "cli_tkt_01h455vb4pex5vsknk084sn02q"], "invalid database URL"),
        ([], "ID"),
        (["--timeout", "0", "cli_tkt_01h455vb4pex5vsknk084sn02q"], "--timeout"),
    ],
    ids=["malformed", "unknown-prefix", "unknown-module", "unknown-dialect", "bad-url", "no-id",
         "bad-timeout"],
)
def test_cli_lookup_bad_arguments_exit_2_before_any_io(
    cli_models: Any, tmp_path: Path, args: list[str], message: str
) -> None:
    database = tmp_path / "never.db"
    argv = ["lookup", "--url", f"sqlite:///{database}", "--models", "cli_lookup_models", *args]
    done = cli.run(*argv, cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    _no_traceback(done)
    assert not database.exists()


def test_cli_lookup_without_models_is_a_bad_argument(tmp_path: Path) -> None:
    done = cli.run("lookup", "--url", "sqlite:///x.db", "cli_tkt_01h455vb4pex5vsknk084sn02q",
                   cwd=tmp_path)
    assert done.returncode == 2 and "--models" in done.stderr
    _no_traceback(done)


def test_cli_lookup_failures_exit_1_in_one_line(cli_models: Any, tmp_path: Path) -> None:
    value = cli_models.Ticket.__table__.c.id.type.new_id()
    database = tmp_path / "missing.db"
    done = cli.run("lookup", "--url", f"sqlite:///{database}", "--models", "cli_lookup_models",
                   value, cwd=tmp_path)
    assert done.returncode == 1 and "no SQLite database" in done.stderr, done.stderr
    _no_traceback(done)
    assert not database.exists()  # looking never creates the database

    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    done = cli.run("lookup", "--url", f"postgresql+psycopg://u@127.0.0.1:{port}/db",
                   "--models", "cli_lookup_models", value, cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.startswith("sqlalchemy-tickets: error:")
    _no_traceback(done)
