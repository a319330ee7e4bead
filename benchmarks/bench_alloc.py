"""Allocation fast path: ns per id of a warm ``CachedSource.next_id`` against in-process
generators, and over a datacenter tier against over a ticket server.

Groups of 40,000 ids a run, 51 rounds, caches primed and blocking waits counted: ``single``, the
cache vs uuid_utils, snowflake-id, uuid6, python-ulid, a locked counter and an uncached
``TicketServer.next_id`` (**target: cache <= 1.0 x uuid_utils, never > 1.5 x**); ``threads``, 8
threads sharing each (their ids checked distinct); ``tier``, a cache over ``DatacenterTier`` vs
over ``TicketServer`` (**target <= 1.1**).

    .venv/bin/python benchmarks/bench_alloc.py [--smoke] [--rounds 51] [--backends postgresql]
"""

from __future__ import annotations

import threading
import time
from typing import Any

import _harness as h
import snowflake
import uuid6
import uuid_utils
from ulid import ULID

from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer

NAME, TARGET, LIMIT, TIER_TARGET, THREADS = "bench_alloc", 1.0, 1.5, 1.1, 8
REF, CACHE = "uuid_utils.uuid7", "CachedSource.next_id"
TIER, SERVER = "cache over DatacenterTier", "cache over TicketServer"


def locked_counter() -> Any:
    lock, n = threading.Lock(), [0]

    def next_id() -> int:
        with lock:
            n[0] += 1
            return n[0]

    return next_id


def threaded(name: str, work: Any, ids: int) -> h.Variant:
    """8 threads parked on a barrier (untimed); a run releases and joins them (``ids``: all's)."""

    def setup() -> list[Any]:
        barrier = threading.Barrier(THREADS + 1)
        pool = [threading.Thread(target=lambda: (barrier.wait(), work())) for _ in range(THREADS)]
        for thread in pool:
            thread.start()
        while barrier.n_waiting < THREADS:
            time.sleep(0.0005)
        return [barrier, *pool]

    def run(state: list[Any]) -> None:
        state[0].wait()
        for thread in state[1:]:
            thread.join()

    return h.Variant(name, run, setup, per=ids)


def distinct_across_threads(cache: CachedSource, per: int) -> dict[str, Any]:
    """Untimed: ids taken by 8 threads at once are all distinct, each thread's increasing."""
    got: list[list[int]] = []
    check = threaded("", lambda: got.append([cache.next_id("bench") for _ in range(per)]), 0)
    check.run(check.setup())
    ids = [i for slot in got for i in slot]
    ordered = all(a < b for slot in got for a, b in zip(slot, slot[1:], strict=False))
    assert len(set(ids)) == per * THREADS and ordered, "8 threads got duplicate or unordered ids"
    return {"ids": len(ids), "distinct": len(set(ids)), "per_thread_increasing": ordered}


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql",),
                        peers=("uuid-utils", "uuid6", "python-ulid", "snowflake-id"))
    backend = next((b for b in args.backends if b != "sqlite"), args.backends[0])
    n, uncached, primed = (2_000, 10, 20_000) if args.smoke else (40_000, 150, 300_000)
    rounds = h.rounds(args, 51)
    waits: dict[str, list[int]] = {"single": [], "threads": [], TIER: [], SERVER: []}
    nones: list[int] = []
    with h.throwaway_database(backend) as url, h.throwaway_database(backend) as dc:
        h.first_contact(url, ["bench", "bench_uncached"])
        server, upstream = TicketServer(url), TicketServer(url)
        h.tier_contact(dc, upstream, ["bench"])
        tier = DatacenterTier(dc, upstream=upstream)
        caches = {CACHE: CachedSource(TicketServer(url)),
                  TIER: CachedSource(tier, waste_ratio=1.0),
                  SERVER: CachedSource(TicketServer(url), waste_ratio=1.0)}
        try:
            for cache in caches.values():
                h.loop(cache.next_id, primed, "bench")()  # teaches the rate, fills the blocks
            cache = caches[CACHE]
            single = [
                h.watched(h.Variant(CACHE, h.loop(cache.next_id, n, "bench"), per=n), cache,
                          waits["single"]),
                h.Variant(REF, h.loop(uuid_utils.uuid7, n), per=n),
                h.Variant("snowflake-id", h.loop(snowflake.SnowflakeGenerator(1).__next__, n,
                                                 nones=nones), per=n),
                h.Variant("uuid6.uuid7", h.loop(uuid6.uuid7, n), per=n),
                h.Variant("python-ulid ULID()", h.loop(ULID, n), per=n),
                h.Variant("locked counter", h.loop(locked_counter(), n), per=n),
                h.Variant("TicketServer.next_id",
                          h.loop(server.next_id, uncached, "bench_uncached"), per=uncached),
            ]
            timings = {"single": h.interleave(single, rounds, label="1 thread: ")}
            per = n // THREADS
            many = [h.watched(threaded(CACHE, h.loop(cache.next_id, per, "bench"), n), cache,
                              waits["threads"])]
            many += [threaded(name, h.loop(call, per), n) for name, call in (
                (REF, uuid_utils.uuid7), ("locked counter", locked_counter()),
                ("uuid6.uuid7", uuid6.uuid7), ("python-ulid ULID()", ULID))]
            timings["threads"] = h.interleave(many, rounds, label=f"{THREADS} threads: ")
            pair = [h.watched(h.Variant(k, h.loop(caches[k].next_id, n, "bench"), per=n),
                              caches[k], waits[k]) for k in (TIER, SERVER)]
            timings["tier"] = h.interleave([*pair, h.Variant(REF, h.loop(uuid_utils.uuid7, n),
                                                             per=n)], rounds, label="tier: ")
            unique = distinct_across_threads(cache, 2_000 if args.smoke else 25_000)
            stats = {k: {s: v for s, v in c.stats().items() if s != "sequences"}
                     for k, c in caches.items()}
        finally:
            for cache in caches.values():
                cache.close()
                cache.source.close()  # type: ignore[attr-defined]
            upstream.close()
            server.close()
    results: dict[str, Any] = {group: {
        "ratio_to_uuid_utils": {v: h.ratio_summary(t, v, REF) for v in t.seconds},
        **t.to_json("median_ns_per_id", 1e9)} for group, t in timings.items()}
    check = {**h.ratio_summary(timings["single"], CACHE, REF, TARGET), "hard_limit": LIMIT}
    check["within_hard_limit"] = check["median"] <= LIMIT
    results["single"]["ratio_to_uuid_utils"][CACHE] = check  # drawn with its target
    tier_check = h.ratio_summary(timings["tier"], TIER, SERVER, TIER_TARGET)
    results["tier"]["tier_over_server"] = tier_check
    results["snowflake_id_none_results_per_round"] = nones[1:]
    results["blocking_waits_during_timed_runs"] = {k: sum(v[1:]) for k, v in waits.items()}
    results["threads_uniqueness_check"], results["cache_stats_at_end"] = unique, stats
    return h.report(args, NAME, results, log_scale=True, height=7,
                    title=f"Warm CachedSource.next_id ({backend}) vs in-process generators "
                    "(time per id / uuid_utils)",
                    parameters={"cache_backend": backend, "ids_per_run": n, "primed": primed,
                                "uncached_calls_per_run": uncached, "rounds": rounds})


if __name__ == "__main__":
    raise SystemExit(main())
