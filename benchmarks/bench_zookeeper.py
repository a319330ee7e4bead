"""The ZooKeeper global tier: blocks per second and next_block latency from 1, 8 and 24
processes against a 3-server ensemble, beside a TicketServer on PostgreSQL and on MariaDB; ids
per second through CachedSource(DatacenterTier(..., upstream=ZooKeeperSource)) beside the same
layers over the Flickr pair; the delay a caller sees when the ensemble's leader is killed.

The ensemble is started here (``tests/support/zookeeper.py``). ``--strict``: exit 1 if a caller
saw an error when the leader was killed. ``--smoke``: P = 1,2, 1 s.

    .venv/bin/python benchmarks/bench_zookeeper.py [--smoke] [--procs 1,8,24] [--seconds 5]
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Any

import _harness as h

import sqlalchemy_tickets as st

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from support.zookeeper import start_ensemble  # noqa: E402

NAME, BLOCK = "bench_zookeeper", 100


def worker(spec: dict[str, Any], conn: Any) -> None:
    """Part 1, one process: a first call untimed, then the window's; its latencies in ms."""
    source = (st.ZooKeeperSource(spec["hosts"], path="/bench", timeout=30.0) if "hosts" in spec
              else st.TicketServer(spec["url"], timeout=30.0))
    with contextlib.closing(source):
        source.next_block(spec["sequence"], BLOCK)
        conn.send("ready")
        took = h.window(lambda: source.next_block(spec["sequence"], BLOCK), conn.recv(),
                        spec["seconds"])[0]
    conn.send([s * 1e3 for s in took])


def blocks(specs: dict[str, dict[str, Any]], procs: list[int], seconds: float) -> dict[str, Any]:
    """Part 1: per source and P, blocks/s and the latencies pooled over the P workers."""
    out: dict[str, Any] = {label: {} for label in specs}
    for p in procs:
        for label, spec in specs.items():
            specs_p = [{**spec, "sequence": f"blocks_p{p}", "seconds": seconds}] * p
            with h.Fleet(worker, specs_p, grace=60) as fleet:
                fleet.go()
                pooled = [ms for run in fleet.hear() for ms in run]
            d = h.distribution(pooled)
            out[label][str(p)] = {"blocks_per_second": len(pooled) / seconds,
                                  "p50_ms": d.get("p50"), "p99_ms": d.get("p99"),
                                  "max_ms": d.get("max"), "calls": len(pooled)}
            h.log(f"  {label:<22} P={p:<3} {len(pooled) / seconds:9,.0f} blocks/s  "
                  f"p50 {d.get('p50', 0):7.2f} ms  p99 {d.get('p99', 0):7.2f} ms")
    return out


def layered(dc: str, upstream: Any, seconds: float, sequence: str) -> dict[str, Any]:
    """Part 2: ids/s of ``next_id`` through a cache over a tier over ``upstream``, ids distinct."""
    h.tier_contact(dc, upstream, [sequence], supply=5.0)
    with st.DatacenterTier(dc, upstream, supply=5.0, timeout=10.0) as tier, \
            st.CachedSource(tier) as cache:
        h.loop(cache.next_id, 100, sequence)()  # warm: the cache's first refills
        chunk = lambda: [cache.next_id(sequence) for _ in range(1000)]  # noqa: E731
        elapsed, (_, chunks, _) = h.timed(h.window, chunk, time.monotonic(), seconds)
        ids = [i for chunk in chunks for i in chunk]
        if len(set(ids)) != len(ids):
            raise SystemExit("duplicate ids through the layers")
        found = {"ids_per_second": len(ids) / elapsed,
                 "blocking_waits": cache.stats()["blocking_waits"],
                 "tier_upstream_round_trips": tier.stats()["upstream_round_trips"]}
    h.log(f"  {sequence:<12} {found['ids_per_second']:12,.0f} ids/s")
    return found


