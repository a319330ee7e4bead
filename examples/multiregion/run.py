"""Two datacenters, one global pair of ticket servers, a cut link, and a customer moved between
datacenters keeping their keys (HubSpot's VTickets layout, on one machine).

    global pair      TicketServers([odd, even]): two ticket databases, increment 2, offsets 1, 2
        │  (eu1's link goes through a TCP proxy, cut for --cut seconds)
    datacenters      na1 (PostgreSQL) and eu1 (MariaDB), each one database holding the
        │            DatacenterTier's stock of ids and the application's tables
    processes        --workers per datacenter, each inserting through the ORM with
                     configure(CachedSource(DatacenterTier(dc_url, upstream=TicketServers([...]))))

While eu1 cannot reach the global pair, its processes go on inserting from the stock in eu1's
database; no insert may fail in either datacenter. Then a customer of na1 is moved to eu1: their
rows are copied with their keys, which no row of eu1 can already have. Checks: no failed insert,
no key twice in either table across both datacenters, every row a process saw committed stored,
no block reached eu1 from the global pair during the cut, the moved customer's rows in eu1 with
the same keys. Exits with 1 if a check fails.

    python examples/multiregion/run.py                   # throwaway databases on local servers
    python examples/multiregion/run.py --cut 60 --workers 4
    python examples/multiregion/run.py --global URL URL --na1 URL --eu1 URL   # databases you made

Without ``--global``/``--na1``/``--eu1``, databases ``tickets_mr_<hex>`` are created on
``--postgresql`` and ``--mariadb`` and dropped at the end. Given databases must exist; the tables
``customers`` and ``orders`` are dropped and created again, and so is the tiers' stock of an
earlier run. Writes ``multiregion_example.json`` and, with matplotlib installed,
``multiregion_example.png`` to ``--out`` (default: ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import multiprocessing
import queue
import random
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    TicketId,
    TicketServer,
    TicketServers,
    TicketServerUnavailable,
    configure,
)
from sqlalchemy_tickets.sources.datacenter import (
    create_datacenter_tables,
    describe_datacenter,
    drop_datacenter_table_statements,
)

REPO = Path(__file__).resolve().parents[2]
#: Where the figures go by default, beside the benchmarks' (the docs serve the plots from there).
RESULTS = REPO / "benchmarks" / "results"
# The harness comes from the repository, so that there is one of each: the test suite's fault
# proxy (tests/support/proxy.py) and the benchmarks' throwaway databases (benchmarks/_harness.py).
# Appended, not prepended: nothing installed is shadowed by them.
for _harness in (REPO / "tests", REPO / "benchmarks"):
    if str(_harness) not in sys.path:
        sys.path.append(str(_harness))

from _harness import throwaway_database  # noqa: E402

from support.proxy import TcpProxy  # noqa: E402

POSTGRESQL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
MARIADB = "mysql+pymysql://root@127.0.0.1:3306/"
DATACENTERS = ("na1", "eu1")
#: The datacenter whose link to the global pair is cut, and the way a customer moves.
CUT, MOVE_FROM, MOVE_TO = "eu1", "na1", "eu1"
SEQUENCES = ("customers", "orders")
#: One new customer for this many orders.
ORDERS_PER_CUSTOMER = 20
#: Seconds after the cut starts before the tier's refill count is read: a block already past
#: the proxy when the link was cut may still be stored.
SETTLE = 1.0
#: The datacenter tiers' smallest stock (DatacenterTier's default, given explicitly: the moment
#: of the cut is chosen from it) and the share of their target under which they refill.
MIN_BLOCK = 1000
LOW_WATER = 0.5
#: ``--cut-at low`` cuts once the stock is within this factor of the refill mark.
NEAR_LOW = 1.15

log = logging.getLogger("multiregion")


class Base(DeclarativeBase):
    pass


class Customer(Base):
    __tablename__ = "customers"
    id: Mapped[int] = mapped_column(TicketId("customers"), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(60))
    #: The datacenter the customer signed up in.
    home: Mapped[str] = mapped_column(sa.String(8))
    orders: Mapped[list[Order]] = relationship(back_populates="customer")


class Order(Base):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(TicketId("orders"), primary_key=True)
    customer_id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.ForeignKey("customers.id"), index=True
    )
    amount: Mapped[int] = mapped_column(sa.Integer)
    #: Wall clock (Unix ms) of the process that wrote it, just before its commit.
    written_ms: Mapped[int] = mapped_column(sa.BigInteger, index=True)
    written_by: Mapped[str] = mapped_column(sa.String(16))
    customer: Mapped[Customer] = relationship(back_populates="orders")


customers = cast(sa.Table, Customer.__table__)
orders = cast(sa.Table, Order.__table__)


# -- the worker processes ----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSpec:
    name: str
    datacenter: str
    dc_url: str
    #: The global pair as this datacenter reaches it (through the proxy for the cut one).
    global_urls: tuple[str, str]
    rate: float
    supply: float
    seed: int


@dataclass
class WorkerReport:
    name: str
    datacenter: str
    customers: int = 0
    orders: int = 0
    failures: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    tier: dict[str, Any] = field(default_factory=dict)
    cache: dict[str, Any] = field(default_factory=dict)
    burned_at_close: int = 0
    #: Calls that waited for a round trip, after the start (the first contact excluded).
    cache_waits: int = 0
    tier_waits: int = 0


def worker(spec: WorkerSpec, go: Event, stop: Event, reports: Any) -> None:
    """One application process of a datacenter: inserts orders (and now and then a customer)
    through the ORM at ``spec.rate`` rows a second until ``stop``, then reports."""
    logging.basicConfig(
        level=logging.WARNING, format=f"{spec.name} %(levelname)s %(name)s: %(message)s"
    )
    # The line every process of the datacenter runs: global pair → datacenter tier → process.
    upstream = TicketServers(list(spec.global_urls))
    tier = DatacenterTier(spec.dc_url, upstream=upstream, supply=spec.supply,
                          min_block=MIN_BLOCK, low_water=LOW_WATER)
    cache = CachedSource(tier)
    configure(cache)
    engine = sa.create_engine(spec.dc_url, pool_size=2, pool_pre_ping=True)
    report = WorkerReport(spec.name, spec.datacenter)
    rng = random.Random(spec.seed)
    mine: list[int] = []
    errors: Counter[str] = Counter()
    waited: tuple[int, int] | None = None

    def insert(new_customer: bool) -> None:
        with Session(engine, expire_on_commit=False) as session:
            try:
                if new_customer or not mine:
                    customer = Customer(name=f"{spec.name}-{len(mine)}", home=spec.datacenter)
                    order = Order(customer=customer, amount=rng.randint(1, 500),
                                  written_ms=0, written_by=spec.name)
                else:
                    customer = None
                    order = Order(customer_id=rng.choice(mine), amount=rng.randint(1, 500),
                                  written_ms=0, written_by=spec.name)
                session.add(order)
                order.written_ms = int(time.time() * 1000)
                session.commit()
            except Exception as error:  # a failed insert is what this example counts
                report.failures += 1
                errors[f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"] += 1
                log.warning("insert failed: %s", error)
                return
        report.orders += 1
        if customer is not None:
            report.customers += 1
            mine.append(customer.id)

    try:
        insert(True)  # first contact with every tier before the clock starts
        waited = cache.stats()["blocking_waits"], tier.stats()["blocking_waits"]
        reports.put(("ready", spec.name))
        go.wait()
        interval = 1.0 / spec.rate
        due = time.monotonic()
        while not stop.is_set():
            insert(rng.randrange(ORDERS_PER_CUSTOMER) == 0)
            due += interval
            late = time.monotonic() - due
            if late > 1.0:
                due += late  # fell behind (a slow moment): carry on at the rate, no burst
            elif late < 0:
                stop.wait(-late)  # pacing, and a prompt stop
    finally:
        configure(None)
        report.burned_at_close = cache.close()
        report.cache = {k: v for k, v in cache.stats().items() if not isinstance(v, dict)}
        tier.close()
        stats = tier.stats()
        report.tier = {k: v for k, v in stats.items() if k != "sequences"}
        if waited is not None:
            report.cache_waits = report.cache["blocking_waits"] - waited[0]
            report.tier_waits = report.tier["blocking_waits"] - waited[1]
        upstream.close()
        engine.dispose()
        report.errors = dict(errors)
        reports.put(("report", asdict(report)))


# -- the run -----------------------------------------------------------------------------------


class CheckFailed(Exception):
    pass


@dataclass
class Sample:
    """One look at both datacenters' tiers (``at``: seconds since the inserts started)."""

    at: float
    tiers: dict[str, dict[str, dict[str, Any]]]


