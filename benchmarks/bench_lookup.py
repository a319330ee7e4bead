"""``lookup(session, value)`` against ``session.get(Model, value)`` alone, side by side.

What ``lookup`` adds to the ``session.get`` it ends in: a type check, a dict lookup of the
prefix (the prefix -> class map is built when mappers are configured, not per call) and one
regex match of the whole id. The model: ``mapped_column(PrefixedId("post"), primary_key=True)``
plus a ``String(50)``. Two cases:

* ``hit``: every object is already in the session's identity map, so neither sends SQL and the
  fixed cost of ``lookup`` (about 1 µs where an identity-map ``session.get`` takes 3) is the
  largest share of the call it will ever be. It does not depend on the backend: measured on the
  first backend chosen. Target: lookup / get <= 1.5.
* ``load``: the identity map is emptied before each call, so each is one ``SELECT`` by primary
  key, on every backend chosen. Target: lookup / get <= 1.05.

Each run makes ``N`` calls over ``N`` distinct ids (hit: 20,000; load: 1,000; ``--smoke``: 50).
The reported figure is the median of per-round time ratios; the ratio of the client process's
CPU time over the same runs (``cpu_median``) is beside it, steadier on a busy machine.

    .venv/bin/python benchmarks/bench_lookup.py [--smoke] [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import sys
from typing import Any

import _common as h
import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from sqlalchemy_tickets import PrefixedId, lookup

NAME = "bench_lookup"
TARGETS = {"hit": 1.5, "load": 1.05}
SIZES = {"hit": 20_000, "load": 1_000}


class Base(DeclarativeBase):
    pass


class Post(Base):
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

    return [
        h.Variant("lookup", run_lookup, setup, Session.close, per=len(ids)),
        h.Variant("get", run_get, setup, Session.close, per=len(ids)),
    ]


def run_backend(args: Any, backend: str, with_hits: bool) -> dict[str, Any]:
    hit_n, load_n = (50, 50) if args.smoke else (SIZES["hit"], SIZES["load"])
    with h.throwaway_database(backend) as url:
        h.log(f"[{backend}] {h.redact(url)}")
        engine = sa.create_engine(url)
        try:
            Base.metadata.create_all(engine)
            new_id = Post.__table__.c.id.type.new_id
            ids = [new_id() for _ in range(max(hit_n, load_n))]
            with engine.begin() as conn:
                conn.execute(Post.__table__.insert(), [{"id": i, "title": i} for i in ids])
            result: dict[str, Any] = {"server": h.server_info(backend, url)}
            if with_hits:
                with Session(engine) as session:
                    held = [session.get(Post, value) for value in ids[:hit_n]]  # kept: the map
                    timings = h.interleave(  # holds objects only weakly
                        hit_variants(session, ids[:hit_n]), h.rounds(args, 15), label="hit "
                    )
                    assert len(held) == hit_n
                result["hit"] = {
                    "ratio": h.ratio_summary(timings, "lookup", "get", TARGETS["hit"]),
                    "median_us_per_call": {n: timings.median(n) * 1e6 for n in timings.seconds},
                    **timings.to_json(),
                }
            timings = h.interleave(
                load_variants(engine, ids[:load_n]), h.rounds(args, 15), label=f"{backend} load "
            )
            result["load"] = {
                "ratio": h.ratio_summary(timings, "lookup", "get", TARGETS["load"]),
                "median_us_per_call": {n: timings.median(n) * 1e6 for n in timings.seconds},
                **timings.to_json(),
            }
        finally:
            engine.dispose()
    return result


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    env = h.environment()
    results = {
        backend: run_backend(args, backend, with_hits=i == 0)
        for i, backend in enumerate(args.backends)
    }
    checks = {
        f"{backend} {case} lookup/get": result[case]["ratio"]
        for backend, result in results.items()
        for case in ("hit", "load")
        if case in result
    }
    rows = {key.replace(" lookup/get", ""): check for key, check in checks.items()}
    times = {
        f"{backend} {case}: {name}": us
        for backend, result in results.items()
        for case in ("hit", "load")
        if case in result
        for name, us in result[case]["median_us_per_call"].items()
    }
    fig, (left, right) = h.figure(2, "lookup(session, id) vs session.get(Model, id)", env)
    h.ratio_panel(
        left, rows, f"lookup / get; targets: hit <= {TARGETS['hit']}, load <= {TARGETS['load']}"
    )
    h.value_panel(right, times, "median time per call", "µs", log_scale=True)
    right.set_xlim(right=max(times.values()) * 20)  # room for the labels of the longest bars
    for key, check in checks.items():
        h.log(f"  {key}: client CPU-time ratio {check['cpu_median']:.3f}")
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"calls_per_run": {"hit": SIZES["hit"], "load": SIZES["load"]}},
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
