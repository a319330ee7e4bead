"""The TypeID spec's own test vectors (tests/data/typeid, copied from jetify-com/typeid).

Every valid TypeID is read by ``parse_prefixed`` to its prefix and UUID, written back from the
UUID to the same string, and accepted and stored by a ``PrefixedId(prefix, format="typeid")``
column. Every invalid one is refused by ``parse_prefixed``, by such a column and by ``lookup``,
before any SQL is sent. (The same on PostgreSQL and MariaDB: tests/backend/test_lookup.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import PrefixedId, TicketsError, lookup
from sqlalchemy_tickets.generators import PrefixedIdGenerator, parse_prefixed
from sqlalchemy_tickets.generators.prefixed import from_uuid
from support.typeid_spec import INVALID, VALID


def test_the_vendored_files_are_complete() -> None:
    assert len(VALID) == 9 and len(INVALID) == 21
    assert all(set(v) == {"name", "typeid", "prefix", "uuid"} for v in VALID)
    assert all(set(v) == {"name", "typeid", "description"} for v in INVALID)
    assert "max-valid" in {v["name"] for v in VALID}


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_typeids_parse_to_their_prefix_and_uuid(vector: dict[str, str]) -> None:
    parts = parse_prefixed(vector["typeid"])
    assert parts.prefix == vector["prefix"]
    assert parts.uuid == uuid.UUID(vector["uuid"])
    assert from_uuid(vector["prefix"], uuid.UUID(vector["uuid"])) == vector["typeid"]
    column = PrefixedId(vector["prefix"], format="typeid")
    assert column.process_bind_param(vector["typeid"], sa.create_engine("sqlite://").dialect) == (
        vector["typeid"]
    )


def test_max_valid_parses_and_says_its_time_is_beyond_datetime() -> None:
    # Was: ValueError("year 10889 is out of range") from parse_prefixed itself.
    parts = parse_prefixed("7zzzzzzzzzzzzzzzzzzzzzzzzz")
    assert parts.timestamp_ms == 2**48 - 1 and parts.value == 2**128 - 1
    with pytest.raises(TicketsError, match="timestamp_ms"):
        parts.time  # noqa: B018
    assert parse_prefixed("post_01h455vb4pex5vsknk084sn02q").time.year == 2023


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_typeids_are_refused_by_the_parser(vector: dict[str, str]) -> None:
    with pytest.raises(TicketsError):
        parse_prefixed(vector["typeid"])


def test_the_typeid_library_agrees_with_the_vectors() -> None:
    typeid = pytest.importorskip("typeid")
    for vector in VALID:
        parsed = typeid.TypeID.from_string(vector["typeid"])
        assert str(parsed.uuid) == vector["uuid"]


def test_a_typeid_column_without_a_prefix_generates_bare_typeids() -> None:
    column = PrefixedId("", format="typeid")
    value = column.new_id()
    assert len(value) == 26 and "_" not in value
    assert parse_prefixed(value).uuid.version == 7
    assert column.length == 26
    with pytest.raises(TicketsError, match="only with format='typeid'"):
        PrefixedId("")
    with pytest.raises(TicketsError, match="only with format='typeid'"):
        PrefixedIdGenerator("")
    with pytest.raises(TicketsError, match="'prefix' id, not a TypeID without a prefix"):
        column.process_bind_param("prefix_01h455vb4pex5vsknk084sn02q", None)  # type: ignore[arg-type]


class Base(DeclarativeBase):
    pass


PREFIXES = sorted({v["prefix"] for v in VALID})
#: One mapped class per prefix of the valid vectors: "", "pre_fix", "prefix".
SPEC_MODELS = {
    prefix: type(
        f"SpecUnit{i}",
        (Base,),
        {
            "__tablename__": f"spec_unit_{i}",
            "__annotations__": {"id": Mapped[str]},
            "id": mapped_column(PrefixedId(prefix, format="typeid"), primary_key=True),
        },
    )
    for i, prefix in enumerate(PREFIXES)
}


@pytest.fixture
def engine() -> Iterator[sa.Engine]:
    engine = sa.create_engine("sqlite://")
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


def test_valid_typeids_are_stored_read_back_and_found_by_lookup(engine: sa.Engine) -> None:
    with Session(engine) as session:
        for vector in VALID:
            session.add(SPEC_MODELS[vector["prefix"]](id=vector["typeid"]))
        session.commit()
    with Session(engine) as session:
        for vector in VALID:
            found = lookup(session, vector["typeid"], registry=Base)
            assert type(found) is SPEC_MODELS[vector["prefix"]]
            assert found.id == vector["typeid"]
            assert parse_prefixed(found.id).uuid == uuid.UUID(vector["uuid"])


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_typeids_are_refused_before_any_sql(
    engine: sa.Engine, vector: dict[str, str]
) -> None:
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    table = SPEC_MODELS["prefix"].__table__
    with engine.connect() as conn:
        with pytest.raises(sa_exc.StatementError) as caught:
            conn.execute(table.insert(), {"id": vector["typeid"]})
        assert isinstance(caught.value.orig, TicketsError)
        with pytest.raises(sa_exc.StatementError):
            conn.execute(sa.select(table).where(table.c.id == vector["typeid"]))
    with Session(engine) as session:
        session.add(SPEC_MODELS["prefix"](id=vector["typeid"]))
        with pytest.raises(TicketsError):
            session.flush()
        session.rollback()
        with pytest.raises(TicketsError, match="known prefixes"):
            lookup(session, vector["typeid"], registry=Base)
    assert statements == []
