"""Fault campaign, Jepsen-style: two datacenters' worker processes insert rows through the ORM into
sharded application databases while a seeded nemesis kills, stops, cuts, hangs, restores and fails
over what they depend on; a checker then reads every table.

Layout (``soak.py``'s, with both global servers private so that they can be rewound): a global
pair ``TicketServers([a, b])`` — ``a`` a private PostgreSQL primary with an asynchronous streaming
replica (``tests/support/rewind.py``), ``b`` a private MariaDB (``tests/support/servers.py``) —
and two datacenters, ``dc0`` a database on the shared PostgreSQL and ``dc1`` one on the shared
MariaDB. Each datacenter database holds a ``DatacenterTier``'s tables (stock, state, stamps) and
the application's tables ``campaign_orders`` and ``campaign_lines`` (both keyed by
``TicketId("campaign")``): the rows of a datacenter go to its own database, and ids must be
unique across both. Each datacenter reaches each global server through a proxy of its own
(``FollowingProxy``: it can cut, hang, and follow a failover). ``--workers`` processes per
datacenter (default 2; smoke 1) each ``configure(CachedSource(DatacenterTier(dc,
upstream=TicketServers([a, b]))))`` (``on_rewind="heal"``, the default) and commit an order with
two lines through ``Session`` every 0.25 s; after each commit a worker appends the committed ids
to a log of its own, each failed commit with the exception's class, and once a second what its
cache holds and its ``stats()["rewinds"]``; the library's WARNINGs go to a second file.

The nemesis (a thread, driven by ``random.Random(--seed)``; default seed 1) draws the whole
schedule before the run — kinds, targets, durations, which dump to restore — and runs it over
``--duration`` seconds (default 600; ``--smoke`` ~30 s, every kind once), one fault at a time:

* ``kill_worker``: a worker SIGKILLed and started again;
* ``stop_worker``: a worker SIGSTOPped for 1-5 s, then SIGCONT;
* ``kill_server``: ``a`` or ``b`` SIGKILLed (the whole process group), restarted 1-5 s later;
* ``stop_server``: ``a`` or ``b`` SIGSTOPped for 1-4 s (a server hung for real), then SIGCONT;
* ``cut_link`` / ``hang_link``: one datacenter's link (or both) to ``a`` or ``b`` refused or
  hung at the proxy for 2-8 s;
* ``restore_global``: ``a``'s or ``b``'s ticket database restored in place from a dump taken
  earlier in the run (``pg_dump``/``pg_restore``, ``mariadb-dump``/``mariadb``; every server and
  tier is dumped every 20 s);
* ``restore_tier``: a datacenter's tier tables (stock, state, stamps — not the application's
  rows) restored in place from an earlier dump;
* ``promote`` (once, between 30 % and 60 % of the run): ``a``'s replication cut, the primary
  allowed to issue blocks the replica never sees, the primary SIGKILLed, the replica promoted,
  every proxy re-pointed at it; ``a`` is the promoted server from then on (no new replica).

Then every worker stops cleanly (its cache gives its ids back), and the checker reads every
application table of both datacenters. Reported: **duplicates** (ids in two tables or both
datacenters, and inserts refused as a duplicate key; target 0), **acknowledged rows lost** (ids a
worker logged as committed that are not in its datacenter's tables; target 0), **latent
duplicates** (ids left in a tier's stock that a table holds, or in both stocks; target 0),
**caller errors** by exception class and how many are not ``TicketsError`` subclasses (target 0),
**stalled workers** (one that neither committed nor failed for 30 s, or did not stop within 60 s
of being told: its threads' stacks go to its log and the JSON; target 0); rewinds healed (the
workers' ``stats()["rewinds"]`` at their last report, and the WARNINGs "went back in time" in
their logs) and refused (``RewindError`` seen by callers, and refusals in the logs); ids burned;
failed inserts; rows written; every fault with its time, kind, target and outcome. The exit
status is 1 if any target is missed.

    .venv/bin/python benchmarks/campaign.py [--smoke] [--duration 600] [--seed 1] [--workers 2]
        [--logs DIR]   # keep the workers' logs (commits, failures, WARNINGs) there
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import logging
import multiprocessing
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as h
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from sqlalchemy_tickets import (  # noqa: E402
    CachedSource,
    DatacenterTier,
    TicketId,
    TicketsError,
    TicketServer,
    TicketServers,
    configure,
)
from sqlalchemy_tickets.sources.datacenter import (  # noqa: E402
    create_datacenter_tables,
    describe_datacenter,
)
from support.rewind import (  # noqa: E402
    FollowingProxy,
    PgPair,
    _mariadb_args,
    _mariadb_tool,
    _pg_args,
    _run_tool,
    dump,
    pg_connect,
    restore,
    start_postgresql_pair,
)
from support.servers import ServerProcess, _postgresql_bindir, start_private_mariadb  # noqa: E402

NAME, SEQ = "campaign", "campaign"
LINES_PER_ORDER, TICK = 2, 0.25
IDS_PER_COMMIT = 1 + LINES_PER_ORDER
#: A worker that neither commits nor fails for this long is blocked (every wait in the library
#: is bounded by a timeout of seconds; the longest fault lasts 8 s).
STALL_SECONDS = 30.0
#: The tier's tables in a datacenter database: what a "tier database restore" puts back.
TIER_TABLES = ("tickets_dc__stock", "tickets_dc__state", "tickets_stamps")
#: The tier sized small (10 s of ids) so that it refills from the global pair every few
#: seconds: a rewound global server is met soon after it rewinds.
TIER_OPTIONS: dict[str, Any] = {"supply": 10.0, "min_block": 100, "claim_timeout": 4.0}
KINDS = (
    "kill_worker",
    "stop_worker",
    "kill_server",
    "stop_server",
    "cut_link",
    "hang_link",
    "restore_global",
    "restore_tier",
    "promote",
)
WEIGHTS = {
    "kill_worker": 3,
    "stop_worker": 2,
    "kill_server": 2,
    "stop_server": 1,
    "cut_link": 2,
    "hang_link": 2,
    "restore_global": 3,
    "restore_tier": 2,
}
COLORS = {
    "kill_worker": "black",
    "stop_worker": "tab:gray",
    "kill_server": "tab:red",
    "stop_server": "tab:pink",
    "cut_link": "tab:blue",
    "hang_link": "tab:cyan",
    "restore_global": "tab:purple",
    "restore_tier": "tab:olive",
    "promote": "tab:orange",
}


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "campaign_orders"
    id: Mapped[int] = mapped_column(TicketId(SEQ), primary_key=True)
    worker: Mapped[int]
    n: Mapped[int]
    lines: Mapped[list[Line]] = relationship(back_populates="order")


class Line(Base):
    __tablename__ = "campaign_lines"
    id: Mapped[int] = mapped_column(TicketId(SEQ), primary_key=True)
    order_id: Mapped[int] = mapped_column(sa.ForeignKey("campaign_orders.id"))
    k: Mapped[int]
    order: Mapped[Order] = relationship(back_populates="lines")


# -- workers -----------------------------------------------------------------------------------


def _worker(slot: int, dc: str, pair: list[str], log_path: str, err_path: str, stop: Any) -> None:
    """Commit an order with its lines every ``TICK`` until ``stop`` is set. Log lines: ``C t
    order line line`` per commit, ``F t class tickets_error duplicate message`` per failed
    commit, ``H t held rewinds tier_burned`` once a second, ``E t burned rewinds tier_burned``
    and ``S {stats}`` at a clean exit. The library's WARNINGs go to ``err_path``."""
    logging.basicConfig(
        filename=err_path,
        level=logging.WARNING,
        format="%(created).3f %(levelname)s %(name)s %(message)s",
    )
    # A worker that does not stop is sent SIGUSR1 first: every thread's stack, in its log.
    stacks = open(err_path, "a")  # noqa: SIM115 - open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    pair_source = TicketServers(pair, backoff=0.5, max_backoff=2.0)
    tier = DatacenterTier(dc, upstream=pair_source, **TIER_OPTIONS)
    cache = CachedSource(tier)
    configure(cache)
    engine = sa.create_engine(dc, pool_pre_ping=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def figures() -> tuple[int, int, int]:
        s, t = cache.stats(), tier.stats()
        return s["in_hand"] + s["in_flight"], int(s["rewinds"]), int(t["burned"])

    n, start, beat = 0, time.monotonic(), 0.0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if now - beat >= 1.0:
                held, rewinds, tier_burned = figures()
                write(f"H {now:.3f} {held} {rewinds} {tier_burned}")
                beat = now
            try:
                with Session(engine) as session:
                    order = Order(worker=slot, n=n)
                    order.lines = [Line(k=k) for k in range(LINES_PER_ORDER)]
                    session.add(order)
                    session.commit()
                    ids = " ".join(str(x.id) for x in (order, *order.lines))
                write(f"C {time.monotonic():.3f} {ids}")
                n += 1
            except Exception as error:  # every failure is a finding: logged, classified
                message = " ".join(str(error).split())[:400]
                write(
                    f"F {time.monotonic():.3f} {type(error).__module__}.{type(error).__name__} "
                    f"{int(isinstance(error, TicketsError))} "
                    f"{int(isinstance(error, sa.exc.IntegrityError))} {message}"
                )
            start += TICK
            time.sleep(max(0.0, start - time.monotonic()))
    finally:
        configure(None)
        burned = cache.close()
        tier.close()
        _, rewinds, tier_burned = figures()
        stats = {"cache": cache.stats(), "tier": tier.stats(), "pair": pair_source.stats()}
        pair_source.close()
        engine.dispose()
        write(f"E {time.monotonic():.3f} {burned} {rewinds} {tier_burned}")
        write("S " + json.dumps(stats, default=str))
        os.close(fd)


def read_log(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {
        "commits": [],
        "failures": [],
        "beats": [],
        "end": None,
        "stats": None,
    }
    if not path.exists():  # killed before it opened its log
        return out
    for line in path.read_text().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "S":
            out["stats"] = json.loads(rest)
            continue
        fields = rest.split(" ", 4)
        if len(fields) < 2:
            continue  # a line cut by a SIGKILL
        t = float(fields[0])
        if kind == "C" and len(fields) >= 1 + IDS_PER_COMMIT:
            out["commits"].append((t, [int(x) for x in fields[1 : 1 + IDS_PER_COMMIT]]))
        elif kind == "F" and len(fields) >= 4:
            out["failures"].append(
                {
                    "t": t,
                    "class": fields[1],
                    "tickets_error": fields[2] == "1",
                    "duplicate": fields[3] == "1",
                    "message": fields[4] if len(fields) > 4 else "",
                }
            )
        elif kind == "H" and len(fields) >= 4:
            out["beats"].append((t, int(fields[1]), int(fields[2]), int(fields[3])))
        elif kind == "E" and len(fields) >= 4:
            out["end"] = (t, int(fields[1]), int(fields[2]), int(fields[3]))
    return out


#: Lines of a worker's WARNING log, by what they say.
LOG_PATTERNS = {
    "healed": re.compile(r"went back in time.*(no id is issued twice|told it to move above)"),
    # ...of which, by what noticed it:
    "healed_identity_changed": re.compile(r"TicketServer\(.*went back in time: its identity"),
    "healed_offered_issued_ids": re.compile(r"TicketServer\(.*went back in time: it offered"),
    "healed_below_an_id_in_use": re.compile(r"TicketServer\(.*went back in time: its next id"),
    "healed_tier_upstream_mark": re.compile(r"went back in time upstream"),
    "tier_discarded": re.compile(r"datacenter database went back in time"),
    "refused": re.compile(r"Nothing was issued"),
    "stock_dropped": re.compile(r"dropped \d+ ids of .* from its stock"),
    "errors": re.compile(r" (ERROR|CRITICAL) "),
    "tracebacks": re.compile(r"^Traceback"),
}
DISCARDED = re.compile(r"discarded its stock \((\d+) ids")


#: What a rewind line says, shortened for the JSON's ``rewind_log`` (URLs become a, b, dcN).
REWIND_LINE = re.compile(r"went back in time|from its stock|Nothing was issued")


def shorten(line: str, names: dict[str, str]) -> str:
    line = re.sub(r"TicketServers\(\[[^]]*\]\)", "pair", line)
    for url, name in names.items():
        line = line.replace(url, name)
    line = re.sub(r"TicketServer\('(a|b)'\)", r"\1", line)
    return line.replace(" (restored from a backup, or a replica promoted)", "")[:700]


def read_warnings(path: Path, wall0: float, names: dict[str, str]) -> dict[str, Any]:
    """Counts of a worker's WARNING lines by kind, and its rewind lines (``t`` in seconds into
    the run: ``wall0`` is the wall clock at the run's start)."""
    counts: Counter[str] = Counter()
    discarded = 0
    examples: dict[str, str] = {}
    rewinds: list[dict[str, Any]] = []
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            for key, pattern in LOG_PATTERNS.items():
                if pattern.search(line):
                    counts[key] += 1
                    examples.setdefault(key, line[:600])
            found = DISCARDED.search(line)
            if found:
                discarded += int(found.group(1))
            stamp, _, text = line.partition(" ")
            if REWIND_LINE.search(text):
                with contextlib.suppress(ValueError):
                    rewinds.append(
                        {
                            "t": round(float(stamp) - wall0, 2),
                            "log": path.name,
                            "line": shorten(
                                text.removeprefix("WARNING sqlalchemy_tickets "), names
                            ),
                        }
                    )
    return {
        "counts": dict(counts),
        "discarded_ids": discarded,
        "examples": examples,
        "rewinds": rewinds,
    }


def duplicate_runs(seen: dict[int, list[tuple[float, str, int]]]) -> list[dict[str, Any]]:
    """Ids committed twice, grouped into runs of one lane (ids ≡ r mod 2, a few apart): each
    run's ids, and per worker log when it committed them (seconds into the run)."""
    doubled = sorted(i for i, where in seen.items() if len(where) > 1)
    runs: list[list[int]] = []
    for i in doubled:
        for run in reversed(runs):
            if run[-1] % 2 == i % 2 and i - run[-1] <= 64:
                run.append(i)
                break
        else:
            runs.append([i])
    out = []
    for run in runs:
        by_log: dict[str, list[float]] = {}
        for i in run:
            for t, log, _ in seen[i]:
                by_log.setdefault(log, []).append(t)
        out.append(
            {
                "first_id": run[0],
                "last_id": run[-1],
                "count": len(run),
                "lane": "a (odd)" if run[0] % 2 else "b (even)",
                "committed": {
                    log: {"first_t": round(min(ts), 1), "last_t": round(max(ts), 1), "ids": len(ts)}
                    for log, ts in sorted(by_log.items())
                },
            }
        )
    return out


# -- dumps of a few tables -----------------------------------------------------------------------


def dump_tables(url: str, path: Path, tables: Sequence[str]) -> Path:
    """``support.rewind.dump`` of only ``tables`` (a datacenter tier's, beside the application's
    rows that must not go back): restored with ``support.rewind.restore`` like a whole dump."""
    if make_url(url).get_backend_name() == "postgresql":
        args, env = _pg_args(url)
        argv = [
            str(_postgresql_bindir() / "pg_dump"),
            *args,
            "--format=custom",
            f"--file={path}",
            *(f"--table={t}" for t in tables),
            f"--dbname={make_url(url).database}",
        ]
        _run_tool(argv, env=env)
    else:
        args, env, database = _mariadb_args(url)
        argv = [
            _mariadb_tool("dump"),
            "--no-defaults",
            *args,
            "--single-transaction",
            "--skip-dump-date",
            database,
            *tables,
        ]
        _run_tool(argv, env=env, stdout=path)
    return path


# -- the layout --------------------------------------------------------------------------------


@dataclass
class Env:
    workdir: Path
    pg: PgPair
    b: ServerProcess
    a_url: str  # a's ticket database, wherever a is now (the primary, then the promoted one)
    a_replica_url: str
    b_url: str
    dcs: list[str]
    proxies: list[dict[str, FollowingProxy]]  # per datacenter: {"a": ..., "b": ...}
    promoted: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def server(self, name: str) -> ServerProcess:
        if name == "b":
            return self.b
        return self.pg.replica if self.promoted else self.pg.primary

    def url(self, name: str) -> str:
        return self.b_url if name == "b" else self.a_url

    @property
    def pair(self) -> list[str]:
        return [self.a_url, self.b_url]


def _stop_server(server: ServerProcess) -> None:
    with contextlib.suppress(Exception):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGCONT)
    server.kill()


@contextlib.contextmanager
def setup() -> Iterator[Env]:
    """The private servers (stopped afterwards, whatever happens), the throwaway datacenter
    databases, and a proxy per datacenter and global server."""
    with contextlib.ExitStack() as stack:
        workdir = Path(tempfile.mkdtemp(prefix="tickets_campaign_"))
        workdir.chmod(0o755)  # PostgreSQL runs as its own OS user and must reach its dirs
        stack.callback(shutil.rmtree, workdir, True)
        h.log("  starting a (PostgreSQL primary + async replica) and b (MariaDB)")
        pg = start_postgresql_pair(workdir / "a")
        stack.callback(_stop_server, pg.primary)
        stack.callback(_stop_server, pg.replica)
        with pg_connect(pg.primary.url) as conn:
            conn.execute("CREATE DATABASE campaign_global")
        a_url, a_replica_url = pg.database_urls("campaign_global")
        b = start_private_mariadb(workdir / "b")
        stack.callback(_stop_server, b)
        admin = sa.create_engine(b.url, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        with admin.connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE campaign_global")
        admin.dispose()
        b_url = b.url + "campaign_global"
        dcs = [
            stack.enter_context(h.throwaway_database(backend)).render_as_string(False)
            for backend in ("postgresql", "mysql")
        ]
        proxies: list[dict[str, FollowingProxy]] = []
        for _ in dcs:
            row = {}
            for name, url in (("a", a_url), ("b", b_url)):
                row[name] = FollowingProxy.for_url(url)
                stack.callback(row[name].close)
            proxies.append(row)
        yield Env(workdir, pg, b, a_url, a_replica_url, b_url, dcs, proxies)


def prepare(env: Env) -> list[tuple[int, int]]:
    """Tables, the sequence's first contact everywhere; each global server's last id."""
    pair = TicketServers(env.pair, timeout=30.0)
    try:
        pair.next_id(SEQ)
        pair.next_id(SEQ)
        for dc in env.dcs:
            engine = sa.create_engine(dc)
            Base.metadata.create_all(engine)
            engine.dispose()
            create_datacenter_tables(dc, timeout=30.0)
            with DatacenterTier(dc, upstream=pair, timeout=30.0, **TIER_OPTIONS) as tier:
                tier.next_id(SEQ)
                tier.wait_idle(30.0)
    finally:
        pair.close()
    env.pg.wait_caught_up()
    return global_last(env.pair)


def last_id(url: str) -> tuple[int, int]:
    server = TicketServer(url, timeout=30.0)
    try:
        info = server.describe(SEQ)
    finally:
        server.close()
    assert info is not None and info.last_id is not None
    return info.last_id, info.increment


def global_last(pair: Sequence[str]) -> list[tuple[int, int]]:
    return [last_id(url) for url in pair]


def stock(dc: str) -> int:
    for status in describe_datacenter(dc, timeout=10.0):
        if status.sequence == SEQ:
            return int(status.stock)
    return 0


# -- the schedule ------------------------------------------------------------------------------


@dataclass
class Fault:
    at: float  # planned start, seconds into the run
    kind: str
    params: dict[str, Any]


def schedule(rng: random.Random, duration: float, smoke: bool, slots: int) -> list[Fault]:
    """Every fault of the run, drawn before it starts: the same seed, the same faults."""

    def params(kind: str) -> dict[str, Any]:
        short = 0.5 if smoke else 1.0  # durations scale down in smoke runs
        p: dict[str, Any] = {}
        if kind in ("kill_worker", "stop_worker"):
            p["slot"] = rng.randrange(slots)
        if kind in ("kill_server", "stop_server", "cut_link", "hang_link", "restore_global"):
            p["server"] = rng.choice(("a", "b"))
        if kind in ("cut_link", "hang_link"):
            p["dc"] = rng.choice((0, 1, "both"))
            p["seconds"] = round(rng.uniform(2, 8) * short, 2)
        if kind == "stop_worker":
            p["seconds"] = round(rng.uniform(1, 5) * short, 2)
        if kind == "kill_server":
            p["seconds"] = round(rng.uniform(1, 5) * short, 2)
        if kind == "stop_server":
            p["seconds"] = round(rng.uniform(1, 4) * short, 2)
        if kind == "restore_tier":
            p["dc"] = rng.randrange(2)
        if kind in ("restore_global", "restore_tier"):
            p["pick"] = rng.random()  # which of the dumps old enough, when it comes
        return p

    faults: list[Fault] = []
    if smoke:
        kinds = [k for k in KINDS if k != "promote"]
        rng.shuffle(kinds)
        kinds.insert(3, "promote")  # early enough for the workers to meet the promoted server
        t = 4.0
        for kind in kinds:
            faults.append(Fault(round(t, 2), kind, params(kind)))
            t += rng.uniform(1.0, 2.0) + float(faults[-1].params.get("seconds", 0.5))
        return faults
    promote_at = rng.uniform(0.3, 0.6) * duration
    kinds, weights = list(WEIGHTS), list(WEIGHTS.values())
    t = 15.0
    while t < duration - 15:
        if promote_at is not None and t >= promote_at:
            kind, promote_at = "promote", None
        else:
            kind = rng.choices(kinds, weights)[0]
        faults.append(Fault(round(t, 2), kind, params(kind)))
        t += rng.uniform(2.5, 8.0) + float(faults[-1].params.get("seconds", 1.0))
    return faults


# -- the nemesis -------------------------------------------------------------------------------


class Nemesis:
    """Runs the schedule in a thread, one fault at a time, and dumps every server and tier
    every ``dump_every`` seconds in between. Each fault is logged with its start, end, kind,
    target, what it did and any error; a fault that fails does not stop the campaign."""

    def __init__(
        self,
        env: Env,
        faults: list[Fault],
        workers: Workers,
        *,
        t0: float,
        until: float,
        dump_every: float,
        min_age: float,
        smoke: bool,
    ) -> None:
        self.env, self.faults, self.workers = env, faults, workers
        self.t0, self.until, self.dump_every, self.min_age = t0, until, dump_every, min_age
        self.smoke = smoke
        self.done: list[dict[str, Any]] = []
        self.dumps: dict[str, list[tuple[float, Path]]] = {
            k: [] for k in ("a", "b", "tier0", "tier1")
        }
        self.dump_errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._last_dump = -1e9
        (env.workdir / "dumps").mkdir(exist_ok=True)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def _sleep(self, seconds: float) -> None:
        self.stop.wait(max(0.0, seconds))

    def _run(self) -> None:
        try:
            for fault in self.faults:
                while not self.stop.is_set() and self.now() < fault.at:
                    if self.now() - self._last_dump >= self.dump_every:
                        self._dump_all()
                    self._sleep(min(0.2, fault.at - self.now()))
                if self.stop.is_set() or self.now() >= self.until:
                    break
                self._inject(fault)
            while not self.stop.is_set() and self.now() < self.until:
                self._sleep(0.2)
        except BaseException:  # the campaign reports it; the run goes on without a nemesis
            self.done.append(
                {"t": self.now(), "kind": "nemesis_crashed", "error": traceback.format_exc()}
            )

    def _dump_all(self) -> None:
        self._last_dump = self.now()
        targets = {
            "a": (self.env.a_url, None),
            "b": (self.env.b_url, None),
            "tier0": (self.env.dcs[0], TIER_TABLES),
            "tier1": (self.env.dcs[1], TIER_TABLES),
        }
        for key, (url, tables) in targets.items():
            n = len(self.dumps[key])
            suffix = "dump" if make_url(url).get_backend_name() == "postgresql" else "sql"
            path = self.env.workdir / "dumps" / f"{key}_{n:03d}.{suffix}"
            at = self.now()
            try:
                dump_tables(url, path, tables) if tables else dump(url, path)
            except Exception as error:
                self.dump_errors.append(f"{at:.1f} s {key}: {error}"[:500])
                continue
            self.dumps[key].append((at, path))

    def _pick_dump(self, key: str, pick: float) -> tuple[float, Path] | None:
        now = self.now()
        old = [d for d in self.dumps[key] if now - d[0] >= self.min_age]
        if not old:
            return None
        return old[min(len(old) - 1, int(pick * len(old)))]

    def _inject(self, fault: Fault) -> None:
        record: dict[str, Any] = {
            "t": self.now(),
            "planned": fault.at,
            "kind": fault.kind,
            **fault.params,
        }
        h.log(f"  {record['t']:6.1f} s: {fault.kind} {fault.params}")
        try:
            record.update(getattr(self, f"_{fault.kind}")(**fault.params) or {})
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {error}"[:800]
            h.log(f"          {fault.kind} failed: {record['error'][:300]}")
        record["end"] = self.now()
        self.done.append(record)

    # -- the faults ----------------------------------------------------------------------

    def _kill_worker(self, slot: int) -> dict[str, Any]:
        old = self.workers.kill(slot)
        self.workers.start(slot)
        return {"log": old}

    def _stop_worker(self, slot: int, seconds: float) -> dict[str, Any]:
        pid = self.workers.pid(slot)
        os.kill(pid, signal.SIGSTOP)
        try:
            self._sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)
        return {"pid": pid}

    def _restart(self, server: ServerProcess) -> None:
        for attempt in range(1, 6):
            try:
                server.restart(60)
                return
            except Exception:
                if attempt == 5:
                    raise
                time.sleep(2)

    def _kill_server(self, server: str, seconds: float) -> dict[str, Any]:
        process = self.env.server(server)
        process.kill()
        try:
            self._sleep(seconds)
        finally:
            self._restart(process)
        return {"port": process.port}

    def _stop_server(self, server: str, seconds: float) -> dict[str, Any]:
        process = self.env.server(server)
        os.killpg(process.pid, signal.SIGSTOP)
        try:
            self._sleep(seconds)
        finally:
            os.killpg(process.pid, signal.SIGCONT)
        return {"port": process.port}

    def _link(self, server: str, dc: int | str, seconds: float, mode: str) -> dict[str, Any]:
        proxies = [row[server] for i, row in enumerate(self.env.proxies) if dc in (i, "both")]
        for proxy in proxies:
            getattr(proxy, mode)()
        try:
            self._sleep(seconds)
        finally:
            for proxy in proxies:
                proxy.forward()
        return {}

    def _cut_link(self, server: str, dc: int | str, seconds: float) -> dict[str, Any]:
        return self._link(server, dc, seconds, "refuse")

    def _hang_link(self, server: str, dc: int | str, seconds: float) -> dict[str, Any]:
        return self._link(server, dc, seconds, "hang")

    def _restore_global(self, server: str, pick: float) -> dict[str, Any]:
        chosen = self._pick_dump(server, pick)
        if chosen is None:
            return {"skipped": "no dump old enough yet"}
        at, path = chosen
        url = self.env.url(server)
        before = last_id(url)[0]
        restore(url, path, lock_timeout=10)
        after = last_id(url)[0]
        return {
            "dump_taken_at": at,
            "dump": path.name,
            "last_id_before": before,
            "last_id_after": after,
            "went_back_by_ids": before - after,
        }

    def _restore_tier(self, dc: int, pick: float) -> dict[str, Any]:
        chosen = self._pick_dump(f"tier{dc}", pick)
        if chosen is None:
            return {"skipped": "no dump old enough yet"}
        at, path = chosen
        before = stock(self.env.dcs[dc])
        restore(self.env.dcs[dc], path, lock_timeout=10)
        return {
            "dump_taken_at": at,
            "dump": path.name,
            "stock_before": before,
            "stock_after_restore": stock(self.env.dcs[dc]),
        }

    def _promote(self) -> dict[str, Any]:
        env = self.env
        if env.promoted:
            return {"skipped": "a was promoted already"}
        env.pg.wait_caught_up()
        replicated = last_id(env.a_url)[0]
        env.pg.cut_replication()
        # Let the workers take blocks the replica will never see (bounded).
        deadline = time.monotonic() + (4.0 if self.smoke else 25.0)
        primary_last = replicated
        while time.monotonic() < deadline and not self.stop.is_set():
            primary_last = last_id(env.a_url)[0]
            if primary_last > replicated:
                self._sleep(0.5 if self.smoke else 2.0)
                primary_last = last_id(env.a_url)[0]
                break
            self._sleep(0.25)
        env.pg.crash_primary()
        crashed_at = self.now()
        env.pg.promote()
        with env.lock:
            env.a_url = env.a_replica_url
            env.promoted = True
        for row in env.proxies:
            row["a"].follow(env.a_url)
        promoted_last = last_id(env.a_url)[0]
        return {
            "replicated_last_id": replicated,
            "primary_last_id_before_crash": primary_last,
            "promoted_last_id": promoted_last,
            "ids_the_replica_missed_at_least": primary_last - promoted_last,
            "crashed_at": crashed_at,
            "failover_seconds": self.now() - crashed_at,
        }


class Workers:
    """The worker processes, by slot (slot % 2 is the datacenter), restartable."""

    def __init__(self, env: Env, logs: Path, stop: Any, per_dc: int) -> None:
        self.env, self.logs, self.stop = env, logs, stop
        self.ctx = multiprocessing.get_context("spawn")
        self.slots = 2 * per_dc
        self.live: dict[int, tuple[Any, Path]] = {}
        self.paths: list[Path] = []
        self.dc_of: dict[Path, int] = {}
        self.kills: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def start(self, slot: int) -> None:
        dc = slot % 2
        with self.lock:
            path = self.logs / f"worker{slot}_{len(self.paths):03d}.log"
            self.paths.append(path)
            self.dc_of[path] = dc
        pair = [
            self.env.proxies[dc][s].url(u)
            for s, u in (("a", self.env.a_url), ("b", self.env.b_url))
        ]
        process = self.ctx.Process(
            target=_worker,
            args=(
                slot,
                self.env.dcs[dc],
                pair,
                str(path),
                str(path.with_suffix(".err")),
                self.stop,
            ),
            name=f"campaign-worker{slot}",
        )
        process.start()
        with self.lock:
            self.live[slot] = (process, path)

    def pid(self, slot: int) -> int:
        with self.lock:
            return int(self.live[slot][0].pid)

    def kill(self, slot: int) -> str:
        with self.lock:
            process, path = self.live[slot]
        process.kill()
        process.join(30)
        self.kills.append({"slot": slot, "log": path.name, "at": time.monotonic()})
        return path.name

    def stop_all(self, timeout: float) -> list[str]:
        """Stop every worker cleanly; the ones still alive after ``timeout`` are killed (and
        named: a worker that did not stop cleanly is a finding)."""
        self.stop.set()
        unclean = []
        deadline = time.monotonic() + timeout
        with self.lock:
            live = list(self.live.values())
        for process, path in live:
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signal.SIGCONT)
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                unclean.append(path.name)
                with contextlib.suppress(ProcessLookupError, TypeError):
                    os.kill(process.pid, signal.SIGUSR1)  # its threads' stacks, to its log
                time.sleep(1.0)
                process.kill()
                process.join(10)
        return unclean

    def kill_all(self) -> None:
        with self.lock:
            live = list(self.live.values())
        for process, _ in live:
            if process.is_alive():
                process.kill()
                process.join(10)


