"""What the retry and timeout tests share: models whose ids come from a ticket server, and a
real database behind the real TCP proxy, its tickets taken straight from the server (the faults
are for the application's connection)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from sqlalchemy_tickets import TicketId, TicketServer, configure
from support.proxy import TcpProxy

#: The backends whose wire protocol the proxy's faults are written for.
BACKENDS = ("postgresql", "mysql")
ASYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+aiomysql"}
# The COMMIT itself on the wire, not "SET AUTOCOMMIT" at connect: PostgreSQL's simple query is
# NUL-terminated; MySQL's COM_QUERY starts with the command byte 0x03.
COMMIT = {"postgresql": b"COMMIT\x00", "mysql": b"\x03COMMIT"}


class Base(DeclarativeBase):
    pass


class Parent(Base):
    __tablename__ = "parents"
    id: Mapped[int] = mapped_column(TicketId("parents"), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(40))
    children: Mapped[list[Child]] = relationship(back_populates="parent")


class Child(Base):
    __tablename__ = "children"
    id: Mapped[int] = mapped_column(TicketId("children"), primary_key=True)
    parent_id: Mapped[int] = mapped_column(sa.ForeignKey("parents.id"))
    label: Mapped[str] = mapped_column(sa.String(40), default="")
    parent: Mapped[Parent] = relationship(back_populates="children")


class Member(Base):
    __tablename__ = "members"
    id: Mapped[int] = mapped_column(TicketId("members"), primary_key=True)
    email: Mapped[str] = mapped_column(sa.String(40), unique=True)


@contextmanager
def behind_proxy(url: str, metadata: sa.MetaData = Base.metadata) -> Iterator[TcpProxy]:
    """The tables of ``metadata`` (default: the models above) created in the database ``url``,
    a :class:`TicketServer` on it configured as the default source, and a proxy in front of its
    server (``proxy.url(url)`` reaches the database through it). Everything is undone on exit."""
    direct = sa.create_engine(url)
    try:
        metadata.create_all(direct)
    finally:
        direct.dispose()
    tickets = TicketServer(url)
    configure(tickets)
    target = sa.engine.make_url(url)
    try:
        with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
            yield proxy
    finally:
        configure(None)
        tickets.close()
