"""lookup(): the prefix -> class map, its refusals and its registry rules, on SQLite.

The same behaviours on PostgreSQL and MariaDB (and async) are in tests/backend/test_lookup.py.
Every class here is declared in a registry of its own that the test disposes of at the end, so
the prefixes it claims never leak into another test (a prefix claimed by two live registries
is refused by design).
"""

from __future__ import annotations

import ast
import asyncio
import gc
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import PrefixedId, TicketsError, async_lookup, lookup, prefix_lookup
from sqlalchemy_tickets.prefix_lookup import owner_of, prefix_owners

MakeBase = Callable[[], type[DeclarativeBase]]


@pytest.fixture
def make_base() -> Iterator[MakeBase]:
    """``make_base()`` -> a fresh declarative base; every registry made is disposed after."""
    made: list[type[DeclarativeBase]] = []

    def make() -> type[DeclarativeBase]:
        class Base(DeclarativeBase):
            pass

        made.append(Base)
        return Base

    yield make
    for base in made:
        base.registry.dispose()


class Counter:
    """Counts the statements an engine sends."""

    def __init__(self, engine: sa.Engine) -> None:
        self.statements: list[str] = []
        sa.event.listen(engine, "before_cursor_execute", self._record)

    def _record(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements.append(statement)


def _engine(base: type[DeclarativeBase]) -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    base.metadata.create_all(engine)
    return engine


def _models(base: type[DeclarativeBase]) -> tuple[type[Any], type[Any]]:
    class Article(base):  # type: ignore[valid-type,misc]
        __tablename__ = "articles"
        id: Mapped[str] = mapped_column(PrefixedId("ut_article"), primary_key=True)
        title: Mapped[str] = mapped_column(sa.String(50), default="")

    class Receipt(base):  # type: ignore[valid-type,misc]
        __tablename__ = "receipts"
        id: Mapped[str] = mapped_column(PrefixedId("ut_rcpt", format="typeid"), primary_key=True)
        amount: Mapped[int] = mapped_column(default=0)

    return Article, Receipt


def test_loads_each_format_from_its_id_and_none_for_a_missing_row(make_base: MakeBase) -> None:
    base = make_base()
    Article, Receipt = _models(base)
    engine = _engine(base)
    with Session(engine) as session:
        session.add_all([Article(title="hello"), Receipt(amount=12)])
        session.commit()
        article_id = session.scalars(sa.select(Article.id)).one()
        receipt_id = session.scalars(sa.select(Receipt.id)).one()
    with Session(engine) as session:
        article = lookup(session, article_id)
        receipt = lookup(session, receipt_id)
        assert type(article) is Article and article.title == "hello"
        assert type(receipt) is Receipt and receipt.amount == 12
        assert lookup(session, "ut_article_01h455vb4pex5vsknk084sn02q") is None
    assert owner_of(article_id) is Article


def test_identity_map_hit_sends_no_sql(make_base: MakeBase) -> None:
    base = make_base()
    Article, _ = _models(base)
    engine = _engine(base)
    counter = Counter(engine)
    with Session(engine) as session:
        article = Article()
        session.add(article)
        session.commit()
        held = lookup(session, article.id)  # expired by the commit: one SELECT refreshes it
        counter.statements.clear()
        for _ in range(3):
            assert lookup(session, held.id) is held
        assert counter.statements == []


def test_a_class_declared_after_a_lookup_is_found(make_base: MakeBase) -> None:
    base = make_base()
    Article, _ = _models(base)
    engine = _engine(base)
    with Session(engine) as session:
        assert lookup(session, Article.__table__.c.id.type.new_id()) is None

    class Late(base):  # type: ignore[valid-type,misc]
        __tablename__ = "late"
        id: Mapped[str] = mapped_column(PrefixedId("ut_late"), primary_key=True)

    Late.__table__.create(engine)
    with Session(engine) as session:
        late = Late()
        session.add(late)
        session.commit()
        assert lookup(session, late.id) is late


def _hierarchy(base: type[DeclarativeBase]) -> dict[str, type[Any]]:
    class Party(base):  # type: ignore[valid-type,misc]
        __tablename__ = "parties"
        id: Mapped[str] = mapped_column(PrefixedId("ut_party"), primary_key=True)
        kind: Mapped[str] = mapped_column(sa.String(20))
        __mapper_args__ = {"polymorphic_on": "kind", "polymorphic_identity": "party"}

    class Company(Party):  # joined: a table of its own, sharing the key
        __tablename__ = "companies"
        id: Mapped[str] = mapped_column(sa.ForeignKey("parties.id"), primary_key=True)
        vat: Mapped[str] = mapped_column(sa.String(20), default="")
        __mapper_args__ = {"polymorphic_identity": "company"}

    class Person(Party):  # single table
        __mapper_args__ = {"polymorphic_identity": "person"}

    class Employee(Company):  # joined under joined
        __tablename__ = "employees"
        id: Mapped[str] = mapped_column(sa.ForeignKey("companies.id"), primary_key=True)
        __mapper_args__ = {"polymorphic_identity": "employee"}

    return {c.__name__: c for c in (Party, Company, Person, Employee)}


def test_inheritance_returns_the_subclass(make_base: MakeBase) -> None:
    base = make_base()
    classes = _hierarchy(base)
    engine = _engine(base)
    ids = {}
    with Session(engine) as session:
        for name, cls in classes.items():
            obj = cls()
            session.add(obj)
            session.flush()
            ids[name] = obj.id
        session.commit()
    assert list(prefix_owners(registry=base)) == ["ut_party"]  # subclasses claim nothing
    counter = Counter(engine)
    with Session(engine) as session:
        held = {name: lookup(session, value) for name, value in ids.items()}
        assert {name: type(obj).__name__ for name, obj in held.items()} == {
            name: name for name in ids
        }
        counter.statements.clear()
        for name, value in ids.items():
            assert lookup(session, value) is held[name]
        assert counter.statements == []


BAD_VALUES: list[tuple[object, str]] = [
    (12345, "not int"),
    (None, "not NoneType"),
    (b"ut_article_01h455vb4pex5vsknk084sn02q", "not bytes"),
    ("", "not a prefixed id"),
    ("ut_nobody_01h455vb4pex5vsknk084sn02q", "no mapped class has the prefix 'ut_nobody'"),
    ("01h455vb4pex5vsknk084sn02q", "no mapped class has a TypeID without a prefix"),
    ("ut_article_01h455vb4pex5vsknk084sn02", "not a prefixed id"),
    ("ut_article_01h455vb4pex5vsknk084sn02qq", "not a prefixed id"),
    ("ut_article_01H455VB4PEX5VSKNK084SN02Q", "not a prefixed id"),
    ("ut_article_01h455vb4pex5vsknk084sn0ul", "not a prefixed id"),
    ("ut_article_81h455vb4pex5vsknk084sn02q", "more than 128 bits"),
    ("UT_ARTICLE_01h455vb4pex5vsknk084sn02q", "its prefix"),
    ("_ut_article_01h455vb4pex5vsknk084sn02q", "its prefix"),
    ("_01h455vb4pex5vsknk084sn02q", "starts with '_'"),
    ("ut_article_01h455vb4pex5vsknk084sn02q\n", "not a prefixed id"),
    ("ut_article_01h455vb4pex5vsknk084sn02q' OR '1'='1", "not a prefixed id"),
    ("x" * 100_000, "100000 characters"),
]


@pytest.mark.parametrize(
    ("value", "message"), BAD_VALUES, ids=[str(i) for i in range(len(BAD_VALUES))]
)
def test_bad_values_are_refused_before_any_sql_naming_the_known_prefixes(
    make_base: MakeBase, value: object, message: str
) -> None:
    base = make_base()
    models = _models(base)  # held: a registry keeps its classes only weakly
    engine = _engine(base)
    counter = Counter(engine)
    with Session(engine) as session:
        with pytest.raises(TicketsError) as caught:
            # Within this registry: other test modules may map a class for bare TypeIDs.
            lookup(session, value, registry=base)
        assert counter.statements == []
        assert not session.in_transaction()  # nothing began: no connection was even taken
    text = str(caught.value)
    assert models and message in text
    assert "known prefixes:" in text and "ut_article_…" in text and "ut_rcpt_…" in text
    assert len(text) < 1000


def test_a_session_of_the_wrong_kind_is_refused(make_base: MakeBase) -> None:
    base = make_base()
    Article, _ = _models(base)
    with pytest.raises(TicketsError, match="async_lookup"):
        lookup(object(), Article.__table__.c.id.type.new_id())  # type: ignore[arg-type]
    with Session(_engine(base)) as session:
        with pytest.raises(TicketsError, match="use lookup"):
            asyncio.run(async_lookup(session, Article.__table__.c.id.type.new_id()))  # type: ignore[arg-type]


def test_two_classes_of_one_registry_claiming_a_prefix_fail_configuration(
    make_base: MakeBase,
) -> None:
    base = make_base()

    class Invoice(base):  # type: ignore[valid-type,misc]
        __tablename__ = "invoices"
        id: Mapped[str] = mapped_column(PrefixedId("ut_inv"), primary_key=True)

    class Bill(base):  # type: ignore[valid-type,misc]
        __tablename__ = "bills"
        id: Mapped[str] = mapped_column(PrefixedId("ut_inv", format="typeid"), primary_key=True)

    for _ in range(2):  # and again: the registry stays refused, never half configured
        with pytest.raises(TicketsError) as caught:
            base.registry.configure()
        assert "Invoice" in str(caught.value) and "Bill" in str(caught.value)
        assert "'ut_inv'" in str(caught.value)


def test_a_prefix_claimed_in_two_registries_is_refused_at_lookup_unless_one_is_chosen(
    make_base: MakeBase,
) -> None:
    first, second = make_base(), make_base()
    Article, _ = _models(first)
    Other, _ = _models(second)
    engine = _engine(first)
    value = Article.__table__.c.id.type.new_id()
    counter = Counter(engine)
    with Session(engine) as session:
        with pytest.raises(TicketsError, match="claimed in 2 registries") as caught:
            lookup(session, value)
        assert counter.statements == []
        assert "registry=" in str(caught.value)
        assert lookup(session, value, registry=first) is None
        assert lookup(session, value, registry=second.registry) is None
    assert owner_of(value, registry=second) is Other
    with pytest.raises(TicketsError, match="registry= takes"):
        owner_of(value, registry="nope")
    second.registry.dispose()
    assert owner_of(value) is Article  # a disposed registry claims nothing


def test_a_collected_registry_claims_nothing(make_base: MakeBase) -> None:
    first = make_base()
    Article, _ = _models(first)

    def declare_and_drop() -> None:
        class Throwaway(DeclarativeBase):
            pass

        _models(Throwaway)
        Throwaway.registry.configure()

    declare_and_drop()
    gc.collect()
    value = Article.__table__.c.id.type.new_id()
    assert owner_of(value) is Article


def test_concrete_classes_own_their_own_prefixes(make_base: MakeBase) -> None:
    base = make_base()

    class Asset(base):  # type: ignore[valid-type,misc]
        __tablename__ = "assets"
        id: Mapped[str] = mapped_column(PrefixedId("ut_asset"), primary_key=True)

    class Vehicle(Asset):
        __tablename__ = "vehicles"
        id: Mapped[str] = mapped_column(PrefixedId("ut_vehicle"), primary_key=True)
        __mapper_args__ = {"concrete": True}

    engine = _engine(base)
    with Session(engine) as session:
        asset, vehicle = Asset(), Vehicle()
        session.add_all([asset, vehicle])
        session.commit()
        assert lookup(session, vehicle.id) is vehicle
        assert lookup(session, asset.id) is asset
    assert set(prefix_owners(registry=base)) == {"ut_asset", "ut_vehicle"}


def test_async_lookup_on_aiosqlite(make_base: MakeBase, tmp_path: Any) -> None:
    pytest.importorskip("aiosqlite")
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    base = make_base()
    Article, Receipt = _models(base)
    url = f"sqlite+aiosqlite:///{tmp_path / 'lookup.db'}"

    async def main() -> None:
        engine = create_async_engine(url)
        statements: list[str] = []
        sa.event.listen(
            engine.sync_engine, "before_cursor_execute", lambda *a: statements.append(a[2])
        )
        async with engine.begin() as conn:
            await conn.run_sync(base.metadata.create_all)
        async with AsyncSession(engine, expire_on_commit=False) as session:
            article, receipt = Article(title="async"), Receipt(amount=3)
            session.add_all([article, receipt])
            await session.commit()
        async with AsyncSession(engine) as session:
            found = await async_lookup(session, article.id)
            assert type(found) is Article and found.title == "async"
            assert type(await async_lookup(session, receipt.id)) is Receipt
            assert await async_lookup(session, Article.__table__.c.id.type.new_id()) is None
            statements.clear()
            assert await async_lookup(session, article.id) is found
            with pytest.raises(TicketsError, match="known prefixes"):
                await async_lookup(session, "ut_article_oops")
            assert statements == []
        await engine.dispose()

    asyncio.run(main())


def test_lookup_module_imports_the_asyncio_extension_only_for_type_checking() -> None:
    # The asyncio extension (and greenlet) are optional: async_lookup must work by duck typing
    # on the session it is given, importing nothing of them when the module loads.
    tree = ast.parse(Path(prefix_lookup.__file__).read_text(encoding="utf-8"))
    guarded = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
    }
    imported = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in guarded
    ]
    assert imported and not [line for line in imported if "asyncio" in line or "greenlet" in line]


