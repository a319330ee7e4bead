"""The datacenter tier across processes: global round trips by process count, ids burned by a
rolling restart, and blocking waits through a global outage.

Workers take ids through ``CachedSource(DatacenterTier(dc, upstream=pair))`` or
``CachedSource(pair)``, ``pair`` two global PostgreSQL databases. Targets: global round trips
flat in P with the tier (most / fewest <= 2) and no blocking wait; a rolling restart burns 0
ids when clean, at most those held when killed; 0 blocking waits within the runway through a
60 s outage of the pair. ``--smoke``: one P, one process per restart, seconds-long phases.

    .venv/bin/python benchmarks/bench_datacenter.py [--smoke] [--backends postgresql,mysql]
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import _harness as h

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketsError, TicketServers  # noqa: E402
from support.rewind import FollowingProxy  # noqa: E402  (the test suite's real TCP proxy)

NAME = "bench_datacenter"
FAST_TIER = {"supply": 10.0, "min_block": 10}  # refills every few seconds: visible in a window
SHORT_TIER = {"supply": 20.0, "min_block": 10}  # runs out within the outage
SLOW_CALL = 0.02  # seconds: a call this slow is recorded with its time


def worker(spec: tuple[list[str], str | None, str, float, dict[str, Any]], pipe: Any) -> None:
    """Take ids at ``rate`` per second; on ``pipe``, ``stats``: answer; ``pause``: stop taking,
    await refills, answer; ``close``: ``CachedSource.close()``, answer, exit."""
    pair_urls, dc, sequence, rate, settings = spec
    pair = TicketServers(pair_urls, backoff=0.5, max_backoff=2.0)
    tier = dc and DatacenterTier(dc, upstream=pair, **settings)
    cache = CachedSource(tier or pair)
    used = failures = 0
    first_failure: float | None = None
    slow: list[tuple[float, float]] = []

    def snapshot() -> dict[str, Any]:
        c, t = cache.stats(), tier.stats() if tier else {}
        return {"used": used, "failures": failures, "first_failure": first_failure,
                "slow_calls": list(slow), "held": c["in_hand"] + c["in_flight"],
                "cache_waits": c["blocking_waits"], "tier_waits": t.get("blocking_waits", 0),
                "global_round_trips": pair.stats()["round_trips"]}

    pipe.send("ready")
    start, paused = pipe.recv(), False  # the common start, on the shared monotonic clock
    while True:
        while pipe.poll():
            command = pipe.recv()
            if command == "pause":
                paused = True
                for source in (cache, tier) if tier else (cache,):
                    source.wait_idle(10.0)
            if command == "close":
                before = snapshot()  # what it held when told to stop
                burned = cache.close()
                if tier:
                    tier.close()
                pipe.send({**before, "burned_at_close": burned})
                return
            pipe.send(snapshot())
        due = used if paused else int((time.monotonic() - start) * rate)
        while used < due:
            began = time.monotonic()
            try:
                cache.next_id(sequence)
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


def issued(pair: Sequence[str], sequence: str) -> int:
    """Ids the global pair issued so far: each server's last id over its stride."""
    with contextlib.closing(TicketServers(pair, timeout=h.SETUP_TIMEOUT)) as servers:
        infos = [server.describe(sequence) for server in servers.servers]
    return sum(i.last_id // i.increment for i in infos if i is not None and i.last_id)


def grew(after: list[Any], before: list[Any], key: str, members: Sequence[int] = ()) -> int:
    """The growth of the workers' ``key`` from snapshots ``before`` to ``after`` (``members``)."""
    return sum(after[i][key] - before[i][key] for i in members or range(len(after)))


def scaling(urls: dict[str, Any], counts: Sequence[int], rate: float, warmup: float,
            window: float) -> dict[str, Any]:
    out: dict[str, Any] = {"no tier": {}, "tier": {}}
    for variant, tiered in (("no tier", False), ("tier", True)):
        for p in counts:
            seq = f"scale_{'tier' if tiered else 'none'}_{p}"
            dcs = [urls["dcs"][i % 2] for i in range(p)]
            h.pair_contact(urls["pair"], seq, dict.fromkeys(dcs, FAST_TIER) if tiered else {})
            with h.Fleet(worker, [(urls["pair"], dc if tiered else None, seq, rate, FAST_TIER)
                                  for dc in dcs]) as fleet:
                fleet.go(delay=0.0)  # they all start taking ids at once
                time.sleep(warmup)
                before = fleet.ask("stats")
                time.sleep(window)
                after = fleet.ask("stats")
            trips, took = (grew(after, before, k) for k in ("global_round_trips", "used"))
            waits = grew(after, before, "cache_waits")
            out[variant][p] = {"global_round_trips_per_minute": trips * 60 / window,
                               "global_round_trips_in_window": trips, "ids_taken_in_window": took,
                               "ids_per_second": took / window, "blocking_waits_in_window": waits,
                               "load_average_at_end": h.load()}
            h.log(f"  {variant:7} P={p:2}: {trips * 60 / window:7.1f} global round trips/min, "
                  f"{took / window:.0f} ids/s, {waits} blocking waits")
    return out


def restart(urls: dict[str, Any], how: str, tiered: bool, n: int, rate: float,
            warmup: float) -> dict[str, Any]:
    seq = f"restart_{how}_{'tier' if tiered else 'none'}"
    dcs = [urls["dcs"][i % 2] for i in range(n)]
    h.pair_contact(urls["pair"], seq, dict.fromkeys(dcs, {}) if tiered else {})

    def stocked() -> int:
        return sum(h.stock(dc, seq)["stock"] for dc in set(dcs)) if tiered else 0

    base, stock_base = issued(urls["pair"], seq), stocked()
    specs = [(urls["pair"], dc if tiered else None, seq, rate, {}) for dc in dcs]
    stopped = []
    with h.Fleet(worker, specs) as fleet:
        fleet.go(delay=0.0)
        time.sleep(warmup)
        for i in range(n):  # clean: it closes its cache and exits; kill: a snapshot, SIGKILL
            stopped += fleet.ask("close" if how == "clean" else "stats", [i])
            if how != "clean":
                fleet.workers[i][0].kill()
            fleet.workers[i][0].join(30)
            fleet.go(fleet.start([specs[i]]), delay=0.0)
        time.sleep(min(warmup, 5.0))
        final = fleet.ask("pause", range(n, 2 * n))
        advance, grown = issued(urls["pair"], seq) - base, stocked() - stock_base
    used = sum(s["used"] for s in stopped) + sum(f["used"] for f in final)
    held, still_held = sum(s["held"] for s in stopped), sum(f["held"] for f in final)
    burned = advance - used - grown - still_held
    h.log(f"  rolling restart, {how}, {'tier' if tiered else 'no tier'}: burned {burned:,} of "
          f"{held:,} held (HubSpot burns all {held:,})")
    # HubSpot loses the whole cache at every swap: as a share of a day's ids, one swap a day.
    return {"processes": n, "ids_per_second_per_process": rate, "held_before_stop": held,
            "held_per_process": [s["held"] for s in stopped], "burned": burned,
            "burned_reported_by_close": sum(s.get("burned_at_close", 0) for s in stopped),
            "global_issued": advance, "taken_by_workers": used, "stock_growth": grown,
            "held_by_new_processes": still_held, "hubspot_burn_same_cache": held,
            "hubspot_share_per_daily_restart": held / (n * rate * 86_400),
            "share_per_daily_restart": burned / (n * rate * 86_400),
            "load_average_at_end": h.load()}


def outage(urls: dict[str, Any], per_dc: int, rate: float, warmup: float,
           cut: float) -> dict[str, Any]:
    seq, dcs, timeline = "outage", urls["dcs"], []  # dcs: [dc A, dc B, short]
    with contextlib.ExitStack() as stack:  # the workers killed, then the proxies closed
        proxies = [stack.enter_context(FollowingProxy.for_url(url)) for url in urls["pair"]]
        pair = [p.url(url) for p, url in zip(proxies, urls["pair"], strict=True)]
        h.pair_contact(pair, seq, {dcs[0]: {}, dcs[1]: {}, dcs[2]: SHORT_TIER})
        specs = [(pair, dcs[i % 2], seq, rate, {}) for i in range(2 * per_dc)]
        fleet = stack.enter_context(h.Fleet(worker, [*specs, (pair, dcs[2], seq, rate,
                                                              SHORT_TIER)]))
        fleet.go(delay=0.0)
        t0 = time.monotonic()

        def sample() -> list[dict[str, Any]]:
            snaps = fleet.ask("stats")
            timeline.append({"t": time.monotonic() - t0, "used": [s["used"] for s in snaps],
                             "failures": [s["failures"] for s in snaps]})
            return snaps

        def run_for(seconds: float) -> list[dict[str, Any]]:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                time.sleep(min(1.0, max(0.0, end - time.monotonic())))
                sample()
            return sample()

        run_for(warmup)
        runway = {f"dc{i}": h.stock(dc, seq) for i, dc in enumerate(dcs)}
        before, cut_at = sample(), time.monotonic()
        for mode in ("refuse", "hang"):
            for proxy in proxies:
                getattr(proxy, mode)()
            during, back_at = run_for(cut / 2), time.monotonic()
        for proxy in proxies:
            proxy.forward()
        after = run_for(min(warmup, 10.0))
    groups: dict[str, Any] = {}
    for name, members, dc_ids in (("long runway", range(2 * per_dc), (0, 1)),
                                  ("short runway", [2 * per_dc], (2,))):
        slow = [t for i in members for at, t in during[i]["slow_calls"] if cut_at <= at <= back_at]
        first = [during[i]["first_failure"] for i in members if during[i]["first_failure"]]
        groups[name] = {
            "processes": len(members),
            "runway_at_cut_seconds": {f"dc{d}": runway[f"dc{d}"]["runway"] for d in dc_ids},
            "stock_at_cut": {f"dc{d}": runway[f"dc{d}"]["stock"] for d in dc_ids},
            "shared_rate_at_cut": {f"dc{d}": runway[f"dc{d}"]["rate"] for d in dc_ids},
            "ids_taken_during_outage": grew(during, before, "used", members),
            "blocking_waits_cache": grew(during, before, "cache_waits", members),
            "blocking_waits_tier": grew(during, before, "tier_waits", members),
            "failed_calls": grew(during, before, "failures", members),
            "first_failure_after_cut_seconds": min(first) - cut_at if first else None,
            "calls_slower_than_20ms": len(slow), "slowest_call_seconds": max(slow, default=0.0),
            "ids_taken_after_outage": grew(after, during, "used", members),
        }
        h.log(f"  outage, {name}: " + ", ".join(f"{k} {groups[name][k]}" for k in (
            "blocking_waits_cache", "failed_calls", "runway_at_cut_seconds",
            "first_failure_after_cut_seconds")))
    return {"outage_seconds": cut, "ids_per_second_per_process": rate, "groups": groups,
            "timeline": timeline, "cut_at": cut_at - t0, "back_at": back_at - t0,
            "load_average_at_end": h.load()}


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, (a1, a2, a3) = h.figure(3, "Datacenter tier across processes", env,
                                 note="counts, not ratios; see the JSON for the settings")
    h.line_panel(a1, {label: [(p, r["global_round_trips_per_minute"]) for p, r in
                              results["scaling"][variant].items()] for variant, label in
                      (("no tier", "CachedSource(pair)"),
                       ("tier", "CachedSource(DatacenterTier(dc, pair))"))},
                 "global round trips (target: flat with the tier)", "round trips / min",
                 "worker processes (two datacenters)", base=2)
    h.value_panel(a2, {f"{key}: {what}": r[field] for key, r in results["restart"].items()
                       for what, field in (("burned", "burned"),
                                           ("held (HubSpot burns)", "held_before_stop"))},
                  "rolling restart: ids burned vs held", "ids")
    out = results["outage"]
    times, n = [s["t"] for s in out["timeline"]], len(out["timeline"][0]["used"])
    for i in range(n):
        a3.plot(times, [s["used"][i] for s in out["timeline"]], linewidth=1,
                color="tab:red" if i == n - 1 else "tab:blue")
    a3.axvspan(out["cut_at"], out["back_at"], color="grey", alpha=0.25, label="global pair down")
    a3.set_xlabel("seconds", fontsize=9)
    a3.set_ylabel("ids taken per process", fontsize=9)
    long, short = out["groups"]["long runway"], out["groups"]["short runway"]
    a3.set_title(f"outage: {long['blocking_waits_cache']} blocking waits (blue); short runway "
                 f"(red) fails after {short['first_failure_after_cut_seconds'] or 0:.0f} s",
                 fontsize=9)
    a3.legend(fontsize=7)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql", "mysql"))
    backends = [b for b in args.backends if b != "sqlite"]
    if not backends:
        raise SystemExit("bench_datacenter needs a server backend for its global pair")
    smoke = args.smoke
    counts = [2] if smoke else [2, 4, 8, 16, 24]
    results: dict[str, Any] = {}
    glob = "postgresql" if "postgresql" in backends else backends[0]
    kinds = [glob, glob] + [backends[i % len(backends)] for i in range(3)]
    with contextlib.ExitStack() as stack:
        made = h.databases(stack, *kinds)
        urls = {"pair": made[:2], "dcs": made[2:]}
        results["databases"] = kinds
        h.log("global round trips by process count")
        results["scaling"] = scaling(urls, counts, 5.0, 1.0 if smoke else 20.0,
                                     2.0 if smoke else 60.0)
        h.log("rolling restarts")
        n, warm = (1, 1.0) if smoke else (8, 20.0)
        results["restart"] = {
            f"{how}, {'tier' if tiered else 'no tier'}": restart(urls, how, tiered, n, 10.0, warm)
            for how, tiered in (("clean", True), ("kill", True), ("clean", False))}
        h.log("global outage")
        results["outage"] = outage(urls, 1 if smoke else 2, 20.0, 2.0 if smoke else 15.0,
                                   2.0 if smoke else 60.0)
    tier = results["scaling"]["tier"].values()
    trips = [r["global_round_trips_per_minute"] for r in tier]
    clean, kill = results["restart"]["clean, tier"], results["restart"]["kill, tier"]
    long = results["outage"]["groups"]["long runway"]
    waits = long["blocking_waits_cache"] + long["failed_calls"]
    checks = {
        "tier: global round trips, most / fewest over P": h.check(
            max(trips) / max(1e-9, min(trips)), 2.0),
        "tier: blocking waits after warm-up, every P": h.check(
            sum(r["blocking_waits_in_window"] for r in tier), 0),
        "clean rolling restart, tier: ids burned": h.check(clean["burned"], 0),
        "killed rolling restart, tier: burned / held": h.check(
            kill["burned"] / max(1, kill["held_before_stop"]), 1.0,
            kill["burned"] <= kill["held_before_stop"]),
        "outage within the runway: blocking waits": h.check(waits, 0),
    }
    return h.report(args, NAME, results, checks=checks, figure=draw(args.env, results),
                    parameters={"process_counts": counts, "fast_tier": FAST_TIER,
                                "short_tier": SHORT_TIER})


if __name__ == "__main__":
    raise SystemExit(main())
