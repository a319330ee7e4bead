"""The app-side column types without a database: defaults, new_id, repr, validation."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import TicketsError
from sqlalchemy_tickets.columns import UUID7, ObjectId, PrefixedId, SnowflakeId


class Base(DeclarativeBase):
    pass


class Post(Base):
    __tablename__ = "posts"
    id: Mapped[str] = mapped_column(PrefixedId("post"), primary_key=True)
    author_id: Mapped[str] = mapped_column(PrefixedId("user"), sa.ForeignKey("users.id"))


class User(Base):
    __tablename__ = "users"
    id: Mapped[str] = mapped_column(PrefixedId("user"), primary_key=True)


def test_columns_get_a_default_and_foreign_keys_do_not() -> None:
    assert Post.__table__.c.id.default is not None and Post.__table__.c.id.default.is_callable
    assert Post.__table__.c.author_id.default is None
    table = sa.Table(
        "t",
        sa.MetaData(),
        sa.Column("a", SnowflakeId(worker_id=1), primary_key=True),
        sa.Column("b", UUID7()),
        sa.Column("c", ObjectId()),
        sa.Column("d", UUID7(), default=lambda: uuid.UUID(int=7)),  # the user's default wins
    )
    assert all(table.c[name].default is not None for name in "abc")
    assert table.c.d.default.arg(None) == uuid.UUID(int=7)  # type: ignore[union-attr]


def test_new_id_types() -> None:
    assert isinstance(SnowflakeId(worker_id=2).new_id(), int)
    value = UUID7().new_id()
    assert type(value) is uuid.UUID and value.version == 7
    assert PrefixedId("post").new_id().startswith("post_")
    assert len(ObjectId().new_id()) == 24


def test_equal_configurations_share_one_generator() -> None:
    a, b = SnowflakeId(worker_id=11), SnowflakeId(worker_id=11)
    assert a.generator is b.generator
    ids = [a.new_id(), b.new_id(), a.new_id()]
    assert ids == sorted(ids) and len(set(ids)) == 3
    assert PrefixedId("post").generator is PrefixedId("post").generator
    assert PrefixedId("post").generator is not PrefixedId("post", format="typeid").generator


def test_snowflake_without_worker_needs_a_first_insert_for_new_id() -> None:
    column = SnowflakeId()
    with pytest.raises(TicketsError, match="no worker id yet"):
        column.new_id()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"worker_id": 1024}, "worker_id"),
        ({"worker_id": 1, "worker_lease": "sqlite://"}, "not both"),
        ({"worker_id": 1, "timestamp_bits": 45}, "at most 63"),
        ({"worker_id": 1, "epoch": "2020"}, "epoch"),
        ({"worker_id": 1, "max_backward_ms": -1}, "max_backward_ms"),
    ],
)
def test_snowflake_bad_arguments_fail_at_construction(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(TicketsError, match=message):
        SnowflakeId(**kwargs)  # type: ignore[arg-type]


def test_reprs_render_for_alembic() -> None:
    assert repr(SnowflakeId(worker_id=3)) == "SnowflakeId(worker_id=3)"
    assert repr(SnowflakeId(worker_id=3, worker_bits=8, sequence_bits=14)) == (
        "SnowflakeId(worker_id=3, worker_bits=8, sequence_bits=14)"
    )
    # a lease database (with its password) is never rendered
    assert repr(SnowflakeId(worker_lease="postgresql://u:secret@h/db")) == "SnowflakeId()"
    assert repr(UUID7()) == "UUID7()"
    assert repr(PrefixedId("post", format="typeid")) == "PrefixedId('post', format='typeid')"
    assert repr(ObjectId()) == "ObjectId()"
    for type_ in (SnowflakeId, UUID7, PrefixedId, ObjectId):
        assert type_.__module__ == "sqlalchemy_tickets"


def test_statements_with_the_types_are_cacheable() -> None:
    stmt = sa.select(Post).where(Post.id == "post_01hqz4x7j1f3tq6m9r2v8k5n0c")
    key = stmt._generate_cache_key()
    assert key is not None
    other = sa.select(Post).where(Post.id == "post_01hqz4x7j1f3tq6m9r2v8k5n0d")
    assert other._generate_cache_key() == key


def test_like_patterns_are_not_checked_as_ids() -> None:
    stmt = sa.select(Post.id).where(Post.id.like("post_01%"), Post.id.startswith("post_"))
    compiled = stmt.compile()
    assert compiled.params["id_1"] == "post_01%"
    equal = sa.select(Post.id).where(Post.id == "x").compile()
    # an equality binds through PrefixedId, which checks the value when the statement runs
    bind = equal.binds["id_1"]
    assert isinstance(bind.type, PrefixedId)