@dataclass
class Timeline:
    start: float = 0.0
    cut_start: float | None = None
    cut_end: float | None = None
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def since(self, wall: float) -> float:
        return round(wall - self.start, 3)


def tier_figures(url: str) -> dict[str, dict[str, Any]]:
    """Each sequence's stock, shared rate, runway and refills in a datacenter's tier."""
    keep = ("stock", "rate", "runway", "issued", "refills", "refilled", "given_back")
    return {
        str(status.sequence): {
            key: round(value, 2) if isinstance(value := getattr(status, key), float) else value
            for key in keep
        }
        for status in describe_datacenter(url, timeout=5.0)
    }


def watch(urls: dict[str, str], timeline: Timeline, stop: threading.Event,
          every: float = 1.0) -> None:
    """Sample both tiers every ``every`` seconds until ``stop``."""
    while not stop.is_set():
        tiers = {}
        for dc, url in urls.items():
            try:
                tiers[dc] = tier_figures(url)
            except Exception as error:  # a sample missed is a gap in the plot, not a failure
                log.warning("sampling %s's tier: %s", dc, error)
        # Stamped once read: what a sample shows was there at or before ``at`` (stamped
        # before, a read that outlasted the cut's end was counted in the cut with a refill
        # that landed after it: "eu1's stock grew in the cut", once).
        at = timeline.since(time.time())
        with timeline.lock:
            timeline.samples.append(Sample(at, tiers))
        stop.wait(every)