# -- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace, env: Env, logs: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    workers = Workers(env, logs, multiprocessing.get_context("spawn").Event(), args.workers)
    faults = schedule(rng, args.duration, args.smoke, workers.slots)
    h.log(f"  seed {args.seed}: {len(faults)} faults scheduled over {args.duration:g} s")
    try:
        for slot in range(workers.slots):
            workers.start(slot)
        deadline = time.monotonic() + 180
        while not all(p.exists() for p in workers.paths):  # every worker running: the clock
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start within 180 s")
            time.sleep(0.1)
        t0, wall0 = time.monotonic(), time.time()
        nemesis = Nemesis(
            env,
            faults,
            workers,
            t0=t0,
            until=args.duration - (2 if args.smoke else 10),
            dump_every=3.0 if args.smoke else 20.0,
            min_age=2.0 if args.smoke else 10.0,
            smoke=args.smoke,
        )
        nemesis.thread.start()
        samples: list[dict[str, Any]] = []
        next_sample = 0.0
        try:
            while True:
                now = time.monotonic() - t0
                if now >= next_sample:
                    sample: dict[str, Any] = {"t": now, "load": list(os.getloadavg())}
                    with contextlib.suppress(Exception):
                        sample["stock"] = [stock(dc) for dc in env.dcs]
                    samples.append(sample)
                    next_sample += 2.0 if args.smoke else 5.0
                if now >= args.duration:
                    break
                time.sleep(0.2)
        finally:
            nemesis.stop.set()
            nemesis.thread.join(120)  # the fault under way finishes (bounded by its duration)
        stopping = time.monotonic()
        unclean = workers.stop_all(60)
        end = time.monotonic() - t0
    finally:
        workers.kill_all()
    return {
        "t0": t0,
        "wall0": wall0,
        "end": end,
        "faults": nemesis.done,
        "faults_not_run": [vars(f) for f in faults if f.at >= nemesis.until][:50],
        "dumps": {k: [(round(t, 1), p.name) for t, p in v] for k, v in nemesis.dumps.items()},
        "dump_errors": nemesis.dump_errors,
        "samples": samples,
        "paths": workers.paths,
        "dc_of": workers.dc_of,
        "kills": workers.kills,
        "unclean_stops": unclean,
        "stopping": stopping,
        "nemesis_alive": nemesis.thread.is_alive(),
    }


