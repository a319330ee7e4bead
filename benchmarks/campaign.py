"""Fault campaign, Jepsen-style: two datacenters' worker processes insert rows through the ORM into
sharded application databases while a seeded nemesis kills, stops, cuts, hangs, restores and fails
over what they depend on; a checker then reads every table.

Workers ``configure(CachedSource(DatacenterTier(dc, upstream=TicketServers([a, b]))))``, ``a`` a
private PostgreSQL with a replica, ``b`` a private MariaDB, reached through proxies. ``--schedule
random`` (600 s): faults drawn from ``--seed``, one at a time, and once ``a``'s replica promoted;
``--schedule soak`` (300 s; ``campaign_soak.json``): workers killed, links cut, ``b`` killed, at
fixed times. Checks, all 0 (exit 1 otherwise): duplicates, latent duplicates, acknowledged rows
lost, caller errors not ``TicketsError``, stalled workers, and with the soak failed inserts while
the stock held ids.

    .venv/bin/python benchmarks/campaign.py [--smoke] [--duration 600] [--seed 1] [--workers 2]
        [--schedule random|soak] [--logs DIR]   # --logs: keep the workers' logs there
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _harness as h
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from sqlalchemy_tickets import TicketId, TicketServer, TicketServers  # noqa: E402
from support.rewind import FollowingProxy, dump, pg_connect, restore, start_postgresql_pair  # noqa: E402
from support.servers import ServerProcess, start_private_mariadb  # noqa: E402

NAME, SEQ, LINES, TICK = "campaign", "campaign", 2, 0.25
STALL_SECONDS = 30.0  # every wait in the library is bounded by seconds; the longest fault, 8 s
#: The tier's tables in a datacenter database (``docs/alembic.md``): what a tier restore puts
#: back; the first is the stock the latent-duplicate check reads.
TIER_TABLES = ("tickets_dc__stock", "tickets_dc__state", "tickets_stamps")
TIER_OPTIONS: dict[str, Any] = {"supply": 10.0, "min_block": 100, "claim_timeout": 4.0}
WEIGHTS = {"kill_worker": 3, "stop_worker": 2, "kill_server": 2, "stop_server": 1, "cut_link": 2,
           "hang_link": 2, "restore_global": 3, "restore_tier": 2}
KINDS = (*WEIGHTS, "promote")
COLORS = dict(zip(KINDS, ("black", "tab:gray", "tab:red", "tab:pink", "tab:blue", "tab:cyan",
                          "tab:purple", "tab:olive", "tab:orange"), strict=True))
#: WARNING lines of a worker, by what they say.
PATTERNS = {k: re.compile(v) for k, v in {
    "healed": r"went back in time.*(no id is issued twice|told it to move above)",
    "healed_identity_changed": r"TicketServer\(.*went back in time: its identity",
    "healed_offered_issued_ids": r"TicketServer\(.*went back in time: it offered",
    "healed_below_an_id_in_use": r"TicketServer\(.*went back in time: its next id",
    "healed_tier_upstream_mark": r"went back in time upstream",
    "tier_discarded": r"datacenter database went back in time",
    "refused": r"Nothing was issued",
    "stock_dropped": r"dropped \d+ ids of .* from its stock",
    "errors": r" (ERROR|CRITICAL) ",
    "tracebacks": r"^Traceback",
}.items()}
DISCARDED = re.compile(r"discarded its stock \((\d+) ids")


class Order(h.Base):
    __tablename__ = "campaign_orders"
    id: Mapped[int] = mapped_column(TicketId(SEQ), primary_key=True)
    worker: Mapped[int]
    n: Mapped[int]
    lines: Mapped[list[Line]] = relationship(back_populates="order")


class Line(h.Base):
    __tablename__ = "campaign_lines"
    id: Mapped[int] = mapped_column(TicketId(SEQ), primary_key=True)
    order_id: Mapped[int] = mapped_column(sa.ForeignKey("campaign_orders.id"))
    k: Mapped[int]
    order: Mapped[Order] = relationship(back_populates="lines")


def worker(spec: tuple[int, str, list[str], str, Any], conn: Any) -> None:
    """An order and its lines committed every ``TICK`` until ``stop`` is set, logged as JSON
    lines: ``C`` a commit's ids, ``F`` a failure, ``H`` a heartbeat a second (ids held, rewinds,
    tier burned), ``E`` a clean exit (every ``stats()``); WARNINGs to ``<log_path>.err``."""
    from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketsError, configure

    slot, dc, pair, log_path, stop = spec
    logging.basicConfig(filename=str(Path(log_path).with_suffix(".err")), level=logging.WARNING,
                        format="%(created).3f %(levelname)s %(name)s %(message)s")
    pair_source = TicketServers(pair, backoff=0.5, max_backoff=2.0)
    tier = DatacenterTier(dc, upstream=pair_source, **TIER_OPTIONS)
    cache = CachedSource(tier)
    configure(cache)
    engine = sa.create_engine(dc, pool_pre_ping=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(kind: str, **fields: Any) -> None:
        os.write(fd, (json.dumps({"k": kind, "t": time.monotonic(), **fields},
                                 default=str) + "\n").encode())

    def figures() -> dict[str, int]:
        s, t = cache.stats(), tier.stats()
        return {"held": s["in_hand"] + s["in_flight"], "rewinds": int(s["rewinds"]),
                "tier_burned": int(t["burned"])}

    n, start, beat = 0, time.monotonic(), 0.0
    try:
        while not stop.is_set():
            if time.monotonic() - beat >= 1.0:
                write("H", **figures())
                beat = time.monotonic()
            try:
                with Session(engine) as session:
                    order = Order(worker=slot, n=n, lines=[Line(k=k) for k in range(LINES)])
                    session.add(order)
                    session.commit()
                    write("C", ids=[x.id for x in (order, *order.lines)])
                n += 1
            except Exception as error:  # every failure is a finding: logged, classified
                write("F", cls=f"{type(error).__module__}.{type(error).__name__}",
                      tickets_error=isinstance(error, TicketsError),
                      duplicate=isinstance(error, sa.exc.IntegrityError),
                      message=" ".join(str(error).split())[:400])
            start += TICK
            time.sleep(max(0.0, start - time.monotonic()))
    finally:
        configure(None)
        burned = cache.close()
        tier.close()
        write("E", burned=burned, **figures(), stats={
            k: v.stats() for k, v in (("cache", cache), ("tier", tier), ("pair", pair_source))})
        pair_source.close()
        engine.dispose()
        os.close(fd)


def read_log(path: Path) -> dict[str, list[dict[str, Any]]]:
    """A worker's log by kind (``C``, ``F``, ``H``, ``E``); a line cut by a SIGKILL is left."""
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in "CFHE"}
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            out[entry["k"]].append(entry)
    return out