def check(condition: bool, message: str, failed: list[str]) -> None:
    """Record a failed check (all are reported, then the run exits 1)."""
    if not condition:
        failed.append(message)
        print(f"CHECK FAILED: {message}", file=sys.stderr)


def prepare_global(urls: Sequence[str]) -> None:
    """Server i of the pair issues ids ≡ i (mod 2), as ``sqlalchemy-tickets init --url A
    --url B`` sets them up: increment 2, offsets 1 and 2."""
    for offset, url in enumerate(urls, start=1):
        server = TicketServer(url, timeout=10.0)
        try:
            for sequence in SEQUENCES:
                server.create(sequence, increment=len(urls), offset=offset)
        finally:
            server.close()


def prepare_datacenter(url: str) -> None:
    """The application's tables, empty, and no stock left from an earlier run (its ids came
    from a global pair that may since have been made again, and would then be issued twice)."""
    engine = sa.create_engine(url)
    try:
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
        with engine.begin() as conn:
            # The library's stamp table is made with a tier's tables: without it, no earlier
            # run's tier is there (and the drop's statements would not find it).
            if sa.inspect(conn).has_table("tickets_stamps"):
                for statement in drop_datacenter_table_statements(dialect=engine.dialect.name):
                    conn.execute(statement)
    finally:
        engine.dispose()
    # Made up front (they would be made on first use, race-free): the workers start at once.
    create_datacenter_tables(url, timeout=10.0)


