"""What the rewind guard costs: ``TicketServer.next_block`` and a warm ``CachedSource.next_id``
over a guarded server vs the same over a server with the guard switched off.

The guard (commit 565f753) adds to the block path: on PostgreSQL two more conditions in the
take's WHERE (``tableoid`` and the current timeline; no extra round trip); on MySQL/MariaDB and
SQLite a separate identity query at most every ``identity_interval`` s (default 1.0) per table
and on each new connection; in process, a dict read and a comparison per block.

``guarded`` is a plain ``TicketServer(url)``. ``unguarded``, the baseline, is the pre-guard
path: there is no public switch, so after the server's first block (first contact, untimed)
every entry of its ``_known`` gets ``identity = None`` (PostgreSQL then runs the unguarded
``take_block`` statement) and the server gets ``identity_interval = 1e9`` (no periodic
identity query). An identity query still follows a new connection, which a server used from
one thread at a time never opens: before each of its runs the script asserts that the
baseline's identities are still ``None``. What the baseline still does is the in-process part
(the high-water mark read and compared per block): it has no switch, and it is nanoseconds
against a round trip of hundreds of microseconds, far below what this can resolve; the ratios
are the identity checks' cost. ``unguarded A/A`` is a second baseline server, the
noise floor. Each server has its own sequence (table) on one throwaway database per backend.

1. ``next_block(seq, n)`` for n = 1 (the worst case: the guard is paid per id) and n = 100,
   500 calls per run (50 with ``--smoke``): short runs and many rounds, because every call
   waits for a commit to reach the disk and the disk's stalls come and go in seconds. Also
   reported: the round trips a run made beyond its calls (the identity queries: MySQL/MariaDB
   and SQLite only; about one per run here, where the guarded server is idle between its runs
   for longer than ``identity_interval``: more often than a server called steadily makes them).
   **Target: guarded / unguarded <= 1.05** per backend and block size.
2. ``CachedSource(server).next_id`` over each kind of server, each cache with
   ``waste_ratio=1.0`` and ``max_block=2_000_000`` and primed with 2,000,000 ids (untimed), so
   that it holds far more than a run takes: 200,000 ids per run (5,000 with ``--smoke``);
   refills in flight are awaited before each run (untimed) and the blocking waits a run causes
   are counted (expected 0; with the defaults the timed loop, holding the GIL, outran the
   refills and every run waited on round trips). Expected 1.00 (the guard adds nothing per
   id), checked against <= 1.05, the noise a median of per-round ratios still carries here.

41 interleaved rounds (1 with ``--smoke``) after a warm-up round; medians of per-round ratios
(the JSON has the client-CPU ratio beside each, ``cpu_median``).

    .venv/bin/python benchmarks/bench_rewind_guard.py [--smoke] [--rounds R]
        [--backends sqlite,postgresql,mysql]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from typing import Any

import _common as h

from sqlalchemy_tickets import CachedSource, TicketServer

NAME, TARGET, CACHE_TARGET, ROUNDS = "bench_rewind_guard", 1.05, 1.05, 41
BLOCKS = (1, 100)
GUARDED, UNGUARDED, AA = "guarded", "unguarded", "unguarded A/A"
#: The baseline's identity_interval: no periodic identity query within a run of the script.
NEVER = 1e9
#: (calls per next_block run, ids per cache run, ids priming each cache), normal and smoke.
SIZES = {False: (500, 200_000, 2_000_000), True: (50, 5_000, 20_000)}
#: The caches' max_block: a run's ids always in hand (see the docstring).
MAX_BLOCK = 2_000_000


def unguard(server: TicketServer) -> None:
    """The pre-guard path (no public switch): forget every known table's identity, so the take
    carries no guard (PostgreSQL) and nothing compares it, and never query it on a timer."""
    server.identity_interval = NEVER
    for known in server._known.values():
        known.identity = None


def assert_unguarded(server: TicketServer) -> None:
    """A new connection would make the server check (and so remember) identities again."""
    armed = [k.table.label for k in server._known.values() if k.identity is not None]
    assert not armed, f"the baseline {server} re-armed its guard for {armed}"


def assert_guarded(server: TicketServer) -> None:
    bare = [k.table.label for k in server._known.values() if k.identity is None]
    assert server._known and not bare, f"the guarded {server} knows no identity for {bare}"


def servers(url: Any, prefix: str) -> dict[str, tuple[TicketServer, str]]:
    """The three servers, each on a sequence of its own, past first contact (untimed)."""
    made: dict[str, tuple[TicketServer, str]] = {}
    for index, name in enumerate((GUARDED, UNGUARDED, AA)):
        server, sequence = TicketServer(url), f"{prefix}_{index}"
        made[name] = server, sequence
        server.next_block(sequence, 1)  # first contact: table, stamp, identity recorded
        if name == GUARDED:
            assert_guarded(server)
        else:
            unguard(server)
    return made


def block_variant(
    name: str, server: TicketServer, sequence: str, count: int, calls: int, extra: list[int]
) -> h.Variant:
    """``calls`` × ``next_block(sequence, count)``; ``extra`` gets, per run, the round trips
    beyond one per call (the identity queries)."""

    def setup() -> None:
        if name == GUARDED:
            assert_guarded(server)
        else:
            assert_unguarded(server)
        extra.append(-server.stats()["round_trips"] - calls)

    def teardown(_: Any) -> None:
        extra[-1] += server.stats()["round_trips"]

    run = h.loop(server.next_block, calls, sequence, count)
    return h.Variant(name, run, setup, teardown, per=calls)


def cache_variant(
    name: str, cache: CachedSource, server: TicketServer, sequence: str, n: int, waits: list[int]
) -> h.Variant:
    """``n`` × a warm ``next_id``; the refill in flight awaited first, blocking waits counted."""

    def setup() -> None:
        cache.wait_idle(10.0)
        (assert_guarded if name == GUARDED else assert_unguarded)(server)
        waits.append(-cache.stats()["blocking_waits"])

    def teardown(_: Any) -> None:
        waits[-1] += cache.stats()["blocking_waits"]

    return h.Variant(name, h.loop(cache.next_id, n, sequence), setup, teardown, per=n)


def summaries(timings: h.Timings, label: str, target: float) -> dict[str, Any]:
    return {
        f"{label}: {GUARDED} / {UNGUARDED}": h.ratio_summary(timings, GUARDED, UNGUARDED, target),
        f"{label}: {AA} / {UNGUARDED}": h.ratio_summary(timings, AA, UNGUARDED),
    }


def statements(made: dict[str, tuple[TicketServer, str]]) -> dict[str, str]:
    """The take each kind of server runs now, as compiled (from the backend's statement cache,
    shared by every server of the backend): the guarded one only where the take checks the
    identity itself (PostgreSQL)."""
    taken = {}
    for name, (server, sequence) in made.items():
        known = next(k for k in server._known.values() if k.table.sequence == sequence)
        # TicketBackend.take_block's own test: guards only where the backend has some.
        identity = known.identity
        guarded = identity is not None and bool(server.backend.identity_guards(identity))
        dialect = server.engine.dialect
        key = (dialect.name, dialect.driver, dialect.paramstyle, known.table,
               "take_guarded" if guarded else "take_block")
        taken[name] = server.backend._statements[key].sql
    return taken


def short(rows: dict[str, Any]) -> dict[str, Any]:
    """Chart labels: the denominator (always the unguarded server) is in the panel's title."""
    out = {}
    for key, value in rows.items():
        key = key.replace(f" / {UNGUARDED}", "").replace(AA, "A/A").replace("cache next_id: ", "")
        out[re.sub(r"next_block\((\d+)\)", r"\1 id(s)", key)] = value
    return out