def read_warnings(paths: list[Path]) -> tuple[Counter[str], int]:
    """The workers' WARNING lines counted by what they say; the ids of tier stocks discarded."""
    lines = [x for p in paths if p.exists() for x in p.read_text(errors="replace").splitlines()]
    found = Counter(k for line in lines for k, pattern in PATTERNS.items() if pattern.search(line))
    return found, sum(int(m.group(1)) for m in map(DISCARDED.search, lines) if m)


def duplicate_runs(seen: dict[int, list[tuple[float, str]]]) -> list[dict[str, Any]]:
    """Ids committed twice, grouped into runs of one lane (ids of one parity, a few apart):
    each run's ids, and per worker log when it committed them (seconds into the run)."""
    runs: list[list[int]] = []
    for i in sorted(i for i, where in seen.items() if len(where) > 1):
        run = next((r for r in reversed(runs) if r[-1] % 2 == i % 2 and i - r[-1] <= 64), None)
        run.append(i) if run is not None else runs.append([i])
    out = []
    for run in runs:
        by_log: dict[str, list[float]] = {}
        for t, log in (w for i in run for w in seen[i]):
            by_log.setdefault(log, []).append(t)
        out.append({"first_id": run[0], "last_id": run[-1], "count": len(run),
                    "lane": "a (odd)" if run[0] % 2 else "b (even)",
                    "committed": {log: {"first_t": round(min(ts), 1), "last_t": round(max(ts), 1),
                                        "ids": len(ts)} for log, ts in sorted(by_log.items())}})
    return out


def last_id(url: str) -> tuple[int, int]:
    with contextlib.closing(TicketServer(url, timeout=h.SETUP_TIMEOUT)) as server:
        info = server.describe(SEQ)
    assert info is not None and info.last_id is not None
    return info.last_id, info.increment


def read_db(dc: str, sql: Any) -> list[Any]:
    with sa.create_engine(dc, poolclass=sa.pool.NullPool).connect() as conn:  # nothing pooled
        return list(conn.execute(sql).all())


@dataclass
class Fault:
    at: float  # planned start, seconds into the run
    kind: str
    params: dict[str, Any]


