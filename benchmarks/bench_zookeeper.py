"""The ZooKeeper global tier: blocks per second and next_block latency from 1, 8 and 24
processes against a 3-server ensemble, beside a TicketServer on PostgreSQL and on MariaDB; ids
per second through CachedSource(DatacenterTier(..., upstream=ZooKeeperSource)) beside the same
layers over the Flickr pair; the delay a caller sees when the ensemble's leader is killed.

The ensemble is started here (``tests/support/zookeeper.py``: Debian's ZooKeeper 3.8, 3 JVMs of
128 MB on loopback, ``tickTime`` 200 ms, fsync on). Part 1: for each P (``--procs``, default
1,8,24) and each source, P spawned processes call ``next_block(seq, 100)`` back to back for
``--seconds`` (default 5) from one shared start instant, each call timed; blocks/s is all calls
÷ the window, p50/p99 of the pooled latencies. Part 2: one process, ``next_id`` for
``--seconds`` through ``CachedSource(DatacenterTier(dc, upstream))``, the datacenter database
on PostgreSQL, upstream the ensemble or ``TicketServers([pg, mariadb])``. Part 3: one process
calls ``next_block`` back to back on an uncached ZooKeeperSource (``timeout`` 2 s); the leader
is SIGKILLed after 2 s; p99 and max latency over the 5 s after the kill, and errors (0
expected). ``--smoke``: P = 1,2, 1 s.

    .venv/bin/python benchmarks/bench_zookeeper.py [--smoke] [--procs 1,8,24] [--seconds 5]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from typing import Any

import _common as h

sys.path.insert(0, str(h.REPO_DIR / "tests"))
from support.zookeeper import start_ensemble  # noqa: E402

NAME = "bench_zookeeper"
BLOCK = 100
SPAWN = multiprocessing.get_context("spawn")


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--procs", default="1,8,24", help="process counts, comma-separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="timed window per run")


def _source(spec: dict[str, Any]) -> Any:
    from sqlalchemy_tickets import TicketServer, ZooKeeperSource

    if spec["kind"] == "zookeeper":
        return ZooKeeperSource(spec["hosts"], path=spec["path"], timeout=30.0)
    return TicketServer(spec["url"], timeout=30.0)


def _worker(spec: dict[str, Any], sequence: str, barrier: Any, seconds: float,
            queue: Any) -> None:
    """Block latencies (ms) of one process, once every process made first contact."""
    source = _source(spec)
    try:
        source.next_block(sequence, BLOCK)  # first contact: connect, create
        barrier.wait(300)
        out: list[float] = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            began = time.perf_counter()
            source.next_block(sequence, BLOCK)
            out.append((time.perf_counter() - began) * 1000)
        queue.put(out)
    finally:
        source.close()


def _run(spec: dict[str, Any], sequence: str, p: int, seconds: float) -> list[list[float]]:
    barrier, queue = SPAWN.Barrier(p), SPAWN.Queue()
    workers = [SPAWN.Process(target=_worker, args=(spec, sequence, barrier, seconds, queue))
               for _ in range(p)]
    for worker in workers:
        worker.start()
    runs = [queue.get(timeout=600) for _ in workers]
    for worker in workers:
        worker.join(60)
    return runs


def _blocks(specs: dict[str, dict[str, Any]], procs: list[int], seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for p in procs:
        for label, spec in specs.items():
            runs = _run(spec, f"blocks_p{p}", p, seconds)
            pooled = [ms for run in runs for ms in run]
            dist = h.distribution(pooled)
            results.setdefault(label, {})[str(p)] = {
                "blocks_per_second": len(pooled) / seconds, "p50_ms": dist.get("p50"),
                "p99_ms": dist.get("p99"), "max_ms": dist.get("max"), "calls": len(pooled),
            }
            h.log(f"  {label:<22} P={p:<3} {len(pooled) / seconds:9,.0f} blocks/s  "
                  f"p50 {dist.get('p50', 0):7.2f} ms  p99 {dist.get('p99', 0):7.2f} ms")
    return results


def _layered(dc: Any, upstream: Any, seconds: float, sequence: str) -> dict[str, Any]:
    from sqlalchemy_tickets import CachedSource, DatacenterTier

    tier = DatacenterTier(dc, upstream, supply=5.0, timeout=10.0)
    cache = CachedSource(tier)
    try:
        seen = [cache.next_id(sequence) for _ in range(100)]  # warm: first refills
        n, end = 0, time.monotonic() + seconds
        started = time.perf_counter()
        while time.monotonic() < end:
            for _ in range(1000):
                seen.append(cache.next_id(sequence))
            n += 1000
        elapsed = time.perf_counter() - started
        stats = cache.stats()
        if len(set(seen)) != len(seen):
            raise SystemExit("duplicate ids through the layers")
        return {"ids_per_second": n / elapsed, "blocking_waits": stats["blocking_waits"],
                "tier_upstream_round_trips": tier.stats()["upstream_round_trips"]}
    finally:
        cache.close()
        tier.close()


def _leader_kill(ensemble: Any, seconds_after: float) -> dict[str, Any]:
    from sqlalchemy_tickets import ZooKeeperSource

    source = ZooKeeperSource(ensemble.hosts, path="/bench-kill", timeout=2.0)
    samples: list[tuple[float, float]] = []
    errors = 0
    try:
        source.next_block("kill", BLOCK)
        begin = time.monotonic()
        killed_at = None
        while time.monotonic() < (killed_at or begin + 2.0) + seconds_after:
            if killed_at is None and time.monotonic() > begin + 2.0:
                leader = ensemble.leader()
                ensemble.kill(leader)
                killed_at = time.monotonic()
            t0 = time.perf_counter()
            try:
                source.next_block("kill", BLOCK)
            except Exception:  # noqa: BLE001 - counted: the figure to report
                errors += 1
            samples.append((time.monotonic(), (time.perf_counter() - t0) * 1000))
    finally:
        source.close()
        ensemble.start()
        ensemble.wait_serving()
    assert killed_at is not None
    before = h.distribution([ms for at, ms in samples if at < killed_at])
    after = h.distribution([ms for at, ms in samples if at >= killed_at])
    h.log(f"  leader killed: p99 {after.get('p99', 0):.1f} ms, max {after.get('max', 0):.1f} ms"
          f" after it (p99 {before.get('p99', 0):.1f} ms before), {errors} errors")
    return {"before": before, "after": after, "errors": errors,
            "window_after_s": seconds_after}


def _figure(env: dict[str, Any], blocks: dict[str, Any], layered: dict[str, Any],
            kill: dict[str, Any]) -> Any:
    fig, (ax1, ax2, ax3) = h.figure(3, "ZooKeeperSource: next_block from P processes; layers; "
                                    "leader killed", env, note="one run per point",
                                    width=5.0, height=4.5)
    for label, per_p in blocks.items():
        ps = [int(p) for p in per_p]
        ax1.plot(ps, [v["blocks_per_second"] for v in per_p.values()], marker="o", label=label)
        ax2.plot(ps, [v["p99_ms"] or 0 for v in per_p.values()], marker="o", label=label)
    for ax, title in ((ax1, f"blocks/s (next_block of {BLOCK})"), (ax2, "p99 latency (ms)")):
        ax.set_xlabel("processes")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=7)
    values = {f"ids/s via {k}": v["ids_per_second"] for k, v in layered.items()}
    values |= {"leader kill: p99 ms": kill["after"].get("p99", 0),
               "leader kill: max ms": kill["after"].get("max", 0)}
    h.value_panel(ax3, values, "layers (ids/s) and leader kill (ms)", "", log_scale=True)
    return fig


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, _extra, backends=("postgresql", "mysql"))
    procs = [1, 2] if args.smoke else [int(p) for p in args.procs.split(",") if p]
    seconds = 1.0 if args.smoke else args.seconds
    env = h.environment("kazoo")
    ensemble = start_ensemble()
    try:
        with h.throwaway_database("postgresql") as pg, h.throwaway_database("mysql") as my, \
                h.throwaway_database("postgresql") as pg2, \
                h.throwaway_database("postgresql") as dc:
            specs = {"ZooKeeper (3 servers)": {"kind": "zookeeper", "hosts": ensemble.hosts,
                                               "path": "/bench"},
                     "TicketServer PostgreSQL": {"kind": "server", "url": str(pg)},
                     "TicketServer MariaDB": {"kind": "server", "url": str(my)}}
            for spec in specs.values():  # render URLs with their passwords for the workers
                if "url" in spec:
                    spec["url"] = next(u for u in (pg, my)
                                       if str(u) == spec["url"]).render_as_string(False)
            h.log("part 1: next_block from P processes")
            blocks = _blocks(specs, procs, seconds)
            h.log("part 2: ids/s through CachedSource(DatacenterTier(upstream))")
            from sqlalchemy_tickets import TicketServers, ZooKeeperSource

            zk = ZooKeeperSource(ensemble.hosts, path="/bench-layers")
            pair = TicketServers([pg2, my])
            try:
                layered = {"ZooKeeper": _layered(dc, zk, seconds, "layered_zk"),
                           "Flickr pair": _layered(dc, pair, seconds, "layered_pair")}
            finally:
                zk.close()
                pair.close()
            for label, found in layered.items():
                h.log(f"  {label:<12} {found['ids_per_second']:12,.0f} ids/s")
            h.log("part 3: the leader killed under an uncached caller")
            kill = _leader_kill(ensemble, 1.0 if args.smoke else 5.0)
    finally:
        ensemble.close()
    results = {"blocks": blocks, "layered": layered, "leader_kill": kill}
    checks = {"leader_kill_errors": {"median": float(kill["errors"]), "target": 0.0,
                                     "passed": kill["errors"] == 0}}
    return h.report(args, NAME, env=env,
                    parameters={"procs": procs, "seconds": seconds, "block": BLOCK},
                    results=results, checks=checks, figure=_figure(env, blocks, layered, kill))


if __name__ == "__main__":
    raise SystemExit(main())