def test_lookup_works_without_the_asyncio_extension_or_greenlet() -> None:
    code = """
import sys
import threading
sys.modules["sqlalchemy.ext.asyncio"] = None  # importing either now raises ImportError
sys.modules["greenlet"] = None
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy_tickets import PrefixedId, lookup, async_lookup

class Base(DeclarativeBase):
    pass

class Note(Base):
    __tablename__ = "notes"
    id: Mapped[str] = mapped_column(PrefixedId("note"), primary_key=True)

engine = sa.create_engine("sqlite://")
Base.metadata.create_all(engine)
with Session(engine) as session:
    note = Note()
    session.add(note)
    session.commit()
    assert lookup(session, note.id) is note
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_lookups_in_threads_while_other_registries_come_and_go(
    make_base: MakeBase, tmp_path: Any
) -> None:
    base = make_base()
    Article, Receipt = _models(base)
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'threads.db'}")
    base.metadata.create_all(engine)
    with Session(engine) as session:
        session.add_all([Article(title=str(i)) for i in range(20)] + [Receipt(amount=1)])
        session.commit()
        ids = list(session.scalars(sa.select(Article.id))) + list(
            session.scalars(sa.select(Receipt.id))
        )
    errors: list[BaseException] = []
    stop = threading.Event()
    started = threading.Barrier(5)

    def reader() -> None:
        try:
            with Session(engine) as session:
                started.wait()
                while not stop.is_set():
                    for value in ids:
                        found = lookup(session, value)
                        assert found is not None and found.id == value
        except BaseException as error:  # reported by the main thread
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for thread in threads:
        thread.start()
    started.wait()
    try:
        for i in range(30):  # registries declared, configured, looked up and disposed meanwhile
            other = make_base()
            model = type(
                f"Churn{i}",
                (other,),
                {
                    "__tablename__": f"churn_{i}",
                    "__annotations__": {"id": Mapped[str]},
                    "id": mapped_column(PrefixedId(f"ut_churn_{'abcdefghij'[i % 10]}"),
                                        primary_key=True),
                },
            )
            assert owner_of(model.__table__.c.id.type.new_id()) is model
            other.registry.dispose()
            if errors:
                break
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    assert not errors, errors[0]