def schedule(rng: random.Random, duration: float, smoke: bool, slots: int,
             kind: str = "random") -> list[Fault]:
    """Every fault of the run, drawn before it starts: the same seed, the same faults."""
    if kind == "soak":  # fixed times; only which worker is killed is drawn
        cut, kills = 0.15 * duration, [0.45] if smoke else [k / 12 for k in range(1, 12)]
        faults = [Fault(round(duration * k, 2), "kill_worker", {"slot": rng.randrange(slots)})
                  for k in kills]
        faults += [Fault(round(at, 2), "cut_link", {"server": "both", "dc": dc, "seconds": cut,
                                                    "hang_after": cut / 2})  # refused, then hung
                   for dc, at in ((0, 0.2 * duration), (1, 0.5 * duration))]
        faults.append(Fault(round(0.75 * duration, 2), "kill_server",
                            {"server": "b", "seconds": 1.0 if smoke else 5.0}))
        return sorted(faults, key=lambda f: f.at)

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
        bounds = {"stop_worker": (1, 5), "kill_server": (1, 5), "stop_server": (1, 4)}
        if kind in bounds:
            p["seconds"] = round(rng.uniform(*bounds[kind]) * short, 2)
        if kind == "restore_tier":
            p["dc"] = rng.randrange(2)
        if kind in ("restore_global", "restore_tier"):
            p["pick"] = rng.random()  # which of the dumps old enough, when it comes
        return p

    faults: list[Fault] = []
    if smoke:
        kinds = list(WEIGHTS)
        rng.shuffle(kinds)
        kinds.insert(3, "promote")  # early enough for the workers to meet the promoted server
        t = 4.0
        for kind in kinds:
            faults.append(Fault(round(t, 2), kind, params(kind)))
            t += rng.uniform(1.0, 2.0) + float(faults[-1].params.get("seconds", 0.5))
        return faults
    promote_at: float | None = rng.uniform(0.3, 0.6) * duration
    t = 15.0
    while t < duration - 15:
        if promote_at is not None and t >= promote_at:
            kind, promote_at = "promote", None
        else:
            kind = rng.choices(list(WEIGHTS), list(WEIGHTS.values()))[0]
        faults.append(Fault(round(t, 2), kind, params(kind)))
        t += rng.uniform(2.5, 8.0) + float(faults[-1].params.get("seconds", 1.0))
    return faults