def stacks(paths: list[Path], name: str) -> str:
    """The thread stacks a worker that did not stop wrote on SIGUSR1 (faulthandler)."""
    path = next(p for p in paths if p.name == name).with_suffix(".err")
    text = path.read_text(errors="replace") if path.exists() else ""
    at = text.find("Thread 0x")
    return text[at : at + 6000] if at >= 0 else ""


def read_tables(dc: str) -> dict[str, list[int]]:
    engine = sa.create_engine(dc, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return {
                model.__tablename__: [int(i) for i in conn.scalars(sa.select(model.id))]
                for model in (Order, Line)
            }
    finally:
        engine.dispose()


def read_stock(dc: str) -> list[range]:
    """The ranges in a datacenter tier's stock (ids it will hand out later)."""
    engine = sa.create_engine(dc, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(f"SELECT first_id, last_id, step FROM {TIER_TABLES[0]}")
            ).all()
    finally:
        engine.dispose()
    return [range(int(r[0]), int(r[1]) + 1, int(r[2])) for r in rows]


def latent_duplicates(stocks: list[list[range]], used: set[int]) -> dict[str, Any]:
    """Ids still in a stock that a table already holds, or in both datacenters' stocks: they
    would be handed out again later."""
    in_use = sorted(i for ranges in stocks for r in ranges for i in r if i in used)
    both = set(i for r in stocks[0] for i in r) & set(i for r in stocks[1] for i in r)
    return {
        "in_stock_and_in_a_table": in_use[:100],
        "count_in_use": len(in_use),
        "in_both_stocks": sorted(both)[:100],
        "count_in_both": len(both),
    }


def analyse(
    env: Env, base: list[tuple[int, int]], stock0: list[int], outcome: dict[str, Any]
) -> dict[str, Any]:
    t0 = outcome["t0"]
    logs = {p: read_log(p) for p in outcome["paths"]}
    names = {env.a_url: "a", env.a_replica_url: "a", env.b_url: "b"}
    for d, row in enumerate(env.proxies):
        names[row["a"].url(env.a_url)] = "a"
        names[row["a"].url(env.a_replica_url)] = "a"
        names[row["b"].url(env.b_url)] = "b"
        names[env.dcs[d]] = f"dc{d}"
    names = {make_url(u).render_as_string(hide_password=True): n for u, n in names.items()}
    warnings = {
        p: read_warnings(p.with_suffix(".err"), outcome["wall0"], names) for p in outcome["paths"]
    }
    tables = [read_tables(dc) for dc in env.dcs]
    # Duplicates: an id twice in one table cannot be (primary key); in two tables of one
    # datacenter, or in both datacenters, it can.
    every: Counter[int] = Counter()
    for per_dc in tables:
        for ids in per_dc.values():
            every.update(ids)
    doubled = sorted(i for i, n in every.items() if n > 1)
    where: dict[int, list[str]] = {}
    for d, per_dc in enumerate(tables):
        for name, ids in per_dc.items():
            for i in set(ids) & set(doubled):
                where.setdefault(i, []).append(f"dc{d}.{name}")
    # Acknowledged rows: each id a worker logged as committed, in the table it went to.
    lost: list[dict[str, Any]] = []
    for path, log in logs.items():
        d = outcome["dc_of"][path]
        orders, lines = set(tables[d]["campaign_orders"]), set(tables[d]["campaign_lines"])
        for t, ids in log["commits"]:
            missing = [i for i in ids[:1] if i not in orders]
            missing += [i for i in ids[1:] if i not in lines]
            if missing:
                lost.append({"t": t - t0, "log": path.name, "ids": missing})
    # Who committed each id, when: the duplicates' runs, with their times.
    seen: dict[int, list[tuple[float, str, int]]] = {}
    for path, log in logs.items():
        for t, ids in log["commits"]:
            for i in ids:
                seen.setdefault(i, []).append((t - t0, path.name, outcome["dc_of"][path]))
    failures = [
        {**f, "t": f["t"] - t0, "dc": outcome["dc_of"][p], "log": p.name}
        for p, log in logs.items()
        for f in log["failures"]
    ]
    by_class = Counter(f["class"] for f in failures)
    not_tickets = [f for f in failures if not f["tickets_error"]]
    refused_by_callers = sum(1 for f in failures if f["class"].endswith(".RewindError"))
    duplicate_inserts = [f for f in failures if f["duplicate"]]
    # Rewinds: each process's last report of stats()["rewinds"] (a clean exit's, else its last
    # heartbeat's), and its WARNING lines.
    rewinds_reported = 0
    tier_burned = 0
    for log in logs.values():
        last = log["end"] or (log["beats"][-1] if log["beats"] else None)
        if last is not None:
            rewinds_reported += last[2]
            tier_burned += last[3]
    warn_counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    discarded = 0
    for w in warnings.values():
        warn_counts.update(w["counts"])
        discarded += w["discarded_ids"]
        for k, v in w["examples"].items():
            examples.setdefault(k, v)
    held_at_kill = []
    for kill in outcome["kills"]:
        log = logs[next(p for p in logs if p.name == kill["log"])]
        held_at_kill.append(log["beats"][-1][1] if log["beats"] else 0)
    clean_burned = sum(log["end"][1] for log in logs.values() if log["end"] is not None)
    rows = sum(len(ids) for per_dc in tables for ids in per_dc.values())
    last = global_last(env.pair)
    advance = sum((now - b) // step for (now, step), (b, _) in zip(last, base, strict=True))
    stocks = [stock(dc) for dc in env.dcs]
    latent = latent_duplicates([read_stock(dc) for dc in env.dcs], set(every))
    # A global server whose next ids are below ids of its lane already in a table: harmless
    # while every process knows a floor above them, a duplicate for one that does not.
    behind = []
    for name, (now_last, step) in zip("ab", last, strict=True):
        lane = [i for i in every if i % step == now_last % step]
        if lane and max(lane) > now_last:
            behind.append({"server": name, "last_id": now_last, "highest_in_tables": max(lane)})
    # Liveness: the longest a worker went without finishing a commit (C) or failing one (F),
    # up to its SIGKILL or to the moment it was told to stop. Every wait in the library is
    # bounded by a timeout of seconds, so a stall of STALL_SECONDS is a caller blocked.
    killed_at = {k["log"]: k["at"] for k in outcome["kills"]}
    stalls = []
    for path, log in logs.items():
        times = sorted([t for t, _ in log["commits"]] + [f["t"] for f in log["failures"]])
        if not times:
            continue
        until = killed_at.get(path.name, outcome["stopping"])
        gaps = [(b - a, a) for a, b in zip(times, times[1:], strict=False)]
        gaps.append((until - times[-1], times[-1]))
        gap, since = max(gaps)
        stalls.append(
            {"log": path.name, "longest_gap": round(gap, 2), "from_t": round(since - t0, 2)}
        )
    stalled = [x for x in stalls if x["longest_gap"] >= STALL_SECONDS]
    faults = outcome["faults"]
    kinds = Counter(f["kind"] for f in faults if "skipped" not in f and "error" not in f)
    return {
        "rows_written": rows,
        "rows_per_datacenter": [sum(len(v) for v in per_dc.values()) for per_dc in tables],
        "rows_per_table": [{k: len(v) for k, v in per_dc.items()} for per_dc in tables],
        "duplicates": len(doubled) + len(duplicate_inserts),
        "ids_in_two_tables_or_datacenters": len(doubled),
        "duplicate_ids": [{"id": i, "in": where.get(i, [])} for i in doubled[:200]],
        "duplicate_runs": duplicate_runs(seen),
        "inserts_refused_as_duplicate_key": len(duplicate_inserts),
        "duplicate_key_failures": duplicate_inserts[:50],
        "latent_duplicates": latent["count_in_use"] + latent["count_in_both"],
        "latent_duplicate_ids": latent,
        "global_servers_behind_ids_in_use_at_end": behind,
        "rows_lost": sum(len(x["ids"]) for x in lost),
        "lost": lost[:200],
        "acknowledged_ids": sum(len(ids) for log in logs.values() for _, ids in log["commits"]),
        "failed_inserts": len(failures),
        "caller_errors_by_class": dict(by_class),
        "caller_errors_not_tickets_error": len(not_tickets),
        "caller_errors_not_tickets_error_examples": not_tickets[:20],
        "rewind_errors_seen_by_callers": refused_by_callers,
        "rewinds_reported_by_workers": rewinds_reported,
        "warning_lines": dict(warn_counts),
        "warning_examples": examples,
        "tier_stock_discarded_ids": discarded,
        "rewind_log": sorted(
            (r for w in warnings.values() for r in w["rewinds"]), key=lambda r: r["t"]
        )[:1000],
        "ids_burned": clean_burned + sum(held_at_kill) + tier_burned + discarded,
        "ids_burned_parts": {
            "clean_closes": clean_burned,
            "held_by_killed_workers_at_last_heartbeat": sum(held_at_kill),
            "refused_or_dropped_by_tiers": tier_burned,
            "tier_stocks_discarded_after_tier_restores": discarded,
        },
        "global_advance_in_ids": advance,
        "global_advance_not_in_rows_or_stock": advance - rows - (sum(stocks) - sum(stock0)),
        "workers_started": len(logs),
        "worker_kills": len(outcome["kills"]),
        "unclean_stops": outcome["unclean_stops"],
        "stalled_workers": len(stalled)
        + len(set(outcome["unclean_stops"]) - {x["log"] for x in stalled}),
        "stalls": stalled,
        "stacks_of_workers_that_did_not_stop": {
            name: stacks(outcome["paths"], name) for name in outcome["unclean_stops"]
        },
        "longest_gap_between_commits": max((x["longest_gap"] for x in stalls), default=None),
        "faults_injected": sum(kinds.values()),
        "faults_by_kind": dict(sorted(kinds.items())),
        "faults_failed": [f for f in faults if "error" in f],
        "faults_skipped": [f for f in faults if "skipped" in f],
        "faults": faults,
        "faults_not_run": outcome["faults_not_run"],
        "dumps": outcome["dumps"],
        "dump_errors": outcome["dump_errors"],
        "nemesis_still_running_at_end": outcome["nemesis_alive"],
        "samples": outcome["samples"],
        "failures": failures[:500],
        "commit_timeline": {
            f"dc{d}": sorted(
                round(t - t0, 3)
                for p, log in logs.items()
                if outcome["dc_of"][p] == d
                for t, _ in log["commits"]
            )
            for d in range(2)
        },
        "run_seconds": outcome["end"],
    }


def draw(env_info: dict[str, Any], res: dict[str, Any], duration: float, seed: int) -> Any:
    """Rows per second in each datacenter over the run, above a timeline of the faults, the
    failed inserts and the commits of duplicated ids (one row each)."""
    plt = h.pyplot()
    fig, (a1, a2) = plt.subplots(
        2, 1, figsize=(12, 7.5), sharex=True, gridspec_kw={"height_ratios": [1, 1.15]}
    )
    fig.suptitle(
        f"Fault campaign (seed {seed}): rows/s in two datacenters under a seeded nemesis",
        fontsize=12,
    )
    fig.text(
        0.01,
        0.01,
        f"every fault and figure in the JSON; {h.load_text(env_info)} at start",
        fontsize=7.5,
        color="dimgray",
    )
    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.08, top=0.9, hspace=0.25)
    width = 2.0 if duration <= 60 else 5.0
    bins = [i * width for i in range(int(duration / width) + 2)]
    for d, times in res["commit_timeline"].items():
        counts = [0] * len(bins)
        for t in times:
            i = int(t / width)
            if 0 <= i < len(counts):
                counts[i] += IDS_PER_COMMIT
        a1.plot([b + width / 2 for b in bins], [c / width for c in counts], label=d, linewidth=1)
    for f in res["faults"]:
        if "skipped" not in f:
            a1.axvline(f["t"], color=COLORS.get(f["kind"], "black"), linewidth=0.6, alpha=0.5)
    a1.set_xlim(0, duration)
    a1.set_ylim(bottom=0)
    a1.set_ylabel(f"rows per second ({width:g} s bins)", fontsize=9)
    a1.set_title(
        f"{res['rows_written']:,} rows, {res['duplicates']} duplicates, {res['rows_lost']} lost, "
        f"{res['failed_inserts']} failed inserts (lines: fault starts, colored as below)",
        fontsize=10,
    )
    a1.legend(fontsize=8, loc="lower left")
    rows = [*KINDS, "failed insert", "duplicate committed"]
    for f in res["faults"]:
        if "skipped" in f:
            continue
        y = rows.index(f["kind"]) if f["kind"] in rows else 0
        color = COLORS.get(f["kind"], "black")
        alpha = 0.3 if "error" in f else 0.9
        a2.scatter([f["t"]], [y], marker="|", s=140, color=color, alpha=alpha)
        if f["end"] - f["t"] >= 0.3:
            a2.plot(
                [f["t"], f["end"]],
                [y, y],
                color=color,
                linewidth=6,
                alpha=alpha,
                solid_capstyle="butt",
            )
    fails = [f["t"] for f in res["failures"]]
    a2.scatter(
        fails, [rows.index("failed insert")] * len(fails), marker="|", s=140, color="tab:red"
    )
    y = rows.index("duplicate committed")
    for dup in res.get("duplicate_runs", []):
        for c in dup["committed"].values():
            a2.plot(
                [c["first_t"], max(c["last_t"], c["first_t"] + 0.5)],
                [y, y],
                color="tab:red",
                linewidth=6,
                solid_capstyle="butt",
            )
    a2.set_yticks(range(len(rows)), rows, fontsize=8)
    a2.set_ylim(len(rows) - 0.5, -0.5)
    a2.grid(axis="y", color="0.9")
    a2.set_xlabel("seconds into the run", fontsize=9)
    a2.set_title(
        f"{res['faults_injected']} faults; rewinds healed {res['rewinds_reported_by_workers']}, "
        f"refused {res['rewind_errors_seen_by_callers']}; caller errors not TicketsError "
        f"{res['caller_errors_not_tickets_error']}",
        fontsize=10,
    )
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--duration", type=float, default=None, help="seconds (600)")
        parser.add_argument("--workers", type=int, default=None, help="per datacenter (2)")
        parser.add_argument("--seed", type=int, default=1, help="the nemesis's random seed")
        parser.add_argument("--logs", type=Path, default=None, help="keep worker logs here")

    args = h.parse_args(__doc__, argv, extra, backends=("postgresql", "mysql"))
    args.duration = args.duration or (32.0 if args.smoke else 600.0)
    args.workers = args.workers or (1 if args.smoke else 2)
    h.log(f"campaign: seed {args.seed}, {args.duration:g} s, {args.workers} workers per dc")
    env_info = h.environment()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tickets_campaign_logs_") as tmp, setup() as env:
        base = prepare(env)
        stock0 = [stock(dc) for dc in env.dcs]
        logs = Path(tmp) / "logs"
        logs.mkdir()
        outcome = run(args, env, logs)
        results = analyse(env, base, stock0, outcome)
        if args.logs is not None:  # the workers' raw logs, for a finding's evidence
            shutil.rmtree(args.logs, ignore_errors=True)
            shutil.copytree(logs, args.logs)
    results["wall_seconds"] = time.monotonic() - started
    checks = {
        key: {"median": results[key], "target": 0, "passed": results[key] == 0}
        for key in (
            "duplicates",
            "latent_duplicates",
            "rows_lost",
            "caller_errors_not_tickets_error",
            "stalled_workers",
        )
    }
    h.log(
        f"seed {args.seed}: {results['faults_injected']} faults {results['faults_by_kind']}; "
        f"rows {results['rows_written']:,}, duplicates {results['duplicates']}, lost "
        f"{results['rows_lost']}, failed inserts {results['failed_inserts']} "
        f"{results['caller_errors_by_class']}, non-TicketsError "
        f"{results['caller_errors_not_tickets_error']}, rewinds healed "
        f"{results['rewinds_reported_by_workers']} (warnings {results['warning_lines']}), "
        f"RewindError at callers {results['rewind_errors_seen_by_callers']}, stalled workers "
        f"{results['stalled_workers']} {results['unclean_stops']}, burned "
        f"{results['ids_burned']:,}; {results['wall_seconds']:.0f} s"
    )
    for dup in results["duplicate_runs"]:
        h.log(
            f"  DUPLICATES: {dup['count']} ids {dup['first_id']}..{dup['last_id']} of "
            f"{dup['lane']}, committed by {dup['committed']}"
        )
    code = h.report(
        args,
        NAME,
        env=env_info,
        parameters={
            "seed": args.seed,
            "duration": args.duration,
            "workers_per_datacenter": args.workers,
            "ids_per_second_per_worker": IDS_PER_COMMIT / TICK,
            "tier_options": TIER_OPTIONS,
            "weights": WEIGHTS,
            "load_average_at_end": list(os.getloadavg()),
        },
        results=results,
        checks=checks,
        figure=draw(env_info, results, args.duration, args.seed),
    )
    failed = any(not c["passed"] for c in checks.values())
    return 1 if failed else code


if __name__ == "__main__":
    sys.exit(main())
