"""Soak: two datacenters' worker processes insert rows through the ORM for minutes while
workers are SIGKILLed and restarted, each datacenter's link to the global pair is cut, and a
global ticket database crashes and comes back.

Layout: a global pair ``TicketServers([a, b])`` — ``a`` a private MariaDB server started for the
soak (so that it can be SIGKILLed and restarted), ``b`` a database on the shared PostgreSQL —
and two datacenters, ``dc0`` a database on the shared PostgreSQL and ``dc1`` one on the shared
MariaDB, each holding a ``DatacenterTier``'s stock and the application's table ``soak_rows``.
Each datacenter reaches the pair through a TCP proxy of its own per server (the test suite's,
``tests/support/proxy.py``). ``--workers`` processes per datacenter (default 4: 8 in all) each
``configure(CachedSource(DatacenterTier(dc, upstream=pair)))`` and commit two rows every 0.2 s
(10 rows/s) through ``Session``; after each commit a worker appends the committed ids to a log
file of its own, and each failed insert, and once a second what its cache holds.

Over ``--duration`` seconds (default 300; ``--smoke`` 10): a random worker SIGKILLed and started
again every twelfth of the run; ``dc0``'s link cut from 20 % of the run, ``dc1``'s from 50 %, for
15 % of the run each (first refused, then hung); the private ticket server SIGKILLed at 75 % and
started again 5 s later. Then every worker stops cleanly (its cache gives its ids back).

Reported: rows written; duplicates (ids in both datacenters' tables, and inserts refused as a
duplicate key; target 0); rows lost (ids a worker logged as committed that are not in the
database; target 0); failed inserts, and those while the datacenter's stock still held ids (target
0); ids burned (issued by the global pair − rows − growth of the stocks), beside what the killed
workers' caches held. The load average is sampled every 5 s.

    .venv/bin/python benchmarks/soak.py [--smoke] [--duration 300] [--workers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import _common as h
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from sqlalchemy_tickets import (  # noqa: E402
    CachedSource,
    DatacenterTier,
    TicketId,
    TicketServer,
    TicketServers,
    configure,
)
from sqlalchemy_tickets.sources.datacenter import (  # noqa: E402
    create_datacenter_tables,
    describe_datacenter,
)
from support.proxy import TcpProxy  # noqa: E402
from support.servers import start_private_mariadb  # noqa: E402

NAME, SEQ = "soak", "soak"
ROWS_PER_COMMIT, TICK = 2, 0.2


class Base(DeclarativeBase):
    pass


class SoakRow(Base):
    __tablename__ = "soak_rows"
    id: Mapped[int] = mapped_column(TicketId(SEQ), primary_key=True)
    worker: Mapped[int]
    n: Mapped[int]


# -- workers -----------------------------------------------------------------------------------


def _worker(wid: int, dc: str, pair: list[str], log_path: str, stop: Any) -> None:
    """Commit rows until ``stop`` is set; log every commit (``C t id ...``), failure (``F t
    kind``) and, once a second, what the cache holds (``H t held``)."""
    pair_source = TicketServers(pair, backoff=0.5, max_backoff=2.0)
    tier = DatacenterTier(dc, upstream=pair_source)
    cache = CachedSource(tier)
    configure(cache)
    engine = sa.create_engine(dc, pool_pre_ping=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    n, start, beat = 0, time.monotonic(), 0.0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if now - beat >= 1.0:
                s = cache.stats()
                os.write(fd, f"H {now:.3f} {s['in_hand'] + s['in_flight']}\n".encode())
                beat = now
            try:
                with Session(engine) as session:
                    rows = [SoakRow(worker=wid, n=n + i) for i in range(ROWS_PER_COMMIT)]
                    session.add_all(rows)
                    session.commit()
                    ids = " ".join(str(r.id) for r in rows)
                os.write(fd, f"C {time.monotonic():.3f} {ids}\n".encode())
                n += ROWS_PER_COMMIT
            except Exception as error:  # every failure is a finding: logged, counted
                kind = "duplicate" if isinstance(error, sa.exc.IntegrityError) else type(error)
                name = kind if isinstance(kind, str) else kind.__name__
                os.write(fd, f"F {time.monotonic():.3f} {name}\n".encode())
            start += TICK
            time.sleep(max(0.0, start - time.monotonic()))
    finally:
        configure(None)
        burned = cache.close()
        tier.close()
        pair_source.close()
        engine.dispose()
        os.write(fd, f"E {time.monotonic():.3f} {burned}\n".encode())
        os.close(fd)


def read_log(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"commits": [], "failures": [], "held": [], "burned_at_close": None}
    if not path.exists():  # killed before it opened its log
        return out
    for line in path.read_text().splitlines():
        kind, t, *rest = line.split()
        if kind == "C":
            out["commits"].append((float(t), [int(x) for x in rest]))
        elif kind == "F":
            out["failures"].append((float(t), rest[0]))
        elif kind == "H":
            out["held"].append((float(t), int(rest[0])))
        elif kind == "E":
            out["burned_at_close"] = int(rest[0])
    return out


# -- the run -----------------------------------------------------------------------------------


@contextlib.contextmanager
def setup(workdir: Path) -> Iterator[dict[str, Any]]:
    """The private ticket server, the throwaway databases, and two proxies per datacenter.

    Without a MariaDB server binary to start, the first global server is a database on the
    shared MariaDB instead, and the crash is left out (said in the JSON)."""
    with contextlib.ExitStack() as stack:
        try:
            private: Any = start_private_mariadb(workdir / "global_a")
            stack.callback(private.kill)
            admin = sa.create_engine(private.url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.exec_driver_sql("CREATE DATABASE soak_global")
            admin.dispose()
            global_a, no_crash = private.url + "soak_global", None
        except Exception as error:  # no server binary here: no crash either
            private, no_crash = None, f"no private MariaDB server: {error}"
            h.log(f"  {no_crash}; the global server will not be crashed")
            global_a = stack.enter_context(h.throwaway_database("mysql"))
        urls = [stack.enter_context(h.throwaway_database(b)) for b in ("postgresql",) * 2]
        dc1 = stack.enter_context(h.throwaway_database("mysql"))
        first = global_a if isinstance(global_a, str) else global_a.render_as_string(False)
        pair = [first, urls[0].render_as_string(hide_password=False)]
        dcs = [u.render_as_string(hide_password=False) for u in (urls[1], dc1)]
        proxies: list[list[TcpProxy]] = []
        for _ in dcs:
            row = []
            for url in pair:
                u = make_url(url)
                row.append(stack.enter_context(TcpProxy(u.host or "127.0.0.1", int(u.port or 0))))
            proxies.append(row)
        yield {
            "private": private,
            "pair": pair,
            "dcs": dcs,
            "proxies": proxies,
            "no_crash": no_crash,
        }


def prepare(env: dict[str, Any]) -> list[tuple[int, int]]:
    """Tables, the sequence's first contact everywhere; each global server's last id."""
    pair = TicketServers(env["pair"], timeout=30.0)
    try:
        pair.next_id(SEQ)
        pair.next_id(SEQ)
        for dc in env["dcs"]:
            engine = sa.create_engine(dc)
            Base.metadata.create_all(engine)
            engine.dispose()
            create_datacenter_tables(dc, timeout=30.0)
            with DatacenterTier(dc, upstream=pair, timeout=30.0) as tier:
                tier.next_id(SEQ)
                tier.wait_idle(30.0)
    finally:
        pair.close()
    return global_last(env["pair"])


def global_last(pair: Sequence[str]) -> list[tuple[int, int]]:
    out = []
    for url in pair:
        server = TicketServer(url, timeout=30.0)
        try:
            info = server.describe(SEQ)
        finally:
            server.close()
        assert info is not None and info.last_id is not None
        out.append((info.last_id, info.increment))
    return out


def stock(dc: str) -> dict[str, Any]:
    for status in describe_datacenter(dc, timeout=10.0):
        if status.sequence == SEQ:
            return {"stock": status.stock, "rate": status.rate, "runway": status.runway}
    return {"stock": 0, "rate": 0.0, "runway": None}


def run(args: argparse.Namespace, env: dict[str, Any], logs: Path) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    per_dc, duration = args.workers, args.duration
    workers: dict[int, Any] = {}
    paths: list[Path] = []
    dc_of: dict[Path, int] = {}

    def start_worker(slot: int) -> None:
        dc = slot % 2
        path = logs / f"worker{slot}_{len(paths)}.log"
        pair = [p.url(u) for p, u in zip(env["proxies"][dc], env["pair"], strict=True)]
        process = ctx.Process(target=_worker, args=(slot, env["dcs"][dc], pair, str(path), stop))
        process.start()
        workers[slot] = (process, path)
        paths.append(path)
        dc_of[path] = dc

    rng = random.Random(args.seed)
    cut = 0.15 * duration
    events: list[tuple[float, str, Any]] = [
        (0.2 * duration, "cut", 0),
        (0.2 * duration + cut / 2, "hang", 0),
        (0.2 * duration + cut, "restore", 0),
        (0.5 * duration, "cut", 1),
        (0.5 * duration + cut / 2, "hang", 1),
        (0.5 * duration + cut, "restore", 1),
        (0.75 * duration, "crash", None),
        (0.75 * duration + (1.0 if args.smoke else 5.0), "restart", None),
    ]
    kills_at = [0.45] if args.smoke else [k / 12 for k in range(1, 12)]
    events += [(duration * k, "kill", None) for k in kills_at]
    events.sort(key=lambda e: e[0])
    done: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    kills: list[dict[str, Any]] = []
    for slot in range(2 * per_dc):
        start_worker(slot)
    deadline = time.monotonic() + 180
    while not all(p.exists() for p in paths):  # every worker configured: the clock starts
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start within 180 s")
        time.sleep(0.1)
    t0 = time.monotonic()
    next_sample = 0.0
    try:
        while True:
            now = time.monotonic() - t0
            while events and events[0][0] <= now:
                at, what, dc = events.pop(0)
                if what == "kill":
                    slot = rng.randrange(2 * per_dc)
                    process, path = workers[slot]
                    process.kill()
                    process.join(30)
                    kills.append({"t": now, "slot": slot, "log": path.name})
                    start_worker(slot)
                elif what == "cut":
                    for proxy in env["proxies"][dc]:
                        proxy.refuse()
                elif what == "hang":
                    for proxy in env["proxies"][dc]:
                        proxy.hang()
                elif what == "restore":
                    for proxy in env["proxies"][dc]:
                        proxy.forward()
                elif what == "crash" and env["private"] is not None:
                    env["private"].kill()
                elif what == "restart" and env["private"] is not None:
                    env["private"].restart()
                if what in ("crash", "restart") and env["private"] is None:
                    what += " (left out)"
                done.append({"t": now, "event": what, "dc": dc})
                h.log(f"  {now:6.1f} s: {what}{'' if dc is None else f' dc{dc}'}")
            if now >= next_sample:
                samples.append(
                    {
                        "t": now,
                        "load": list(os.getloadavg()),
                        "stock": [stock(dc)["stock"] for dc in env["dcs"]],
                    }
                )
                next_sample += 1.0 if args.smoke else 5.0
            if now >= duration:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        for process, _ in workers.values():
            process.join(60)
            if process.is_alive():
                process.kill()
                process.join(10)
    return {
        "t0": t0,
        "events": done,
        "kills": kills,
        "samples": samples,
        "paths": paths,
        "dc_of": dc_of,
    }


def analyse(
    env: dict[str, Any], base: list[tuple[int, int]], stock0: list[int], outcome: dict[str, Any]
) -> dict[str, Any]:
    t0 = outcome["t0"]
    logs = {p: read_log(p) for p in outcome["paths"]}
    in_db: list[set[int]] = []
    for dc in env["dcs"]:
        engine = sa.create_engine(dc)
        with engine.connect() as conn:
            in_db.append({int(i) for i in conn.scalars(sa.select(SoakRow.id))})
        engine.dispose()
    logged = [set(), set()]  # type: list[set[int]]
    for path, log in logs.items():
        for _, ids in log["commits"]:
            logged[outcome["dc_of"][path]].update(ids)
    lost = sum(len(logged[d] - in_db[d]) for d in range(2))
    across = len(in_db[0] & in_db[1])
    # Failed inserts, and those while the datacenter's stock held ids (its latest sample).
    failures = [
        (t - t0, kind, outcome["dc_of"][p])
        for p, log in logs.items()
        for t, kind in log["failures"]
    ]
    samples = outcome["samples"]

    def stock_at(t: float, dc: int) -> int:
        before = [s for s in samples if s["t"] <= t]
        return int(before[-1]["stock"][dc]) if before else 1

    with_runway = [f for f in failures if stock_at(f[0], f[2]) > 0]
    last = global_last(env["pair"])
    issued = sum((now - b) // step for (now, step), (b, _) in zip(last, base, strict=True))
    stocks = [stock(dc)["stock"] for dc in env["dcs"]]
    rows = len(in_db[0]) + len(in_db[1])
    held_at_kill = []
    for kill in outcome["kills"]:
        log = logs[next(p for p in logs if p.name == kill["log"])]
        held_at_kill.append(log["held"][-1][1] if log["held"] else 0)
    kinds: dict[str, int] = {}
    for _, kind, _ in failures:
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "rows_written": rows,
        "rows_per_datacenter": [len(s) for s in in_db],
        "duplicates": across + kinds.get("duplicate", 0),
        "ids_in_both_datacenters": across,
        "rows_lost": lost,
        "failed_inserts": len(failures),
        "failed_inserts_by_kind": kinds,
        "failed_inserts_while_runway_remained": len(with_runway),
        "ids_burned": issued - rows - (sum(stocks) - sum(stock0)),
        "global_issued": issued,
        "stock_growth": sum(stocks) - sum(stock0),
        "held_by_killed_workers_at_last_heartbeat": held_at_kill,
        "burned_reported_by_clean_closes": sum(
            log["burned_at_close"] or 0 for log in logs.values()
        ),
        "workers_started": len(logs),
        "kills": outcome["kills"],
        "events": outcome["events"],
        "samples": samples,
        "failures": failures,
        "commit_timeline": {
            f"dc{d}": sorted(
                t - t0
                for p, log in logs.items()
                if outcome["dc_of"][p] == d
                for t, _ in log["commits"]
            )
            for d in range(2)
        },
    }


def draw(env: dict[str, Any], res: dict[str, Any], duration: float) -> Any:
    fig, (a1, a2) = h.figure(
        2,
        "Soak: two datacenters, killed workers, cut links, a crashed ticket server",
        env,
        note="counts; see the JSON",
    )
    for d, times in res["commit_timeline"].items():
        a1.plot(times, [ROWS_PER_COMMIT * (i + 1) for i in range(len(times))], label=d)
    spans: dict[Any, float] = {}
    for e in res["events"]:
        if e["event"] in ("cut", "crash"):
            spans[(e["event"], e["dc"])] = e["t"]
        elif e["event"] in ("restore", "restart"):
            key = ("cut", e["dc"]) if e["event"] == "restore" else ("crash", None)
            start = spans.pop(key, None)
            if start is not None:
                color = {0: "tab:blue", 1: "tab:orange", None: "tab:red"}[e["dc"]]
                a1.axvspan(start, e["t"], color=color, alpha=0.15)
    for kill in res["kills"]:
        a1.axvline(kill["t"], color="black", linewidth=0.6, linestyle=":")
    a1.set_xlabel(
        "seconds (shaded: dc0 cut, dc1 cut, global server down; dotted: SIGKILL)", fontsize=8
    )
    a1.set_ylabel("rows committed", fontsize=9)
    a1.set_title(
        f"{res['rows_written']:,} rows, {res['duplicates']} duplicates, "
        f"{res['rows_lost']} lost, {res['failed_inserts']} failed",
        fontsize=10,
    )
    a1.legend(fontsize=8)
    ts = [s["t"] for s in res["samples"]]
    for d in range(2):
        a2.plot(ts, [s["stock"][d] for s in res["samples"]], label=f"dc{d} stock")
    a2.set_xlabel("seconds", fontsize=9)
    a2.set_ylabel("ids in the datacenter's stock", fontsize=9)
    a2.set_title(f"ids burned {res['ids_burned']:,} ({len(res['kills'])} SIGKILLs)", fontsize=10)
    a2.legend(fontsize=8)
    a2.set_xlim(0, duration)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--duration", type=float, default=None, help="seconds (300)")
        parser.add_argument("--workers", type=int, default=None, help="per datacenter (4)")
        parser.add_argument("--seed", type=int, default=1, help="which workers are killed")

    args = h.parse_args(__doc__, argv, extra, backends=("postgresql", "mysql"))
    args.duration = args.duration or (10.0 if args.smoke else 300.0)
    args.workers = args.workers or (2 if args.smoke else 4)
    env_info = h.environment()
    with tempfile.TemporaryDirectory(prefix="tickets_soak_") as tmp, setup(Path(tmp)) as env:
        base = prepare(env)
        stock0 = [stock(dc)["stock"] for dc in env["dcs"]]
        (Path(tmp) / "logs").mkdir()
        outcome = run(args, env, Path(tmp) / "logs")
        results = analyse(env, base, stock0, outcome)
    checks = {
        key: {"median": results[key], "target": 0, "passed": results[key] == 0}
        for key in ("duplicates", "rows_lost", "failed_inserts_while_runway_remained")
    }
    h.log(
        f"rows {results['rows_written']:,}, duplicates {results['duplicates']}, lost "
        f"{results['rows_lost']}, failed {results['failed_inserts']} "
        f"({results['failed_inserts_by_kind']}), burned {results['ids_burned']:,} "
        f"(killed workers held {sum(results['held_by_killed_workers_at_last_heartbeat']):,})"
    )
    return h.report(
        args,
        NAME,
        env=env_info,
        parameters={
            "global_server_crash_left_out": env["no_crash"],
            "duration": args.duration,
            "workers_per_datacenter": args.workers,
            "rows_per_second_per_worker": ROWS_PER_COMMIT / TICK,
            "seed": args.seed,
            "load_average_at_end": list(os.getloadavg()),
        },
        results=results,
        checks=checks,
        figure=draw(env_info, results, args.duration),
    )


if __name__ == "__main__":
    sys.exit(main())
