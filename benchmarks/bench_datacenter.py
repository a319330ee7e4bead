"""The datacenter tier across processes: global round trips by process count, ids burned by a
rolling restart, and blocking waits through a global outage.

Worker processes (``multiprocessing`` spawn) each take ids of one sequence at a steady rate
(paced by the monotonic clock), through ``CachedSource(DatacenterTier(dc, upstream=pair))``
("tier") or ``CachedSource(pair)`` ("no tier"); ``pair`` is ``TicketServers`` over two global
databases, each datacenter (``dc``) a database of its own on the next backend of
``--backends`` (default: one PostgreSQL, one MariaDB). The caches keep their defaults.

1. **Global round trips per minute** for P = 2, 4, 8, 16, 24 processes split over the two
   datacenters, at 5 ids/s each, with and without the tier: every process reports its own
   ``pair.servers[i].stats()`` round trips (refills run in whichever process claimed them), summed
   over a 60 s window after a 20 s warm-up. The tier runs with ``supply=10`` s and
   ``min_block=10`` so that it refills every few seconds within the window (with its default
   900 s it would not refill at all in a minute); the caches keep their natural block sizes.
   **Targets: flat in P with the tier, and no blocking wait in the window (after warm-up).**
2. **Ids burned by a rolling restart** of 8 processes (4 per datacenter, 10 ids/s each, tier
   defaults) after 20 s: one at a time, each is stopped — ``CachedSource.close()`` ("clean") or
   SIGKILL — and replaced. Then every process pauses (refills awaited) and the ids are accounted
   for: burned = ids the global pair issued since the start − ids the workers took − growth of the
   datacenters' stock − ids the new caches hold. "Held" is what each cache held (in hand + in
   flight) just before its stop: the HubSpot layout burns it all at every swap. **Targets: 0
   clean, at most held when killed.** Also shown: a clean restart without the tier.
3. **A global outage** of 60 s (30 s refused, then 30 s hung, through the test suite's real TCP
   proxy in front of both global servers) under 2 processes per datacenter at 20 ids/s, tier
   defaults: blocking waits (``CachedSource`` and tier), failed calls and the slowest call during
   the outage; the runway (stock ÷ shared rate, ``describe_datacenter``) at its start. **Target:
   0 blocking waits while the runway lasts.** A third datacenter with ``supply=20`` s and
   ``min_block=10`` runs out within the outage: its first failure against its runway.

``--smoke``: one P, seconds-long phases. The machine's load is sampled at each phase's end.

    .venv/bin/python benchmarks/bench_datacenter.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

import _common as h
from sqlalchemy.engine import make_url

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from sqlalchemy_tickets import (  # noqa: E402
    CachedSource,
    DatacenterTier,
    TicketsError,
    TicketServer,
    TicketServers,
)
from sqlalchemy_tickets.sources.datacenter import (  # noqa: E402
    create_datacenter_tables,
    describe_datacenter,
)
from support.proxy import TcpProxy  # noqa: E402  (the test suite's real TCP proxy)

NAME = "bench_datacenter"
FAST_TIER = {"supply": 10.0, "min_block": 10}  # refills every few seconds: visible in a window
SHORT_TIER = {"supply": 20.0, "min_block": 10}  # runs out within the outage
SLOW_CALL = 0.02  # seconds: a call this slow is recorded with its time


# -- worker processes ---------------------------------------------------------------------------


def _worker(spec: dict[str, Any], pipe: Any) -> None:
    """Take ids of ``spec["sequence"]`` at ``spec["rate"]`` per second until told otherwise.

    Commands on ``pipe``: ``stats`` (answer, go on), ``pause`` (stop taking, await refills,
    answer), ``close`` (``CachedSource.close()``, answer with what it burned, exit)."""
    pair = TicketServers(spec["pair"], backoff=0.5, max_backoff=2.0)
    tier = None if spec["dc"] is None else DatacenterTier(spec["dc"], upstream=pair, **spec["tier"])
    cache = CachedSource(tier if tier is not None else pair)
    seq, rate = spec["sequence"], spec["rate"]
    used = failures = 0
    first_failure: float | None = None
    slow: list[tuple[float, float]] = []

    def snapshot() -> dict[str, Any]:
        c = cache.stats()
        t = tier.stats() if tier is not None else {}
        return {
            "pid": os.getpid(),
            "at": time.monotonic(),
            "used": used,
            "failures": failures,
            "first_failure": first_failure,
            "slow_calls": list(slow),
            "held": c["in_hand"] + c["in_flight"],
            "cache": {k: c[k] for k in ("round_trips", "blocking_waits", "in_hand", "in_flight")},
            "tier": {k: t.get(k, 0) for k in ("round_trips", "blocking_waits", "failures")},
            "global_round_trips": pair.stats()["round_trips"],
        }

    pipe.send("ready")
    start = pipe.recv()  # the common start, on the shared monotonic clock
    paused = False
    while True:
        while pipe.poll():
            command = pipe.recv()
            if command == "pause":
                paused = True
                cache.wait_idle(10.0)
                if tier is not None:
                    tier.wait_idle(10.0)
            if command == "close":
                before = snapshot()  # what it held when told to stop
                burned = cache.close()
                if tier is not None:
                    tier.close()
                pipe.send({**before, "burned_at_close": burned})
                return
            pipe.send(snapshot())
        if not paused:
            due = int((time.monotonic() - start) * rate)
            while used < due:
                began = time.monotonic()
                try:
                    cache.next_id(seq)
                    used += 1
                except TicketsError:
                    failures += 1
                    first_failure = first_failure or began
                    break
                finally:
                    took = time.monotonic() - began
                    if took >= SLOW_CALL and len(slow) < 2000:
                        slow.append((began, took))
        time.sleep(0.05)


class Fleet:
    """Worker processes, started together and addressed one by one or all at once."""

    def __init__(self) -> None:
        self.ctx = multiprocessing.get_context("spawn")
        self.workers: list[tuple[Any, Any, dict[str, Any]]] = []

    def start(self, specs: Sequence[dict[str, Any]], at: float | None = None) -> list[int]:
        """Start one worker per spec; once all are ready, they start taking ids together."""
        fresh = []
        for spec in specs:
            mine, theirs = self.ctx.Pipe()
            process = self.ctx.Process(target=_worker, args=(spec, theirs), daemon=True)
            process.start()
            fresh.append((process, mine, spec))
        for _, pipe, _ in fresh:
            if not pipe.poll(180) or pipe.recv() != "ready":
                raise RuntimeError("a worker did not start within 180 s")
        start = time.monotonic() if at is None else at
        for _, pipe, _ in fresh:
            pipe.send(start)
        self.workers += fresh
        return list(range(len(self.workers) - len(fresh), len(self.workers)))

    def ask(self, index: int, command: str) -> dict[str, Any]:
        _, pipe, _ = self.workers[index]
        pipe.send(command)
        if not pipe.poll(60):
            raise RuntimeError(f"worker {index} did not answer {command!r} within 60 s")
        answer: dict[str, Any] = pipe.recv()
        return answer

    def ask_all(self, command: str, indexes: Sequence[int] | None = None) -> list[dict[str, Any]]:
        chosen = range(len(self.workers)) if indexes is None else indexes
        for i in chosen:
            self.workers[i][1].send(command)
        answers = []
        for i in chosen:
            if not self.workers[i][1].poll(60):
                raise RuntimeError(f"worker {i} did not answer {command!r} within 60 s")
            answers.append(self.workers[i][1].recv())
        return answers

    def stop(self, index: int, how: str) -> dict[str, Any]:
        """``clean``: close its cache and exit; ``kill``: a snapshot, then SIGKILL at once."""
        process = self.workers[index][0]
        if how == "clean":
            answer = self.ask(index, "close")
            process.join(30)
        else:
            answer = self.ask(index, "stats")
            process.kill()
            process.join(30)
        return answer

    def close(self) -> None:
        for process, pipe, _ in self.workers:
            if process.is_alive():
                process.kill()
            process.join(10)
            pipe.close()
        self.workers.clear()


# -- databases -------------------------------------------------------------------------------


@contextlib.contextmanager
def databases(backends: Sequence[str], datacenters: int) -> Iterator[dict[str, Any]]:
    """Two global databases (on PostgreSQL if it is among ``backends``) and ``datacenters``
    datacenter databases, one per backend in turn."""
    glob = "postgresql" if "postgresql" in backends else backends[0]
    kinds = [glob, glob] + [backends[i % len(backends)] for i in range(datacenters)]
    with contextlib.ExitStack() as stack:
        urls = [
            stack.enter_context(h.throwaway_database(k)).render_as_string(hide_password=False)
            for k in kinds
        ]
        for url in urls[2:]:
            create_datacenter_tables(url, timeout=30.0)
        yield {"pair": urls[:2], "dcs": urls[2:], "kinds": kinds}


def global_last_ids(pair: Sequence[str], sequence: str) -> list[tuple[int, int]]:
    """Each global server's last id issued and stride, read on the server."""
    out = []
    for url in pair:
        server = TicketServer(url, timeout=10.0)
        try:
            info = server.describe(sequence)
        finally:
            server.close()
        out.append(
            (0, 1) if info is None or info.last_id is None else (info.last_id, info.increment)
        )
    return out