def run(args: argparse.Namespace, urls: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scenario over databases that exist; returns the summary and the failed checks."""
    global_urls: list[str] = urls["global"]
    dc_urls: dict[str, str] = {dc: urls[dc] for dc in DATACENTERS}
    prepare_global(global_urls)
    for url in dc_urls.values():
        prepare_datacenter(url)
    proxies = [TcpProxy(sa.make_url(u).host or "127.0.0.1", sa.make_url(u).port or
                        _default_port(u)).start() for u in global_urls]
    ctx = multiprocessing.get_context("spawn")
    go, stop = ctx.Event(), ctx.Event()
    reports: Any = ctx.Queue()
    processes: list[SpawnProcess] = []
    timeline = Timeline()
    watching = threading.Event()
    watcher = threading.Thread(target=watch, args=(dc_urls, timeline, watching), daemon=True)
    try:
        for dc in DATACENTERS:
            reach = [p.url(u) for p, u in zip(proxies, global_urls, strict=True)] if dc == CUT \
                else list(global_urls)
            for n in range(args.workers):
                spec = WorkerSpec(
                    name=f"{dc}-w{n}", datacenter=dc, dc_url=dc_urls[dc],
                    global_urls=(reach[0], reach[1]), rate=args.rate, supply=args.supply,
                    seed=args.seed * 1000 + len(processes),
                )
                process = ctx.Process(target=worker, args=(spec, go, stop, reports),
                                      name=spec.name)
                process.start()
                processes.append(process)
        collected = _scenario(args, processes, go, stop, reports, proxies, timeline,
                              watcher, watching, dc_urls, global_urls)
    finally:
        stop.set()
        go.set()
        watching.set()
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
        for proxy in proxies:
            proxy.close()
    return collected


def _default_port(url: str) -> int:
    return {"postgresql": 5432, "mysql": 3306}[sa.make_url(url).get_backend_name()]


def _scenario(args: argparse.Namespace, processes: list[SpawnProcess],
              go: Event, stop: Event, reports: Any, proxies: list[TcpProxy],
              timeline: Timeline, watcher: threading.Thread, watching: threading.Event,
              dc_urls: dict[str, str], global_urls: list[str]) -> tuple[dict[str, Any],
                                                                       list[str]]:
    failed: list[str] = []
    ready: set[str] = set()
    deadline = time.monotonic() + args.start_timeout
    while len(ready) < len(processes):
        try:
            kind, body = reports.get(timeout=0.5)
        except queue.Empty:
            dead = [p.name for p in processes if p.exitcode is not None]
            if dead or time.monotonic() > deadline:
                raise CheckFailed(
                    f"only {len(ready)} of {len(processes)} workers started within "
                    f"{args.start_timeout:g} s" + (f"; {', '.join(dead)} died" if dead else "")
                ) from None
            continue
        if kind != "ready":  # a worker that ended before the start: it could not insert
            raise CheckFailed(f"worker {body['name']} stopped before the start: {body['errors']}")
        ready.add(body)
    print(f"{len(processes)} workers ready ({args.workers} per datacenter, {args.rate:g} "
          f"inserts/s each); {CUT}'s link to the global pair goes through "
          f"{', '.join(f'127.0.0.1:{p.port}' for p in proxies)}", flush=True)

    timeline.start = time.time()
    go.set()
    watcher.start()
    stop.wait(args.warmup)
    cut_stock = wait_for_low_stock(args, dc_urls[CUT], stop) if args.cut_at == "low" else None

    # The cut: every connection from CUT to the global pair stalls (or is refused).
    for proxy in proxies:
        if args.cut_mode == "hang":
            proxy.hang()
        else:
            proxy.refuse()
    cut_wall = time.time()
    timeline.cut_start = timeline.since(cut_wall)
    stock = (f"; its stock: {cut_stock['stock']} orders ids, refill mark "
             f"{cut_stock['refill_mark']}" if cut_stock else "")
    print(f"t={timeline.cut_start:.1f}s: {CUT}'s link to the global pair cut ({args.cut_mode}) "
          f"for {args.cut:g} s{stock}", flush=True)
    stop.wait(SETTLE)
    refills_at_cut = {seq: f["refills"] for seq, f in tier_figures(dc_urls[CUT]).items()}
    # The link is down for anyone in CUT: a ticket server reached through it does not answer.
    probe = _probe([proxy.url(url) for proxy, url in zip(proxies, global_urls, strict=True)])
    stop.wait(max(0.0, cut_wall + args.cut - time.time()))
    refills_at_end = {seq: f["refills"] for seq, f in tier_figures(dc_urls[CUT]).items()}
    for proxy in proxies:
        proxy.forward()
    timeline.cut_end = timeline.since(time.time())
    print(f"t={timeline.cut_end:.1f}s: link restored", flush=True)
    stop.wait(args.after)
    end = timeline.since(time.time())
    stop.set()

    worker_reports: list[dict[str, Any]] = []
    deadline = time.monotonic() + 60
    while len(worker_reports) < len(processes):
        try:
            kind, body = reports.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            failed.append(f"only {len(worker_reports)} of {len(processes)} workers reported")
            break
        if kind == "report":
            worker_reports.append(body)
    watching.set()
    watcher.join(10)
    for process in processes:
        process.join(30)
    final_tiers = {dc: tier_figures(url) for dc, url in dc_urls.items()}

    # -- what the databases hold --------------------------------------------------------------
    per_dc: dict[str, dict[str, Any]] = {}
    keys: dict[str, Counter[int]] = {"customers": Counter(), "orders": Counter()}
    buckets = max(1, math.floor(end))  # whole seconds only: the last one is cut short
    for dc, url in dc_urls.items():
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                customer_ids = list(conn.scalars(sa.select(customers.c.id)))
                order_rows = conn.execute(sa.select(orders.c.id, orders.c.written_ms)).all()
        finally:
            engine.dispose()
        keys["customers"].update(customer_ids)
        keys["orders"].update(order_id for order_id, _ in order_rows)
        per_second = [0] * buckets
        in_cut = 0
        assert timeline.cut_start is not None and timeline.cut_end is not None
        for _, written_ms in order_rows:
            at = written_ms / 1000 - timeline.start
            if 0 <= at < buckets:
                per_second[int(at)] += 1
            in_cut += timeline.cut_start <= at < timeline.cut_end
        mine = [r for r in worker_reports if r["datacenter"] == dc]
        per_dc[dc] = {
            "backend": sa.make_url(url).get_backend_name(),
            "workers": len(mine),
            "customers": len(customer_ids),
            "orders": len(order_rows),
            "orders_during_cut": in_cut,
            "committed_by_workers": {"customers": sum(r["customers"] for r in mine),
                                     "orders": sum(r["orders"] for r in mine)},
            "failed_inserts": sum(r["failures"] for r in mine),
            "errors": dict(sum((Counter(r["errors"]) for r in mine), Counter())),
            "upstream_round_trips": sum(r["tier"].get("upstream_round_trips", 0) for r in mine),
            # Calls that waited for a round trip once the clock started: a process's cache on
            # its datacenter's database, a tier on the global pair (its stock was empty).
            "blocking_waits": {"cache": sum(r["cache_waits"] for r in mine),
                               "tier": sum(r["tier_waits"] for r in mine)},
            "ids_burned_at_close": sum(r["burned_at_close"] for r in mine),
            "tier_at_end": final_tiers[dc],
            "orders_per_second": per_second,
        }
    duplicates = {table: sum(n - 1 for n in counter.values() if n > 1)
                  for table, counter in keys.items()}

    for dc, figures in per_dc.items():
        check(figures["workers"] == args.workers, f"{dc}: {figures['workers']} of "
              f"{args.workers} workers reported", failed)
        check(figures["failed_inserts"] == 0,
              f"{dc}: {figures['failed_inserts']} failed inserts: {figures['errors']}", failed)
        committed = figures["committed_by_workers"]
        check(committed == {"customers": figures["customers"], "orders": figures["orders"]},
              f"{dc}: the workers saw {committed} committed, the database holds "
              f"{figures['customers']} customers and {figures['orders']} orders", failed)
        check(figures["ids_burned_at_close"] == 0,
              f"{dc}: its processes burned {figures['ids_burned_at_close']} ids stopping "
              "cleanly (each cache gives what it holds back to the tier)", failed)
    check(sum(duplicates.values()) == 0, f"keys in both datacenters: {duplicates}", failed)
    check(per_dc[CUT]["orders_during_cut"] > 0, f"{CUT} inserted nothing during the cut", failed)
    check(per_dc[CUT]["blocking_waits"]["tier"] == 0,
          f"{CUT}'s stock ran out: {per_dc[CUT]['blocking_waits']['tier']} calls waited on the "
          f"global pair", failed)
    check(probe is not None, f"a ticket server answered through the cut link: {probe}", failed)
    check(refills_at_cut == refills_at_end,
          f"{CUT} stored blocks from the global pair during the cut: refills {refills_at_cut} "
          f"→ {refills_at_end}", failed)
    for dc, figures in per_dc.items():
        print(f"{dc} ({figures['backend']}): {figures['customers']} customers, "
              f"{figures['orders']} orders ({figures['orders_during_cut']} during the cut), "
              f"{figures['failed_inserts']} failed inserts, "
              f"{figures['upstream_round_trips']} round trips to the global pair, "
              f"{figures['ids_burned_at_close']} ids burned when its processes stopped",
              flush=True)

    migration = migrate(dc_urls, failed)

    summary = {
        "datacenters": {dc: per_dc[dc]["backend"] for dc in DATACENTERS},
        "global_pair": [sa.make_url(u).get_backend_name() for u in global_urls],
        "workers_per_datacenter": args.workers,
        "rate_per_worker": args.rate,
        "supply": args.supply,
        "cut": {
            "datacenter": CUT,
            "mode": args.cut_mode,
            "at": args.cut_at,
            "stock_at_start": cut_stock,
            "start": timeline.cut_start,
            "end": timeline.cut_end,
            "seconds": round(timeline.cut_end - timeline.cut_start, 3),
            "refills_at_start": refills_at_cut,
            "refills_at_end": refills_at_end,
            "probe_through_cut_link": probe,
        },
        "duration": end,
        "per_datacenter": per_dc,
        "rows": {dc: per_dc[dc]["customers"] + per_dc[dc]["orders"] for dc in DATACENTERS},
        "failed_inserts": {dc: per_dc[dc]["failed_inserts"] for dc in DATACENTERS},
        "duplicate_keys": duplicates,
        "migration": migration,
        "orders_stock": stock_timeline(timeline.samples),
        "checks_failed": failed,
    }
    return summary, failed


def wait_for_low_stock(args: argparse.Namespace, url: str,
                       stop: Event) -> dict[str, Any] | None:
    """Wait until the datacenter's stock of orders is down near its refill mark (half its
    target): the least stock a tier holds, the worst moment for a cut. Gives up after three
    times ``supply`` seconds (the stock then holds more: the caches take their blocks from it
    in lumps of their own ``supply``, so one refill period may pass it by); returns what it
    saw last."""
    deadline = time.monotonic() + 3 * args.supply
    seen: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        figures = tier_figures(url).get("orders")
        if figures is not None:
            target = max(MIN_BLOCK, math.ceil(figures["rate"] * args.supply))
            seen = {**figures, "refill_mark": int(target * LOW_WATER)}
            if figures["stock"] <= seen["refill_mark"] * NEAR_LOW:
                return seen
        stop.wait(0.25)
    print(f"{CUT}'s stock did not come down near its refill mark within {3 * args.supply:g} s: "
          f"cutting now", flush=True)
    return seen


def stock_timeline(samples: Sequence[Sample]) -> dict[str, dict[str, list[Any]]]:
    """Per datacenter, the tier's figures for orders over time, one list per figure (``at``:
    seconds since the inserts started)."""
    keys = ("stock", "rate", "runway", "refills")
    columns: dict[str, dict[str, list[Any]]] = {
        dc: {key: [] for key in ("at", *keys)} for dc in DATACENTERS
    }
    for sample in samples:
        for dc, tiers in sample.tiers.items():
            figures = tiers.get("orders")
            if figures is not None:
                columns[dc]["at"].append(sample.at)
                for key in keys:
                    columns[dc][key].append(figures[key])
    return columns


def dumps(summary: dict[str, Any]) -> str:
    """JSON with each list of numbers on one line."""
    text = json.dumps(summary, indent=2)
    return re.sub(r"\[\s*([-\d.eE,\s]|null)*\]",
                  lambda m: re.sub(r"\s+", " ", m.group(0)).replace("[ ", "[").replace(" ]", "]"),
                  text)


def _probe(urls: Sequence[str]) -> str | None:
    """Ask each ticket server once through the cut link; the error seen (``None``: one
    answered, the link is not cut)."""
    seen = None
    for url in urls:
        server = TicketServer(url, timeout=1.0)
        try:
            server.next_id("orders")
            return None
        except TicketServerUnavailable as error:
            seen = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        finally:
            server.close()
    return seen


def migrate(dc_urls: dict[str, str], failed: list[str]) -> dict[str, Any]:
    """Move na1's busiest customer to eu1: copy their rows with their keys, then delete them
    from na1 (HubSpot's "migrate between Hublets"). A key already in eu1 would fail the copy."""
    source = sa.create_engine(dc_urls[MOVE_FROM])
    target = sa.create_engine(dc_urls[MOVE_TO])
    try:
        with source.connect() as conn:
            busiest = conn.execute(
                sa.select(orders.c.customer_id, sa.func.count().label("n"))
                .group_by(orders.c.customer_id)
                .order_by(sa.desc("n"), orders.c.customer_id)
                .limit(1)
            ).one()
            customer_id = int(busiest.customer_id)
            customer_rows = [dict(r._mapping) for r in conn.execute(
                customers.select().where(customers.c.id == customer_id))]
            order_rows = [dict(r._mapping) for r in conn.execute(
                orders.select().where(orders.c.customer_id == customer_id))]
        copied = True
        try:
            with target.begin() as conn:
                conn.execute(sa.insert(customers), customer_rows)
                conn.execute(sa.insert(orders), order_rows)
        except sa.exc.IntegrityError as error:
            copied = False
            check(False, f"copying customer {customer_id} to {MOVE_TO}: {error}", failed)
        if copied:
            with source.begin() as conn:
                conn.execute(orders.delete().where(orders.c.customer_id == customer_id))
                conn.execute(customers.delete().where(customers.c.id == customer_id))
        with target.connect() as conn:
            found = set(conn.scalars(
                sa.select(orders.c.id).where(orders.c.customer_id == customer_id)))
            home = conn.scalar(sa.select(customers.c.home).where(customers.c.id == customer_id))
    finally:
        source.dispose()
        target.dispose()
    order_ids = sorted(int(r["id"]) for r in order_rows)
    check(found == set(order_ids) and home == MOVE_FROM,
          f"customer {customer_id}'s rows not in {MOVE_TO} with their keys", failed)
    print(f"moved customer {customer_id} ({len(order_ids)} orders) from {MOVE_FROM} to "
          f"{MOVE_TO} with the same keys: {'no key collision' if copied else 'COLLISION'}",
          flush=True)
    return {
        "customer_id": customer_id,
        "from": MOVE_FROM,
        "to": MOVE_TO,
        "order_ids": order_ids,
        "copied": copied,
    }


# -- plot --------------------------------------------------------------------------------------


def plot(summary: dict[str, Any], path: Path) -> bool:
    """Orders/s per datacenter over time and each tier's runway, the cut shaded; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    cut = summary["cut"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.4, 5.6), sharex=True,
                                      height_ratios=[3, 2])
    for dc, style in zip(DATACENTERS, ("-", "--"), strict=True):
        figures = summary["per_datacenter"][dc]
        rates = figures["orders_per_second"]
        top.plot([s + 0.5 for s in range(len(rates))], rates, style,
                 label=f"{dc} ({figures['backend']}): {figures['failed_inserts']} failed")
        timeline = summary["orders_stock"][dc]
        known = [(at, r) for at, r in zip(timeline["at"], timeline["runway"], strict=True)
                 if r is not None]
        bottom.plot([at for at, _ in known], [r for _, r in known], style, label=dc)
    for ax in (top, bottom):
        ax.axvspan(cut["start"], cut["end"], color="tab:red", alpha=0.12,
                   label=f"{cut['datacenter']} cut off the global pair" if ax is top else None)
        ax.grid(alpha=0.3)
    top.set_ylabel("orders inserted / s")
    top.set_ylim(bottom=0)
    top.set_title(f"Two datacenters over one global pair; {cut['datacenter']}'s link cut "
                  f"({cut['mode']}) for {cut['seconds']:.0f} s")
    top.legend(loc="lower left", fontsize="small")
    bottom.set_ylabel("runway (s)\nstock ÷ rate")
    bottom.set_xlabel("seconds since the inserts started")
    bottom.set_ylim(bottom=0)
    bottom.legend(loc="lower left", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- command line ------------------------------------------------------------------------------


@contextlib.contextmanager
def databases(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """The databases given, else throwaway ones on the local servers (dropped afterwards)."""
    with contextlib.ExitStack() as stack:

        def fresh(backend: str, server: str) -> str:
            url = stack.enter_context(throwaway_database(backend, server))
            return url.render_as_string(hide_password=False)

        urls: dict[str, Any] = {
            "global": args.global_urls or [fresh("postgresql", args.postgresql),
                                           fresh("mysql", args.mariadb)],
            "na1": args.na1 or fresh("postgresql", args.postgresql),
            "eu1": args.eu1 or fresh("mysql", args.mariadb),
        }
        if args.keep:
            stack.pop_all()
            print("keeping the databases:", json.dumps(urls))
        yield urls


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--global", dest="global_urls", nargs=2, metavar="URL",
                        help="the global pair's databases, odd then even (default: throwaway "
                             "databases, one on each server)")
    parser.add_argument("--na1", metavar="URL", help="datacenter na1's database "
                        "(default: a throwaway database on --postgresql)")
    parser.add_argument("--eu1", metavar="URL", help="datacenter eu1's database "
                        "(default: a throwaway database on --mariadb)")
    parser.add_argument("--postgresql", default=POSTGRESQL, metavar="URL",
                        help="server for throwaway databases (default: %(default)s)")
    parser.add_argument("--mariadb", default=MARIADB, metavar="URL",
                        help="server for throwaway databases (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the throwaway databases")
    parser.add_argument("--workers", type=int, default=3, help="processes per datacenter")
    parser.add_argument("--rate", type=float, default=40.0, help="inserts/s of each process")
    parser.add_argument("--warmup", type=float, default=10.0,
                        help="seconds at least before the cut (default: %(default)s)")
    parser.add_argument("--cut", type=float, default=45.0,
                        help="seconds eu1 is cut off the global pair (default: %(default)s)")
    parser.add_argument("--cut-at", choices=("low", "warmup"), default="low",
                        help="low: after --warmup, once eu1's stock is down near its refill "
                             "mark, the least it holds (default); warmup: right after --warmup")
    parser.add_argument("--cut-mode", choices=("hang", "refuse"), default="hang",
                        help="hang: nothing moves, nothing is closed (a partition); refuse: "
                             "connections are closed and refused")
    parser.add_argument("--after", type=float, default=20.0, help="seconds after the cut")
    parser.add_argument("--supply", type=float, default=120.0,
                        help="seconds of ids each datacenter tier stocks (default: "
                             "%(default)s; the library's default is 900)")
    parser.add_argument("--start-timeout", type=float, default=120.0,
                        help="seconds the workers get to start")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where multiregion_example.json and .png go (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.workers < 1 or args.rate <= 0 or args.cut <= SETTLE or args.warmup < 0 \
            or args.after < 0:
        parser.error(f"--workers must be at least 1, --rate positive, --cut more than "
                     f"{SETTLE:g} s, --warmup and --after not negative")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        with databases(args) as urls:
            summary, failed = run(args, urls)
    except CheckFailed as failure:
        print(f"FAILED: {failure}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "multiregion_example.json").write_text(dumps(summary) + "\n")
    png = args.out / "multiregion_example.png"
    if plot(summary, png):
        print(f"wrote {png}")
    else:
        print("matplotlib is not installed: no plot")
    if failed:
        print(f"FAILED: {len(failed)} check(s): {'; '.join(failed)}", file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