def run_backend(args: Any, backend: str) -> dict[str, Any]:
    calls, ids, primed = SIZES[args.smoke]
    rounds = h.rounds(args, ROUNDS)
    timings: dict[str, h.Timings] = {}
    extra: dict[str, dict[str, list[int]]] = {}
    waits: dict[str, list[int]] = {GUARDED: [], UNGUARDED: [], AA: []}
    with h.throwaway_database(backend) as url:
        h.log(f"[{backend}] {h.redact(url)}")
        plain = servers(url, "bench_block")
        under = servers(url, "bench_cache")
        caches: dict[str, CachedSource] = {}
        try:
            for count in BLOCKS:
                label = f"next_block({count})"
                extra[label] = {name: [] for name in plain}
                chosen = [
                    block_variant(name, server, seq, count, calls, extra[label][name])
                    for name, (server, seq) in plain.items()
                ]
                timings[label] = h.interleave(chosen, rounds, label=f"{backend} {label}: ")
            for name, (server, seq) in under.items():
                caches[name] = cache = CachedSource(server, max_block=MAX_BLOCK)
                h.loop(cache.next_id, primed, seq)()  # teaches the rate, fills the blocks
            chosen = [
                cache_variant(name, cache, *under[name], ids, waits[name])
                for name, cache in caches.items()
            ]
            timings["cache"] = h.interleave(chosen, rounds, label=f"{backend} cache: ")
            cache_stats = {name: c.stats() for name, c in caches.items()}
            for cache in caches.values():
                cache.close()
            server_stats = {
                f"{group} {name}": server.stats()
                for group, made in (("next_block", plain), ("cache", under))
                for name, (server, _) in made.items()
            }
            taken = statements(plain)
            info = h.server_info(backend, url)
        finally:
            for cache in caches.values():
                cache.close()
            for server, _ in [*plain.values(), *under.values()]:
                server.close()
    rewinds = sum(s["rewinds"] for s in server_stats.values())
    assert rewinds == 0, f"{rewinds} rewinds seen on a database nobody rewound"
    block_ratios: dict[str, Any] = {}
    for count in BLOCKS:
        block_ratios.update(
            summaries(timings[f"next_block({count})"], f"next_block({count})", TARGET)
        )
    return {
        "next_block_ratios": block_ratios,
        "cache_ratios": summaries(timings["cache"], "cache next_id", CACHE_TARGET),
        "median_us_per_call": {
            f"next_block({count}) {name}": timings[f"next_block({count})"].median(name) * 1e6
            for count in BLOCKS
            for name in (GUARDED, UNGUARDED)
        },
        "median_ns_per_cached_id": {n: timings["cache"].median(n) * 1e9 for n in caches},
        # The warm-up round's run first; on PostgreSQL always 0 (the take checks itself).
        "extra_round_trips_per_run": extra,
        "blocking_waits_during_timed_runs": {k: sum(v[1:]) for k, v in waits.items()},
        "take_statements": taken,
        "server_stats_at_end": server_stats,
        "cache_stats_at_end": {
            name: {k: v for k, v in s.items() if k != "sequences"}
            for name, s in cache_stats.items()
        },
        "server": info,
        "timings": {group: t.to_json() for group, t in timings.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    env = h.environment()
    results = {backend: run_backend(args, backend) for backend in args.backends}
    checks = {
        f"{backend} {key}": summary
        for backend, result in results.items()
        for group in ("next_block_ratios", "cache_ratios")
        for key, summary in result[group].items()
        if "target" in summary
    }
    title = "Rewind guard: guarded TicketServer vs the guard switched off (A/A: two unguarded)"
    fig, (left, middle, right) = h.figure(3, title, env, width=5.5)
    fig.subplots_adjust(left=0.125, wspace=0.7)
    h.ratio_panel(
        left,
        short(h.flatten(results, "next_block_ratios")),
        f"next_block: time / unguarded's (target <= {TARGET})",
    )
    h.ratio_panel(
        middle,
        short(h.flatten(results, "cache_ratios")),
        f"warm CachedSource.next_id / unguarded's (expected 1, checked <= {CACHE_TARGET})",
    )
    us = short(h.flatten(results, "median_us_per_call"))
    h.value_panel(right, us, "median µs per next_block call", "µs")
    return h.report(
        args,
        NAME,
        env=env,
        parameters={
            "blocks": list(BLOCKS),
            "calls_per_run": SIZES[args.smoke][0],
            "cache_ids_per_run": SIZES[args.smoke][1],
            "cache_primed": SIZES[args.smoke][2],
            "cache_waste_ratio": 1.0,
            "cache_max_block": MAX_BLOCK,
            "identity_interval_guarded": 1.0,
            "rounds": h.rounds(args, ROUNDS),
            "target_next_block": TARGET,
            "expected_cache": 1.0,
            "target_cache": CACHE_TARGET,
            "baseline": "TicketServer after first contact with _known[*].identity = None and "
            f"identity_interval = {NEVER:g}: the pre-guard path",
        },
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