def issued_since(pair: Sequence[str], sequence: str, base: list[tuple[int, int]]) -> int:
    """Ids the global pair issued since ``base``: each server's advance over its stride."""
    now = global_last_ids(pair, sequence)
    return sum((last - b) // step for (last, step), (b, _) in zip(now, base, strict=True))


def dc_status(dc: str, sequence: str) -> dict[str, Any]:
    for status in describe_datacenter(dc, timeout=10.0):
        if status.sequence == sequence:
            return status.as_dict()
    return {"stock": 0, "rate": 0.0, "runway": None}


def prime(
    urls: dict[str, Any], sequence: str, dcs: Sequence[str], tiers: Sequence[dict[str, Any]] = ()
) -> None:
    """Create the sequence's ticket rows on both global servers and its state rows in the
    datacenters (untimed, before the workers, so first contact is not what is measured), each
    tier with the settings its workers use (``tiers[i]`` for ``dcs[i]``; default: defaults):
    a first refill at other settings would leave a stock the workers' tier would not hold."""
    pair = TicketServers(urls["pair"], timeout=30.0)
    try:
        pair.next_id(sequence)
        pair.next_id(sequence)
        for dc, settings in zip(dcs, [*tiers, *[{}] * (len(dcs) - len(tiers))], strict=True):
            tier = DatacenterTier(dc, upstream=pair, **{**settings, "timeout": 30.0})
            try:
                tier.next_id(sequence)
                tier.wait_idle(30.0)
            finally:
                tier.close()
    finally:
        pair.close()


def spec(
    urls: dict[str, Any], dc: str | None, sequence: str, rate: float, tier: dict[str, Any]
) -> dict[str, Any]:
    return {"pair": urls["pair"], "dc": dc, "sequence": sequence, "rate": rate, "tier": tier}


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- 1. global round trips by process count ---------------------------------------------------


def scaling(
    urls: dict[str, Any], counts: Sequence[int], rate: float, warmup: float, window: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"tier": {}, "no tier": {}}
    for variant in ("no tier", "tier"):
        for p in counts:
            seq = f"scale_{'tier' if variant == 'tier' else 'none'}_{p}"
            dcs = [urls["dcs"][i % 2] for i in range(p)]
            used = sorted(set(dcs)) if variant == "tier" else []
            prime(urls, seq, used, [FAST_TIER] * len(used))
            fleet = Fleet()
            try:
                fleet.start(
                    [
                        spec(urls, dc if variant == "tier" else None, seq, rate, FAST_TIER)
                        for dc in dcs
                    ]
                )
                time.sleep(warmup)
                before = fleet.ask_all("stats")
                time.sleep(window)
                after = fleet.ask_all("stats")
            finally:
                fleet.close()
            trips = sum(
                a["global_round_trips"] - b["global_round_trips"]
                for a, b in zip(after, before, strict=True)
            )
            took = sum(a["used"] - b["used"] for a, b in zip(after, before, strict=True))
            waits = sum(
                a["cache"]["blocking_waits"] - b["cache"]["blocking_waits"]
                for a, b in zip(after, before, strict=True)
            )
            out[variant][p] = {
                "global_round_trips_per_minute": trips * 60 / window,
                "global_round_trips_in_window": trips,
                "ids_taken_in_window": took,
                "ids_per_second": took / window,
                "blocking_waits_in_window": waits,
                "load_average_at_end": load(),
            }
            h.log(
                f"  {variant:7} P={p:2}: {trips * 60 / window:7.1f} global round trips/min, "
                f"{took / window:.0f} ids/s, {waits} blocking waits"
            )
    return out


# -- 2. ids burned by a rolling restart --------------------------------------------------------


def restart(
    urls: dict[str, Any], how: str, tiered: bool, n: int, rate: float, warmup: float
) -> dict[str, Any]:
    seq = f"restart_{how}_{'tier' if tiered else 'none'}"
    dcs = [urls["dcs"][i % 2] for i in range(n)]
    prime(urls, seq, sorted(set(dcs)) if tiered else [])
    base = global_last_ids(urls["pair"], seq)
    stock_base = sum(dc_status(dc, seq)["stock"] for dc in set(dcs)) if tiered else 0
    fleet = Fleet()
    specs = [spec(urls, dc if tiered else None, seq, rate, {}) for dc in dcs]
    stopped = []
    try:
        fleet.start(specs)
        time.sleep(warmup)
        for i in range(n):
            stopped.append(fleet.stop(i, how))
            fleet.start([specs[i]])
        time.sleep(min(warmup, 5.0))
        final = fleet.ask_all("pause", range(n, 2 * n))
        issued = issued_since(urls["pair"], seq, base)
        stock = sum(dc_status(dc, seq)["stock"] for dc in set(dcs)) if tiered else 0
    finally:
        fleet.close()
    used = sum(s["used"] for s in stopped) + sum(f["used"] for f in final)
    still_held = sum(f["held"] for f in final)
    held = sum(s["held"] for s in stopped)
    burned = issued - used - (stock - stock_base) - still_held
    per_process_rate = rate
    # HubSpot: the whole cache is lost at every swap; as a share of the ids of a day with one
    # restart a day: (seconds of ids held) / 86,400.
    result = {
        "processes": n,
        "ids_per_second_per_process": per_process_rate,
        "held_before_stop": held,
        "held_per_process": [s["held"] for s in stopped],
        "burned": burned,
        "burned_reported_by_close": sum(s.get("burned_at_close", 0) for s in stopped),
        "global_issued": issued,
        "taken_by_workers": used,
        "stock_growth": stock - stock_base,
        "held_by_new_processes": still_held,
        "hubspot_burn_same_cache": held,
        "hubspot_share_per_daily_restart": held / (n * rate * 86_400),
        "share_per_daily_restart": burned / (n * rate * 86_400),
        "load_average_at_end": load(),
    }
    h.log(
        f"  rolling restart, {how}, {'tier' if tiered else 'no tier'}: burned {burned:,} of "
        f"{held:,} held (HubSpot burns all {held:,})"
    )
    return result


# -- 3. a global outage ------------------------------------------------------------------------


def outage(
    urls: dict[str, Any], per_dc: int, rate: float, warmup: float, cut: float
) -> dict[str, Any]:
    seq = "outage"
    proxies = []
    for url in urls["pair"]:
        u = make_url(url)
        proxies.append(TcpProxy(u.host or "127.0.0.1", u.port or 5432).start())
    proxied = {**urls, "pair": [p.url(url) for p, url in zip(proxies, urls["pair"], strict=True)]}
    dcs = urls["dcs"]  # [dc A, dc B, short]
    prime(proxied, seq, dcs, [{}, {}, SHORT_TIER])
    specs = [spec(proxied, dcs[i % 2], seq, rate, {}) for i in range(2 * per_dc)]
    specs.append(spec(proxied, dcs[2], seq, rate, SHORT_TIER))
    fleet = Fleet()
    timeline: list[dict[str, Any]] = []
    try:
        fleet.start(specs)
        t0 = time.monotonic()

        def sample() -> list[dict[str, Any]]:
            snaps = fleet.ask_all("stats")
            timeline.append(
                {
                    "t": time.monotonic() - t0,
                    "used": [s["used"] for s in snaps],
                    "failures": [s["failures"] for s in snaps],
                }
            )
            return snaps

        def run_for(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                sample()

        run_for(warmup)
        runway = {f"dc{i}": dc_status(dc, seq) for i, dc in enumerate(dcs)}
        before, cut_at = sample(), time.monotonic()
        for p in proxies:
            p.refuse()
        run_for(cut / 2)
        for p in proxies:
            p.hang()
        run_for(cut / 2)
        during, back_at = sample(), time.monotonic()
        for p in proxies:
            p.forward()
        run_for(min(warmup, 10.0))
        after = sample()
    finally:
        fleet.close()
        for p in proxies:
            p.close()

    def delta(i: int, key: str, sub: str | None = None) -> int:
        a, b = during[i], before[i]
        return int(a[key][sub] - b[key][sub]) if sub else int(a[key] - b[key])

    groups: dict[str, Any] = {}
    for name, members in (("long runway", range(2 * per_dc)), ("short runway", [2 * per_dc])):
        slow = [
            t for i in members for (at, t) in during[i]["slow_calls"] if cut_at <= at <= back_at
        ]
        dcs_of = sorted({i % 2 for i in members}) if name == "long runway" else [2]
        first = [during[i]["first_failure"] for i in members if during[i]["first_failure"]]
        groups[name] = {
            "processes": len(members),
            "runway_at_cut_seconds": {f"dc{d}": runway[f"dc{d}"]["runway"] for d in dcs_of},
            "stock_at_cut": {f"dc{d}": runway[f"dc{d}"]["stock"] for d in dcs_of},
            "shared_rate_at_cut": {f"dc{d}": runway[f"dc{d}"]["rate"] for d in dcs_of},
            "ids_taken_during_outage": sum(delta(i, "used") for i in members),
            "blocking_waits_cache": sum(delta(i, "cache", "blocking_waits") for i in members),
            "blocking_waits_tier": sum(delta(i, "tier", "blocking_waits") for i in members),
            "failed_calls": sum(delta(i, "failures") for i in members),
            "first_failure_after_cut_seconds": min(first) - cut_at if first else None,
            "calls_slower_than_20ms": len(slow),
            "slowest_call_seconds": max(slow, default=0.0),
            "ids_taken_after_outage": sum(after[i]["used"] - during[i]["used"] for i in members),
        }
        h.log(
            f"  outage, {name}: {groups[name]['blocking_waits_cache']} blocking waits, "
            f"{groups[name]['failed_calls']} failures, runway "
            f"{groups[name]['runway_at_cut_seconds']}, first failure after "
            f"{groups[name]['first_failure_after_cut_seconds']}"
        )
    return {
        "outage_seconds": cut,
        "ids_per_second_per_process": rate,
        "groups": groups,
        "timeline": timeline,
        "cut_at": cut_at - t0,
        "back_at": back_at - t0,
        "load_average_at_end": load(),
    }


# -- report -----------------------------------------------------------------------------------


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, (a1, a2, a3) = h.figure(
        3,
        "Datacenter tier across processes",
        env,
        note="counts, not ratios; see the JSON for the settings",
    )
    for variant, style in (("no tier", "o--"), ("tier", "s-")):
        rows = results["scaling"][variant]
        a1.plot(
            list(rows),
            [r["global_round_trips_per_minute"] for r in rows.values()],
            style,
            label=f"CachedSource({'DatacenterTier(dc, pair)' if variant == 'tier' else 'pair'})",
        )
    a1.set_xscale("log", base=2)
    a1.set_xlabel("worker processes (two datacenters)", fontsize=9)
    a1.set_ylabel("round trips reaching the global pair / min", fontsize=9)
    a1.set_title("global round trips (target: flat with the tier)", fontsize=10)
    a1.legend(fontsize=7)
    bars = {}
    for key, r in results["restart"].items():
        bars[f"{key}: burned"] = r["burned"]
        bars[f"{key}: held (HubSpot burns)"] = r["held_before_stop"]
    h.value_panel(a2, bars, "rolling restart: ids burned vs held", "ids")
    out = results["outage"]
    times = [s["t"] for s in out["timeline"]]
    n = len(out["timeline"][0]["used"])
    for i in range(n):
        a3.plot(
            times,
            [s["used"][i] for s in out["timeline"]],
            color="tab:red" if i == n - 1 else "tab:blue",
            linewidth=1,
        )
    a3.axvspan(out["cut_at"], out["back_at"], color="grey", alpha=0.25, label="global pair down")
    a3.set_xlabel("seconds", fontsize=9)
    a3.set_ylabel("ids taken per process", fontsize=9)
    long, short = out["groups"]["long runway"], out["groups"]["short runway"]
    a3.set_title(
        f"outage: {long['blocking_waits_cache']} blocking waits (blue); short runway "
        f"(red) fails after {short['first_failure_after_cut_seconds'] or 0:.0f} s",
        fontsize=9,
    )
    a3.legend(fontsize=7)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql", "mysql"))
    if args.backends == ["sqlite"]:
        raise SystemExit("bench_datacenter needs a server backend for its global pair")
    smoke = args.smoke
    counts = [2] if smoke else [2, 4, 8, 16, 24]
    env = h.environment()
    results: dict[str, Any] = {}
    with databases([b for b in args.backends if b != "sqlite"], 3) as urls:
        results["databases"] = urls["kinds"]
        h.log("global round trips by process count")
        results["scaling"] = scaling(
            urls, counts, 5.0, 1.0 if smoke else 20.0, 2.0 if smoke else 60.0
        )
        h.log("rolling restarts")
        n, warm = (1, 1.0) if smoke else (8, 20.0)
        results["restart"] = {
            f"{how}, {'tier' if tiered else 'no tier'}": restart(urls, how, tiered, n, 10.0, warm)
            for how, tiered in (("clean", True), ("kill", True), ("clean", False))
        }
        h.log("global outage")
        results["outage"] = outage(
            urls, 1 if smoke else 2, 20.0, 2.0 if smoke else 15.0, 2.0 if smoke else 60.0
        )
    tier = results["scaling"]["tier"]
    flat = max(r["global_round_trips_per_minute"] for r in tier.values()) / max(
        1e-9, min(r["global_round_trips_per_minute"] for r in tier.values())
    )
    clean, kill = results["restart"]["clean, tier"], results["restart"]["kill, tier"]
    long = results["outage"]["groups"]["long runway"]
    checks = {
        "tier: global round trips, most / fewest over P": {
            "median": flat,
            "target": 2.0,
            "passed": flat <= 2.0,
        },
        "tier: blocking waits after warm-up, every P": {
            "median": sum(r["blocking_waits_in_window"] for r in tier.values()),
            "target": 0,
            "passed": all(r["blocking_waits_in_window"] == 0 for r in tier.values()),
        },
        "clean rolling restart, tier: ids burned": {
            "median": clean["burned"],
            "target": 0,
            "passed": clean["burned"] == 0,
        },
        "killed rolling restart, tier: burned / held": {
            "median": kill["burned"] / max(1, kill["held_before_stop"]),
            "target": 1.0,
            "passed": kill["burned"] <= kill["held_before_stop"],
        },
        "outage within the runway: blocking waits": {
            "median": long["blocking_waits_cache"] + long["failed_calls"],
            "target": 0,
            "passed": long["blocking_waits_cache"] + long["failed_calls"] == 0,
        },
    }
    return h.report(
        args,
        NAME,
        env=env,
        parameters={
            "process_counts": counts,
            "fast_tier": FAST_TIER,
            "short_tier": SHORT_TIER,
            "load_average_at_end": load(),
        },
        results=results,
        checks=checks,
        figure=draw(env, results),
    )


if __name__ == "__main__":
    sys.exit(main())
