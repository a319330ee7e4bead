"""``sqlalchemy-tickets demo``: ticket ids at work on a SQLite file, with nothing configured."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from .columns import TicketId
from .sources.default import embedded_source
from .sources.server import TicketServer


class _Base(DeclarativeBase):
    pass


class Photo(_Base):
    __tablename__ = "photos"
    id: Mapped[int] = mapped_column(TicketId("Photos"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(100))


def run_demo(path: Path) -> int:
    path = path.resolve()
    engine = sa.create_engine(f"sqlite:///{path}")
    _Base.metadata.create_all(engine)
    tickets = embedded_source(engine)
    server = tickets.source
    assert isinstance(server, TicketServer)
    print(f"Application database:             {path}")
    print(f"Ticket tables (embedded default): {server.url.database}")
    print()
    print("  class Photo(Base):")
    print('      id: Mapped[int] = mapped_column(TicketId("Photos"), primary_key=True)')
    print()

    def trips() -> int:
        return int(tickets.stats()["round_trips"])

    with Session(engine) as session:
        before = trips()
        photos = [Photo(title=f"sunset #{i}") for i in range(5)]
        session.add_all(photos)
        print(f"5 new photos, ids before flush  -> {[p.id for p in photos]}")
        session.flush()
        print(f"flush                           -> ids {[p.id for p in photos]} "
              f"({trips() - before} ticket round trip(s))")
        before = trips()
        more = [Photo(title=f"beach #{i}") for i in range(3)]
        session.add_all(more)
        session.flush()
        print(f"second flush, same transaction  -> ids {[p.id for p in more]} "
              f"({trips() - before} round trip(s))")
        session.commit()

    with Session(engine) as session:
        lost = Photo(title="never saved")
        session.add(lost)
        session.flush()
        session.rollback()
        print(f"flush, then rollback            -> id {lost.id} is burned, never issued again")

    before = trips()
    with engine.begin() as conn:
        newest = conn.scalar(sa.select(sa.func.max(Photo.id)))
        conn.execute(sa.insert(Photo), [{"title": f"bulk #{i}"} for i in range(1000)])
    with Session(engine) as session:
        bulk = session.scalars(
            sa.select(Photo.id).where(Photo.id > newest).order_by(Photo.id)
        ).all()
        total = session.scalar(sa.select(sa.func.count()).select_from(Photo))
    print(f"Core executemany of 1000 rows   -> ids {bulk[0]}..{bulk[-1]} "
          f"({trips() - before} round trip(s))")
    print()
    stats = tickets.stats()
    print(f"{total} photos in {path.name}; {stats['issued']} ids issued in "
          f"{stats['round_trips']} ticket round trips this run.")
    burned = tickets.close()
    given_back = tickets.stats()["given_back"]
    print(f"Closing the cache gave {given_back} ids it held back to the ticket table "
          f"({burned} burned).")
    print("Run it again: the Photos sequence carries on from the first id not used.")
    server.close()
    engine.dispose()
    return 0
