"""``lookup(session, value)`` against ``session.get(Model, value)`` alone, side by side.

A ``PrefixedId("post")`` key, 15 rounds: ``hit``, every object in the identity map (first
backend), target lookup / get <= 1.5; ``load``, a ``SELECT`` per call, target <= 1.05.

    .venv/bin/python benchmarks/bench_lookup.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy.orm import Mapped, Session, mapped_column

from sqlalchemy_tickets import PrefixedId, lookup

NAME = "bench_lookup"
TARGETS = {"hit": 1.5, "load": 1.05}
SIZES = {"hit": 20_000, "load": 1_000}


class Post(h.Base):
    __tablename__ = "bench_lookup_posts"
    id: Mapped[str] = mapped_column(PrefixedId("post"), primary_key=True)
    title: Mapped[str] = mapped_column(sa.String(50))


def hit_variants(session: Session, ids: list[str]) -> list[h.Variant]:
    def run_lookup(_: Any) -> None:
        for value in ids:
            lookup(session, value)

    def run_get(_: Any) -> None:
        get = session.get
        for value in ids:
            get(Post, value)

    return [h.Variant("lookup", run_lookup, per=len(ids)), h.Variant("get", run_get, per=len(ids))]


def load_variants(engine: sa.Engine, ids: list[str]) -> list[h.Variant]:
    def setup() -> Session:
        session = Session(engine)
        session.connection()  # checking out the connection is not what is compared
        return session

    def run_lookup(session: Session) -> None:
        for value in ids:
            assert lookup(session, value) is not None
            session.expunge_all()

    def run_get(session: Session) -> None:
        for value in ids:
            assert session.get(Post, value) is not None
            session.expunge_all()

    return [h.Variant("lookup", run_lookup, setup, Session.close, per=len(ids)),
            h.Variant("get", run_get, setup, Session.close, per=len(ids))]


def summary(timings: h.Timings, case: str) -> dict[str, Any]:
    return {"ratio": h.ratio_summary(timings, "lookup", "get", TARGETS[case]),
            **timings.to_json("median_us_per_call", 1e6)}


def run_backend(args: Any, backend: str, with_hits: bool) -> dict[str, Any]:
    hit_n, load_n = (50, 50) if args.smoke else (SIZES["hit"], SIZES["load"])
    with h.throwaway_engine(backend, h.Base.metadata) as engine:
        new_id = PrefixedId("post").new_id
        ids = [new_id() for _ in range(max(hit_n, load_n))]
        with engine.begin() as conn:
            conn.execute(Post.__table__.insert(), [{"id": i, "title": i} for i in ids])
        result: dict[str, Any] = {}
        if with_hits:
            with Session(engine) as session:
                held = [session.get(Post, value) for value in ids[:hit_n]]  # kept: the
                timings = h.interleave(  # identity map holds objects only weakly
                    hit_variants(session, ids[:hit_n]), h.rounds(args, 15), label="hit ")
                assert len(held) == hit_n
            result["hit"] = summary(timings, "hit")
        result["load"] = summary(h.interleave(load_variants(engine, ids[:load_n]),
                                              h.rounds(args, 15), label=f"{backend} load "),
                                 "load")
    return result


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    results = {b: run_backend(args, b, with_hits=i == 0) for i, b in enumerate(args.backends)}
    return h.report(args, NAME, results, parameters={"calls_per_run": SIZES},
                    title="lookup(session, id) vs session.get(Model, id)",
                    values=("median_us_per_call", "median time per call", "µs"))


if __name__ == "__main__":
    raise SystemExit(main())
