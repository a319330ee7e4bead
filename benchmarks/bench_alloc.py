"""Allocation fast path: ns per id of a warm ``CachedSource.next_id`` vs in-process generators.

The cache is ``CachedSource(TicketServer(<throwaway PostgreSQL database>))`` with its defaults,
primed with 300,000 ids (untimed); before every cache run the refill in flight is awaited
(untimed) and the blocking waits the timed runs cause are counted (expected: 0). Compared per id,
single thread: the cache, ``uuid_utils.uuid7()``, ``snowflake.SnowflakeGenerator`` (its ``None``
results counted), ``uuid6.uuid7()``, python-ulid's ``ULID()``, a locked counter and an uncached
``TicketServer.next_id``; 8 threads sharing one generator (snowflake-id's is not thread safe),
then 200,000 ids from 8 threads checked distinct; and the cache's fast path layer by layer.
Every figure is a median of per-round ratios to ``uuid_utils.uuid7`` timed in the same round.
Target: cache <= 1.0 x uuid_utils (single thread); it must not exceed 1.5 x.

    .venv/bin/python benchmarks/bench_alloc.py [--smoke] [--rounds R] [--backends postgresql]
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any

import _common as h
import snowflake
import uuid6
import uuid_utils
from ulid import ULID

from sqlalchemy_tickets import CachedSource, TicketServer

NAME, TARGET, LIMIT, THREADS = "bench_alloc", 1.0, 1.5, 8
REF, CACHE = "uuid_utils.uuid7", "CachedSource.next_id"


def locked_counter() -> Any:
    lock, n = threading.Lock(), [0]

    def next_id() -> int:
        with lock:
            n[0] += 1
            return n[0]

    return next_id


def cache_variant(name: str, cache: CachedSource, run: Any, n: int, waits: list[int]) -> Any:
    """Refills awaited before each run (untimed); the blocking waits of the run counted."""

    def setup() -> None:
        cache.wait_idle(10.0)
        waits.append(-cache.stats()["blocking_waits"])

    def teardown(_: Any) -> None:
        waits[-1] += cache.stats()["blocking_waits"]

    return h.Variant(name, run, setup, teardown, per=n)


def threaded(name: str, work: Any, ids: int, before: Any = None) -> Any:
    """8 threads started untimed and parked on a barrier; the timed run releases them and
    joins them (``ids``: all threads' ids together)."""

    def setup() -> list[threading.Thread]:
        if before is not None:
            before()
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


class Prefilled:
    """The attributes ``CachedSource.next_id`` reads, over a deque filled beforehand: its own
    code (not a copy) with no refills behind it."""

    next_id = CachedSource.next_id

    def __init__(self, ids: deque[int]) -> None:
        self._next64, self._next = {"bench": ids.popleft}, {("bench", 64): ids.popleft}

    def _next_id_slow(self, sequence: str | None, bits: int) -> int:
        raise AssertionError("the prefilled deque ran dry")


def breakdown(cache: CachedSource, n: int, waits: list[int]) -> list[Any]:
    """Each step adds one thing the hot path does; adjacent differences are its cost."""
    queues = [deque[int]() for _ in range(4)]
    refills = [lambda q=q: q.extend(range(1 << 40, (1 << 40) + n)) for q in queues]
    pops = [q.popleft for q in queues]

    def call(sequence: str) -> int:
        return pops[1]()

    def kw_bits(sequence: str | None = None, *, bits: int = 64) -> int:
        return pops[2]()

    steps = [pops[0], call, kw_bits, Prefilled(queues[3]).next_id]
    names = [
        "1 deque.popleft",
        "2 + python call",
        "3 + kw-only bits=64",
        "4 next_id's code, prefilled",
    ]
    chosen = [h.Variant(names[0], h.loop(steps[0], n), refills[0], per=n)]
    chosen += [
        h.Variant(m, h.loop(f, n, "bench"), r, per=n)
        for m, f, r in zip(names[1:], steps[1:], refills[1:], strict=False)
    ]
    chosen.append(cache_variant("5 " + CACHE, cache, h.loop(cache.next_id, n, "bench"), n, waits))
    return chosen + [h.Variant(REF, h.loop(uuid_utils.uuid7, n), per=n)]


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, backends=("postgresql",))
    backend = next((b for b in args.backends if b != "sqlite"), args.backends[0])
    n, uncached, rounds = (
        (2_000, 10, h.rounds(args, 51)) if args.smoke else (40_000, 150, h.rounds(args, 51))
    )
    env = h.environment("uuid-utils", "uuid6", "python-ulid", "snowflake-id")
    waits: dict[str, list[int]] = {"single": [], "threads": [], "breakdown": []}
    with h.throwaway_database(backend) as url:
        server, cache = TicketServer(url), CachedSource(TicketServer(url))
        try:
            server.next_id("bench_uncached")  # first contact: creates the table
            h.loop(cache.next_id, 20_000 if args.smoke else 300_000, "bench")()  # teaches the rate
            nones: list[int] = []
            flake = snowflake.SnowflakeGenerator(1).__next__
            single = [
                cache_variant(CACHE, cache, h.loop(cache.next_id, n, "bench"), n, waits["single"]),
                h.Variant(REF, h.loop(uuid_utils.uuid7, n), per=n),
                h.Variant("snowflake-id", h.none_counting_loop(flake, n, nones), per=n),
                h.Variant("uuid6.uuid7", h.loop(uuid6.uuid7, n), per=n),
                h.Variant("python-ulid ULID()", h.loop(ULID, n), per=n),
                h.Variant("locked counter", h.loop(locked_counter(), n), per=n),
                h.Variant(
                    "TicketServer.next_id",
                    h.loop(server.next_id, uncached, "bench_uncached"),
                    per=uncached,
                ),
            ]
            timings = {"single": h.interleave(single, rounds, label="1 thread: ")}
            per, watch = n // THREADS, cache_variant("", cache, None, 0, waits["threads"])
            many = [
                threaded(CACHE, h.loop(cache.next_id, per, "bench"), per * THREADS, watch.setup),
                threaded(REF, h.loop(uuid_utils.uuid7, per), per * THREADS),
                threaded("locked counter", h.loop(locked_counter(), per), per * THREADS),
                threaded("uuid6.uuid7", h.loop(uuid6.uuid7, per), per * THREADS),
                threaded("python-ulid ULID()", h.loop(ULID, per), per * THREADS),
            ]
            many[0].teardown = watch.teardown
            timings["threads"] = h.interleave(many, rounds, label=f"{THREADS} threads: ")
            timings["breakdown"] = h.interleave(
                breakdown(cache, n, waits["breakdown"]), rounds, label="breakdown: "
            )
            unique = distinct_across_threads(cache, 2_000 if args.smoke else 25_000)
            stats = cache.stats()
        finally:
            cache.close()
            cache.source.close()  # type: ignore[attr-defined]
            server.close()
    results = {
        group: {
            "ratio_to_uuid_utils": {v: h.ratio_summary(t, v, REF) for v in t.seconds},
            "median_ns_per_id": {v: t.median(v) * 1e9 for v in t.seconds},
            **t.to_json(),
        }
        for group, t in timings.items()
    }
    check = {**h.ratio_summary(timings["single"], CACHE, REF, TARGET), "hard_limit": LIMIT}
    check["within_hard_limit"] = check["median"] <= LIMIT
    results["single"]["ratio_to_uuid_utils"][CACHE] = check  # drawn with its target
    title = f"Warm CachedSource(TicketServer({backend})).next_id vs in-process generators"
    fig, axes = h.figure(3, title, env)
    for ax, group in zip(axes, ("single", "threads"), strict=False):
        ratios = results[group]["ratio_to_uuid_utils"]
        h.ratio_panel(ax, ratios, f"{group}: time per id / uuid_utils", log_scale=True)
    ns = results["breakdown"]["median_ns_per_id"]
    h.value_panel(axes[2], ns, "where the cache's ns go", "ns")
    results["snowflake_id_none_results_per_round"] = nones[1:]
    results["blocking_waits_during_timed_runs"] = {k: sum(v[1:]) for k, v in waits.items()}
    results["threads_uniqueness_check"], results["cache_stats_at_end"] = unique, stats
    checks = {f"{CACHE}/{REF}": check}
    return h.report(
        args,
        NAME,
        env=env,
        results=results,
        checks=checks,
        figure=fig,
        parameters={"cache_backend": backend, "ids_per_run": n, "uncached_calls_per_run": uncached},
    )


def distinct_across_threads(cache: CachedSource, per: int) -> dict[str, Any]:
    """Untimed: ids taken by 8 threads at once are all distinct, each thread's increasing."""
    got: list[list[int]] = [[] for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)
    pool = [
        threading.Thread(
            target=lambda s=s: (
                barrier.wait(),
                s.extend(cache.next_id("bench") for _ in range(per)),
            )
        )
        for s in got
    ]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    ids = [i for slot in got for i in slot]
    ordered = all(a < b for slot in got for a, b in zip(slot, slot[1:], strict=False))
    assert len(set(ids)) == per * THREADS and ordered, "8 threads got duplicate or unordered ids"
    return {"ids": len(ids), "distinct": len(set(ids)), "per_thread_increasing": ordered}


if __name__ == "__main__":
    sys.exit(main())
