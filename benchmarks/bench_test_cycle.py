"""An application's test cycle on one database kept for the run (microblog-api, the FastAPI
template): a new engine, ``create_all``, 20 rows of two models, ``drop_all``, the ticket tables
reset (``drop_ticket_tables``), ``dispose()`` — two ``TicketId`` models on the embedded default
vs the same models with auto-increment keys. Target: tickets / auto-increment <= 1.5.

    .venv/bin/python benchmarks/bench_test_cycle.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

import sys
from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import TicketId, drop_ticket_tables

NAME, TARGET, ROWS = "bench_test_cycle", 1.5, 10  # rows of each model


def models(key: Any) -> sa.MetaData:
    """A user and a post model whose keys are ``key()`` columns, on a metadata of their own."""

    class Base(DeclarativeBase):
        pass

    class User(Base):
        __tablename__ = "cycle_users"
        id: Mapped[int] = mapped_column(key("cycle_users"), primary_key=True)
        name: Mapped[str] = mapped_column(sa.String(40))

    class Post(Base):
        __tablename__ = "cycle_posts"
        id: Mapped[int] = mapped_column(key("cycle_posts"), primary_key=True)
        user_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey(User.id))

    def cycle(url: sa.URL) -> None:
        engine = sa.create_engine(url)
        Base.metadata.create_all(engine)
        with Session(engine) as session:
            users = [User(name=f"u{i}") for i in range(ROWS)]
            session.add_all(users)
            session.flush()
            session.add_all(Post(user_id=u.id) for u in users)
            session.commit()
        Base.metadata.drop_all(engine)
        if isinstance(Base.metadata.tables["cycle_users"].c.id.type, TicketId):
            drop_ticket_tables(Base.metadata, engine)
        engine.dispose()

    Base.metadata.info["cycle"] = cycle
    return Base.metadata


KEYS = {"tickets": lambda name: TicketId(name),
        "autoinc": lambda name: sa.BigInteger().with_variant(sa.Integer(), "sqlite")}


def run_backend(args: Any, backend: str) -> dict[str, Any]:
    with h.throwaway_database(backend) as url:
        variants = [h.Variant(name, lambda _, c=models(key).info["cycle"]: c(url))
                    for name, key in KEYS.items()]
        timings = h.interleave(variants, h.rounds(args, 41), label=f"{backend} ")
    return {"ratios": {"tickets/autoinc": h.ratio_summary(timings, "tickets", "autoinc",
                                                          TARGET)},
            **timings.to_json()}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql", "mysql", "sqlite"))
    return h.report(args, NAME, {b: run_backend(args, b) for b in args.backends},
                    title=f"A test's cycle: create_all, {2 * ROWS} rows, drop_all, reset, dispose",
                    parameters={"rows": 2 * ROWS, "target": TARGET})


if __name__ == "__main__":
    sys.exit(main())