class Campaign:
    """The layout (private servers, datacenter databases, proxies), the workers by slot (``slot %
    2``: the datacenter) and the nemesis, a thread running the faults one at a time (in threads of
    their own when ``overlap``) and dumping servers and tiers between them."""

    def __init__(self, stack: contextlib.ExitStack, args: argparse.Namespace, logs: Path) -> None:
        self.workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="tickets_campaign_", ignore_cleanup_errors=True)))
        self.workdir.chmod(0o755)  # PostgreSQL runs as its own OS user and must reach its dirs
        h.log("  starting a (PostgreSQL primary + async replica) and b (MariaDB)")
        self.pg = start_postgresql_pair(self.workdir / "a")
        stack.callback(halt, self.pg.primary)
        stack.callback(halt, self.pg.replica)
        with pg_connect(self.pg.primary.url) as conn:
            conn.execute("CREATE DATABASE campaign_global")
        self.a_url, self.a_replica_url = self.pg.database_urls("campaign_global")
        self.b = start_private_mariadb(self.workdir / "b")
        stack.callback(halt, self.b)
        with sa.create_engine(self.b.url, isolation_level="AUTOCOMMIT",
                              poolclass=sa.pool.NullPool).connect() as conn:
            conn.exec_driver_sql("CREATE DATABASE campaign_global")
        self.b_url, self.promoted = self.b.url + "campaign_global", False
        self.dcs = h.databases(stack, "postgresql", "mysql")
        self.proxies = [{s: stack.enter_context(FollowingProxy.for_url(u))
                         for s, u in (("a", self.a_url), ("b", self.b_url))} for _ in self.dcs]
        self.args, self.logs, self.smoke = args, logs, args.smoke
        self.fleet = stack.enter_context(h.Fleet(worker))  # the first to go when the stack closes
        self.stop_workers, self.stop = self.fleet.ctx.Event(), threading.Event()
        self.live: dict[int, tuple[Any, Path]] = {}  # slot -> its worker process, its log
        self.dc_of: dict[Path, int] = {}  # every worker's log, in the order they started
        self.kills: list[dict[str, Any]] = []
        self.done: list[dict[str, Any]] = []
        self.dumps: dict[str, list[tuple[float, Path]]] = {k: [] for k in
                                                           ("a", "b", "tier0", "tier1")}
        self.dump_errors: list[str] = []
        self.lock = threading.Lock()
        self.t0, self.last_dump = time.monotonic(), -1e9
        (self.workdir / "dumps").mkdir()

    def prepare(self) -> list[tuple[int, int]]:
        """Tables and first contact everywhere (set-up timeouts); each global server's last id."""
        for dc in self.dcs:
            h.Base.metadata.create_all(sa.create_engine(dc, poolclass=sa.pool.NullPool))
        h.pair_contact([self.a_url, self.b_url], SEQ, dict.fromkeys(self.dcs, TIER_OPTIONS))
        self.pg.wait_caught_up()
        return [last_id(url) for url in (self.a_url, self.b_url)]

    def now(self) -> float:
        return time.monotonic() - self.t0

    def url(self, name: str) -> str:
        return self.b_url if name == "b" else self.a_url

    def server(self, name: str) -> ServerProcess:
        return self.b if name == "b" else self.pg.replica if self.promoted else self.pg.primary

    def start(self, slot: int) -> None:
        dc = slot % 2
        with self.lock:
            path = self.logs / f"worker{slot}_{len(self.dc_of):03d}.log"
            self.dc_of[path] = dc
            pair = [self.proxies[dc][s].url(self.url(s)) for s in "ab"]
            index = self.fleet.start([(slot, self.dcs[dc], pair, str(path), self.stop_workers)])
            self.live[slot] = (self.fleet.workers[index[0]][0], path)

    def stop_all(self, timeout: float) -> list[str]:
        """Stop every worker cleanly; those alive after ``timeout``, named (a finding), killed."""
        self.stop_workers.set()
        unclean, deadline = [], time.monotonic() + timeout
        for process, path in list(self.live.values()):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(process.pid, signal.SIGCONT)
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                unclean.append(path.name)
                process.kill()
        return unclean

    def nemesis(self, faults: list[Fault], until: float, overlap: bool) -> None:
        try:
            running = []
            for fault in faults:
                while not self.stop.is_set() and self.now() < fault.at:
                    if not overlap and self.now() - self.last_dump >= (3 if self.smoke else 20):
                        self.dump_all()
                    self.stop.wait(max(0.0, min(0.2, fault.at - self.now())))
                if self.stop.is_set() or self.now() >= until:
                    break
                running.append(threading.Thread(target=self.inject, args=(fault,)))
                running[-1].start()
                if not overlap:
                    running[-1].join()
            for thread in running:
                thread.join()
        except BaseException as error:  # reported; the run goes on without a nemesis
            self.done.append({"t": self.now(), "kind": "nemesis_crashed", "error": repr(error)})

    def dump_all(self) -> None:
        self.last_dump = self.now()
        tiers = [(f"tier{i}", dc, TIER_TABLES) for i, dc in enumerate(self.dcs)]
        for key, url, tables in [("a", self.a_url, ()), ("b", self.b_url, ()), *tiers]:
            suffix = "dump" if make_url(url).get_backend_name() == "postgresql" else "sql"
            path = self.workdir / "dumps" / f"{key}_{len(self.dumps[key]):03d}.{suffix}"
            at = self.now()
            try:
                self.dumps[key].append((at, dump(url, path, tables=tables)))
            except Exception as error:
                self.dump_errors.append(f"{at:.1f} s {key}: {error}"[:500])

    def pick_dump(self, key: str, pick: float) -> tuple[float, Path] | None:
        """One of the dumps old enough (``pick``, drawn with the schedule, says which)."""
        old = [d for d in self.dumps[key] if self.now() - d[0] >= (2 if self.smoke else 10)]
        return old[min(len(old) - 1, int(pick * len(old)))] if old else None

    def inject(self, fault: Fault) -> None:
        record = {"t": self.now(), "planned": fault.at, "kind": fault.kind, **fault.params}
        h.log(f"  {record['t']:6.1f} s: {fault.kind} {fault.params}")
        try:
            record.update(getattr(self, fault.kind)(**fault.params) or {})
        except Exception as error:
            record["error"] = f"{type(error).__name__}: {error}"[:800]
            h.log(f"          {fault.kind} failed: {record['error'][:300]}")
        record["end"] = self.now()
        self.done.append(record)

    def paused(self, pid: int, seconds: float, send: Callable[[int, int], None]) -> None:
        send(pid, signal.SIGSTOP)
        try:
            self.stop.wait(seconds)
        finally:
            send(pid, signal.SIGCONT)

    def kill_worker(self, slot: int) -> dict[str, Any]:
        with self.lock:
            process, path = self.live[slot]
        process.kill()
        process.join(30)
        self.kills.append({"slot": slot, "log": path.name, "at": time.monotonic()})
        self.start(slot)
        return {"log": path.name}

    def stop_worker(self, slot: int, seconds: float) -> dict[str, Any]:
        with self.lock:
            pid = int(self.live[slot][0].pid)
        self.paused(pid, seconds, os.kill)
        return {"pid": pid}

    def kill_server(self, server: str, seconds: float) -> dict[str, Any]:
        process = self.server(server)
        process.kill()
        try:
            self.stop.wait(seconds)
        finally:
            for attempt in range(5):  # a restart may race the killed server's port: again
                with contextlib.suppress(Exception) if attempt < 4 else contextlib.nullcontext():
                    process.restart(60)
                    break
                time.sleep(2)
        return {"port": process.port}

    def stop_server(self, server: str, seconds: float) -> dict[str, Any]:
        process = self.server(server)
        self.paused(process.pid, seconds, os.killpg)  # the whole process group
        return {"port": process.port}

    def link(self, server: str, dc: int | str, seconds: float, mode: str,
             hang_after: float = 0.0) -> dict[str, Any]:
        proxies = [row[s] for i, row in enumerate(self.proxies) if dc in (i, "both")
                   for s in (("a", "b") if server == "both" else (server,))]
        for proxy in proxies:
            getattr(proxy, mode)()
        try:
            if hang_after and not self.stop.wait(hang_after):  # the soak's cut: then hung
                for proxy in proxies:
                    proxy.hang()
            self.stop.wait(seconds - hang_after)
        finally:
            for proxy in proxies:
                proxy.forward()
        return {}

    cut_link = functools.partialmethod(link, mode="refuse")
    hang_link = functools.partialmethod(link, mode="hang")

    def restore_global(self, server: str, pick: float) -> dict[str, Any]:
        chosen = self.pick_dump(server, pick)
        if chosen is None:
            return {"skipped": "no dump old enough yet"}
        url, before = self.url(server), last_id(self.url(server))[0]
        restore(url, chosen[1], lock_timeout=10)
        after = last_id(url)[0]
        return {"dump_taken_at": chosen[0], "dump": chosen[1].name, "last_id_before": before,
                "last_id_after": after, "went_back_by_ids": before - after}

    def restore_tier(self, dc: int, pick: float) -> dict[str, Any]:
        chosen = self.pick_dump(f"tier{dc}", pick)
        if chosen is None:
            return {"skipped": "no dump old enough yet"}
        before = h.stock(self.dcs[dc], SEQ)["stock"]
        restore(self.dcs[dc], chosen[1], lock_timeout=10)
        return {"dump_taken_at": chosen[0], "dump": chosen[1].name, "stock_before": before,
                "stock_after_restore": h.stock(self.dcs[dc], SEQ)["stock"]}

    def promote(self) -> dict[str, Any]:
        if self.promoted:
            return {"skipped": "a was promoted already"}
        self.pg.wait_caught_up()
        replicated = primary_last = last_id(self.a_url)[0]
        self.pg.cut_replication()
        # Let the workers take blocks the replica will never see (bounded).
        deadline = time.monotonic() + (4.0 if self.smoke else 25.0)
        while time.monotonic() < deadline and not self.stop.is_set():
            primary_last = last_id(self.a_url)[0]
            if primary_last > replicated:
                self.stop.wait(0.5 if self.smoke else 2.0)
                primary_last = last_id(self.a_url)[0]
                break
            self.stop.wait(0.25)
        self.pg.crash_primary()
        crashed_at = self.now()
        self.pg.promote()
        with self.lock:
            self.a_url, self.promoted = self.a_replica_url, True
        for row in self.proxies:
            row["a"].follow(self.a_url)
        promoted_last = last_id(self.a_url)[0]
        return {"replicated_last_id": replicated, "primary_last_id_before_crash": primary_last,
                "promoted_last_id": promoted_last,
                "ids_the_replica_missed_at_least": primary_last - promoted_last,
                "crashed_at": crashed_at, "failover_seconds": self.now() - crashed_at}

    def run(self) -> dict[str, Any]:
        args, slots = self.args, 2 * self.args.workers
        faults = schedule(random.Random(args.seed), args.duration, args.smoke, slots,
                          args.schedule)
        h.log(f"  seed {args.seed}: {len(faults)} faults scheduled over {args.duration:g} s")
        until = args.duration - (2 if args.smoke else 10)
        nemesis = threading.Thread(target=self.nemesis, name="nemesis", daemon=True,
                                   args=(faults, until, args.schedule == "soak"))
        for slot in range(slots):  # killed, if the run fails, when the stack closes
            self.start(slot)
        deadline = time.monotonic() + 180
        while not all(p.exists() for p in self.dc_of):  # every worker running: the clock
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start within 180 s")
            time.sleep(0.1)
        self.t0 = time.monotonic()
        nemesis.start()
        samples: list[dict[str, Any]] = []
        try:
            while (now := self.now()) < args.duration:
                if now >= len(samples) * (2.0 if args.smoke else 5.0):
                    samples.append({"t": now, "load": h.load()})
                    with contextlib.suppress(Exception):
                        samples[-1]["stock"] = [h.stock(dc, SEQ)["stock"] for dc in self.dcs]
                time.sleep(0.2)
        finally:
            self.stop.set()
            nemesis.join(120)  # the fault under way finishes (bounded by its duration)
        stopping = time.monotonic()
        unclean = self.stop_all(60)
        return {"t0": self.t0, "end": self.now(), "faults": self.done,
                "faults_not_run": [vars(f) for f in faults if f.at >= until][:50],
                "dumps": {k: [(round(t, 1), p.name) for t, p in v] for k, v in self.dumps.items()},
                "dump_errors": self.dump_errors, "samples": samples, "dc_of": self.dc_of,
                "kills": self.kills, "unclean_stops": unclean, "stopping": stopping,
                "nemesis_alive": nemesis.is_alive()}