def leader_kill(ensemble: Any, after: float) -> dict[str, Any]:
    """Part 3: an uncached ``next_block`` back to back, the leader SIGKILLed 2 s in: latencies
    (ms) before and for ``after`` s after the kill, and the calls that failed."""
    with contextlib.closing(st.ZooKeeperSource(ensemble.hosts, path="/bench-kill",
                                               timeout=2.0)) as source:
        take = lambda: source.next_block("kill", BLOCK)  # noqa: E731
        take()
        early, _, errors = h.window(take, time.monotonic(), 2.0, Exception)
        ensemble.kill(ensemble.leader())
        late, _, more = h.window(take, time.monotonic(), after, Exception)
    before, then = (h.distribution([s * 1e3 for s in x]) for x in (early, late))
    h.log(f"  leader killed: p99 {then.get('p99', 0):.1f} ms, max {then.get('max', 0):.1f} ms"
          f" after it (p99 {before.get('p99', 0):.1f} ms before), {len(errors + more)} errors")
    return {"before": before, "after": then, "errors": len(errors + more),
            "window_after_s": after}


def draw(env: dict[str, Any], results: dict[str, Any]) -> Any:
    fig, axes = h.figure(3, "ZooKeeperSource: next_block from P processes; layers; leader "
                         "killed", env, note="one run per point", width=5.0, height=4.5)
    for ax, key, unit in zip(axes, ("blocks_per_second", "p99_ms"), ("blocks/s", "ms"),
                             strict=False):
        h.line_panel(ax, {label: [(int(p), v[key] or 0) for p, v in per_p.items()]
                          for label, per_p in results["blocks"].items()},
                     f"{key.replace('_', ' ')} (next_block of {BLOCK})", unit, "processes P",
                     base=2)
    values = {f"ids/s via {k}": v["ids_per_second"] for k, v in results["layered"].items()}
    values |= {f"leader kill: {k} ms": results["leader_kill"]["after"].get(k, 0)
               for k in ("p99", "max")}
    h.value_panel(axes[2], values, "layers (ids/s) and leader kill (ms)", "", log_scale=True)
    return fig


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, {
        "--procs": dict(type=h.ints, default="1,8,24", help="process counts, comma-separated"),
        "--seconds": dict(type=float, default=5.0, help="timed window per run")},
        backends=("postgresql", "mysql"), peers=("kazoo",))
    procs = [1, 2] if args.smoke else args.procs
    seconds = 1.0 if args.smoke else args.seconds
    with contextlib.ExitStack() as stack:  # the databases dropped, then the ensemble stopped
        ensemble = start_ensemble()
        stack.callback(ensemble.close)
        pg, my, pg2, dc = h.databases(stack, "postgresql", "mysql", "postgresql", "postgresql")
        for url in (pg, my):
            h.first_contact(url, [f"blocks_p{p}" for p in procs])
        h.log("part 1: next_block from P processes")
        specs = {"ZooKeeper (3 servers)": {"hosts": ensemble.hosts},
                 "TicketServer PostgreSQL": {"url": pg}, "TicketServer MariaDB": {"url": my}}
        results = {"blocks": blocks(specs, procs, seconds)}
        h.log("part 2: ids/s through CachedSource(DatacenterTier(upstream))")
        with contextlib.closing(st.ZooKeeperSource(ensemble.hosts, path="/bench-layers")) as zk, \
                contextlib.closing(st.TicketServers([pg2, my])) as pair:
            results["layered"] = {"ZooKeeper": layered(dc, zk, seconds, "layered_zk"),
                                  "Flickr pair": layered(dc, pair, seconds, "layered_pair")}
        h.log("part 3: the leader killed under an uncached caller")
        results["leader_kill"] = leader_kill(ensemble, 1.0 if args.smoke else 5.0)
    return h.report(args, NAME, results, figure=draw(args.env, results), checks={
                    "leader_kill_errors": h.check(float(results["leader_kill"]["errors"]), 0.0)},
                    parameters={"procs": procs, "seconds": seconds, "block": BLOCK})


if __name__ == "__main__":
    raise SystemExit(main())
