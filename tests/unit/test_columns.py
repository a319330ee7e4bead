"""How TicketId columns get their defaults (no database needed)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from sqlalchemy_tickets import TicketId


class Base(DeclarativeBase):
    pass


class Photo(Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("Photos"), primary_key=True)


class Comment(Base):
    __tablename__ = "comments"
    id: Mapped[int] = mapped_column(TicketId("Comments", bits=32), primary_key=True)
    photo_id: Mapped[int] = mapped_column(sa.ForeignKey("photos.id"))
    own: Mapped[int] = mapped_column(TicketId("Other"), default=lambda: 7)


def test_mapped_column_gets_a_default() -> None:
    assert Photo.__table__.c.id.default is not None
    assert Photo.__table__.c.id.default.is_callable


def test_core_column_gets_a_default() -> None:
    table = sa.Table("t", sa.MetaData(), sa.Column("id", TicketId("T"), primary_key=True))
    assert table.c.id.default is not None and table.c.id.default.is_callable


def test_foreign_keys_borrowing_the_type_mint_nothing() -> None:
    assert Comment.__table__.c.photo_id.default is None


def test_a_users_own_default_wins() -> None:
    default = Comment.__table__.c.own.default
    assert default is not None and default.arg(None) == 7  # type: ignore[union-attr]


def test_ddl_is_a_plain_integer_key() -> None:
    from sqlalchemy.dialects import mysql, postgresql

    pg = str(sa.schema.CreateTable(Photo.__table__).compile(dialect=postgresql.dialect()))
    my = str(sa.schema.CreateTable(Comment.__table__).compile(dialect=mysql.dialect()))
    assert "id BIGINT NOT NULL" in pg and "SERIAL" not in pg
    assert "id INTEGER NOT NULL" in my and "AUTO_INCREMENT" not in my