def halt(server: ServerProcess) -> None:
    with contextlib.suppress(Exception):
        server.kill()  # SIGKILL: a SIGSTOPped server goes too


def analyse(c: Campaign, base: list[tuple[int, int]], stock0: list[int],
            outcome: dict[str, Any]) -> dict[str, Any]:
    t0, dc_of = outcome["t0"], outcome["dc_of"]
    logs = {p: read_log(p) for p in dc_of}
    warn_counts, discarded = read_warnings([p.with_suffix(".err") for p in dc_of])
    tables = [{m.__tablename__: [int(r[0]) for r in read_db(dc, sa.select(m.id))]
               for m in (Order, Line)} for dc in c.dcs]
    every = Counter(i for per_dc in tables for ids in per_dc.values() for i in ids)
    doubled = sorted(i for i, n in every.items() if n > 1)
    lost, seen = [], {}  # acknowledged ids missing from their tables; who committed each id
    for path, log in logs.items():
        orders, lines = (set(ids) for ids in tables[dc_of[path]].values())  # Order, then Line
        for commit in log["C"]:
            missing = [i for i in commit["ids"][:1] if i not in orders]
            missing += [i for i in commit["ids"][1:] if i not in lines]
            if missing:
                lost.append({"t": commit["t"] - t0, "log": path.name, "ids": missing})
            for i in commit["ids"]:
                seen.setdefault(i, []).append((commit["t"] - t0, path.name))
    failures = [{**f, "t": f["t"] - t0, "dc": dc_of[p], "log": p.name}
                for p, log in logs.items() for f in log["F"]]
    not_tickets = [f for f in failures if not f["tickets_error"]]
    duplicate_inserts = [f for f in failures if f["duplicate"]]
    stock_at = lambda t, dc: next((s["stock"][dc] for s in reversed(outcome["samples"])  # noqa: E731
                                   if s["t"] <= t and "stock" in s), 1)
    lasts = [log["E"][-1] if log["E"] else log["H"][-1] for log in logs.values()
             if log["E"] or log["H"]]
    beats = {p.name: log["H"] for p, log in logs.items()}  # held at a kill: the last heartbeat's
    held = sum(beats[k["log"]][-1]["held"] for k in outcome["kills"] if beats[k["log"]])
    clean = sum(e["burned"] for log in logs.values() for e in log["E"])
    tier_burned = sum(x["tier_burned"] for x in lasts)
    rows = sum(len(ids) for per_dc in tables for ids in per_dc.values())
    last = [last_id(url) for url in (c.a_url, c.b_url)]
    advance = sum((now - b) // step for (now, step), (b, _) in zip(last, base, strict=True))
    stocks = [h.stock(dc, SEQ)["stock"] for dc in c.dcs]
    in_stock = [{i for r in read_db(dc, sa.text(f"SELECT first_id, last_id, step FROM "
                                                f"{TIER_TABLES[0]}"))
                 for i in range(int(r[0]), int(r[1]) + 1, int(r[2]))} for dc in c.dcs]
    latent = {"in_stock_and_in_a_table": (in_stock[0] | in_stock[1]) & set(every),
              "in_both_stocks": in_stock[0] & in_stock[1]}
    killed_at = {k["log"]: k["at"] for k in outcome["kills"]}
    stalls = []  # per log the longest gap without a commit or a failure, up to its end
    for path, log in logs.items():
        times = sorted(x["t"] for x in log["C"] + log["F"])
        if times:
            times.append(killed_at.get(path.name, outcome["stopping"]))
            gap, since = max((b - a, a) for a, b in zip(times, times[1:], strict=False))
            stalls.append({"log": path.name, "longest_gap": round(gap, 2),
                           "from_t": round(since - t0, 2)})
    stalled = [x for x in stalls if x["longest_gap"] >= STALL_SECONDS]
    kinds = Counter(f["kind"] for f in outcome["faults"] if not {"skipped", "error"} & set(f))
    return {
        "rows_written": rows,
        "rows_per_datacenter": [sum(len(v) for v in per_dc.values()) for per_dc in tables],
        "duplicates": len(doubled) + len(duplicate_inserts),
        "ids_in_two_tables_or_datacenters": len(doubled), "duplicate_ids": doubled[:200],
        "duplicate_runs": duplicate_runs(seen),
        "inserts_refused_as_duplicate_key": len(duplicate_inserts),
        "latent_duplicates": sum(map(len, latent.values())),
        "latent_duplicate_ids": {k: sorted(ids)[:100] for k, ids in latent.items()},
        "rows_lost": sum(len(x["ids"]) for x in lost), "lost": lost[:200],
        "acknowledged_ids": sum(len(x["ids"]) for log in logs.values() for x in log["C"]),
        "failed_inserts": len(failures),
        "failed_inserts_while_stock_held_ids": sum(1 for f in failures
                                                   if stock_at(f["t"], f["dc"]) > 0),
        "caller_errors_by_class": dict(Counter(f["cls"] for f in failures)),
        "caller_errors_not_tickets_error": len(not_tickets),
        "caller_errors_not_tickets_error_examples": not_tickets[:20],
        "rewind_errors_seen_by_callers": sum(f["cls"].endswith(".RewindError") for f in failures),
        "rewinds_reported_by_workers": sum(x["rewinds"] for x in lasts),
        "warning_lines": dict(warn_counts),
        "ids_burned": clean + held + tier_burned + discarded,
        "ids_burned_parts": {"clean_closes": clean,
                             "held_by_killed_workers_at_last_heartbeat": held,
                             "refused_or_dropped_by_tiers": tier_burned,
                             "tier_stocks_discarded_after_tier_restores": discarded},
        "global_advance_in_ids": advance,
        "global_advance_not_in_rows_or_stock": advance - rows - (sum(stocks) - sum(stock0)),
        "workers_started": len(logs), "worker_kills": len(outcome["kills"]),
        "unclean_stops": outcome["unclean_stops"],
        "stalled_workers": len(stalled) + len(set(outcome["unclean_stops"])
                                              - {x["log"] for x in stalled}),
        "stalls": stalled,
        "longest_gap_between_commits": max((x["longest_gap"] for x in stalls), default=None),
        "faults_injected": sum(kinds.values()), "faults_by_kind": dict(sorted(kinds.items())),
        **{k: outcome[k] for k in ("faults", "faults_not_run", "dumps", "dump_errors", "samples")},
        "nemesis_still_running_at_end": outcome["nemesis_alive"], "failures": failures[:500],
        "commit_timeline": {f"dc{d}": sorted(round(x["t"] - t0, 3) for p, log in logs.items()
                                             if dc_of[p] == d for x in log["C"])
                            for d in range(2)},
        "run_seconds": outcome["end"],
    }


def draw(env: dict[str, Any], res: dict[str, Any], duration: float, title: str) -> Any:
    """Rows per second per datacenter, above a timeline of faults, failures and duplicates."""
    fig, (a1, a2) = h.pyplot().subplots(2, 1, figsize=(12, 7.5), sharex=True)
    fig.suptitle(f"{title}: {res['rows_written']:,} rows, {res['duplicates']} duplicates, "
                 f"{res['rows_lost']} lost, {res['failed_inserts']} failed inserts, "
                 f"{res['faults_injected']} faults", fontsize=11)
    fig.text(0.01, 0.01, f"every fault and figure in the JSON; load avg "
             f"{env['load_average_at_start']} at start", fontsize=7.5, color="dimgray")
    fig.subplots_adjust(left=0.13, right=0.98, bottom=0.08, top=0.92, hspace=0.1)
    width = 2.0 if duration <= 60 else 5.0
    for d, times in res["commit_timeline"].items():
        counts = Counter(int(t // width) for t in times)  # before the clock: bin -1, left out
        bins = range(int(duration / width) + 1)
        a1.plot([(b + 0.5) * width for b in bins], [counts[b] * (1 + LINES) / width
                                                    for b in bins], label=d, linewidth=1)
    a1.set_ylabel(f"rows per second ({width:g} s bins)", fontsize=9)
    a1.legend(fontsize=8, loc="lower left")
    rows = [*KINDS, "failed insert", "duplicate committed"]
    spans = [(f["t"], f["end"], f["kind"], 0.3 if "error" in f else 0.9) for f in res["faults"]
             if "skipped" not in f and f["kind"] in KINDS]
    spans += [(f["t"], f["t"], "failed insert", 0.9) for f in res["failures"]]
    spans += [(c["first_t"], c["last_t"], "duplicate committed", 0.9)
              for dup in res["duplicate_runs"] for c in dup["committed"].values()]
    for start, end, kind, alpha in spans:
        a1.axvline(start, color=COLORS.get(kind, "tab:red"), linewidth=0.6, alpha=0.5)
        a2.plot([start, max(end, start + 0.3)], [rows.index(kind)] * 2, linewidth=6,
                color=COLORS.get(kind, "tab:red"), alpha=alpha, solid_capstyle="butt")
    a2.set_yticks(range(len(rows)), rows, fontsize=8)
    a2.set_ylim(len(rows) - 0.5, -0.5)
    a2.set_xlim(0, duration)
    a2.set_xlabel("seconds into the run", fontsize=9)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, {
        "--duration": dict(type=float, default=None, help="seconds (600; soak 300)"),
        "--workers": dict(type=int, default=None, help="per datacenter (2; soak 4)"),
        "--schedule": dict(choices=("random", "soak"), default="random"),
        "--logs": dict(type=Path, default=None, help="keep worker logs here")},
        backends=("postgresql", "mysql"))
    soak = args.schedule == "soak"
    args.duration = args.duration or (32.0 if args.smoke else 300.0 if soak else 600.0)
    args.workers = args.workers or (1 if args.smoke else 4 if soak else 2)
    h.log(f"campaign: {args.schedule}, seed {args.seed}, {args.duration:g} s, "
          f"{args.workers} workers per dc")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tickets_campaign_logs_") as tmp, \
            contextlib.ExitStack() as stack:
        (logs := Path(tmp) / "logs").mkdir()
        campaign = Campaign(stack, args, logs)
        base = campaign.prepare()
        stock0 = [h.stock(dc, SEQ)["stock"] for dc in campaign.dcs]
        results = analyse(campaign, base, stock0, campaign.run())
        if args.logs is not None:  # the workers' raw logs, for a finding's evidence
            shutil.rmtree(args.logs, ignore_errors=True)
            shutil.copytree(logs, args.logs)
    results["wall_seconds"] = time.monotonic() - started
    keys = ["duplicates", "latent_duplicates", "rows_lost", "caller_errors_not_tickets_error",
            "stalled_workers"] + (["failed_inserts_while_stock_held_ids"] if soak else [])
    checks = {key: h.check(results[key], 0) for key in keys}
    h.log(", ".join(f"{k} {results[k]}" for k in (
        "faults_by_kind", "rows_written", "failed_inserts", "caller_errors_by_class",
        "rewinds_reported_by_workers", "warning_lines", "ids_burned", "wall_seconds")))
    for dup in results["duplicate_runs"]:
        h.log(f"  DUPLICATES: {dup['count']} ids {dup['first_id']}..{dup['last_id']} of "
              f"{dup['lane']}, committed by {dup['committed']}")
    title = (f"{'Soak' if soak else f'Fault campaign (seed {args.seed})'}: rows/s in two "
             "datacenters under the nemesis")
    code = h.report(args, NAME + ("_soak" if soak else ""), results, checks=checks,
                    figure=draw(args.env, results, args.duration, title),
                    parameters={"schedule": args.schedule, "duration": args.duration,
                                "workers_per_datacenter": args.workers,
                                "ids_per_second_per_worker": (1 + LINES) / TICK,
                                "tier_options": TIER_OPTIONS, "weights": WEIGHTS})
    return 1 if any(not c["passed"] for c in checks.values()) else code


if __name__ == "__main__":
    raise SystemExit(main())
