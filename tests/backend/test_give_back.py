"""Ids given back to real ticket servers: the compare-and-set on a named sequence's row, routing
over several servers, and caches in real processes that exit cleanly (ids issued again) or are
killed (never a duplicate)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

import sqlalchemy_tickets
from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer, TicketServers
from support.processes import WORKERS
from support.proxy import TcpProxy


def _env() -> dict[str, str]:
    """The environment of a script run here: this package importable as the tests import it."""
    src = str(Path(sqlalchemy_tickets.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def test_the_last_block_goes_back_and_comes_out_again(database_url: str) -> None:
    server = TicketServer(database_url)
    try:
        first = server.next_block("photos", 10)
        second = server.next_block("photos", 5)
        assert server.give_back("photos", first) == 0  # not the last block: refused
        assert server.give_back("photos", second) == 5
        assert server.give_back("photos", second) == 0  # not twice
        assert server.give_back("photos", first) == 10  # now it is the last one
        again = server.next_block("photos", 15)
        assert again == range(first.start, second.stop)
        assert server.describe("photos").last_id == second[-1]  # type: ignore[union-attr]
    finally:
        server.close()


def test_a_block_taken_after_by_another_client_makes_it_refuse(database_url: str) -> None:
    mine, theirs = TicketServer(database_url), TicketServer(database_url)
    try:
        held = mine.next_block("photos", 20)
        taken = theirs.next_block("photos", 3)
        assert mine.give_back("photos", held) == 0
        assert mine.give_back("photos", held[10:]) == 0  # a tail of it is not the last either
        after = mine.next_block("photos", 50)
        every = [*held, *taken, *after]
        assert len(set(every)) == len(every)
        # A part that ends the last block goes back alone.
        assert mine.give_back("photos", after[30:]) == 20
        assert mine.next_block("photos", 20) == after[30:]
    finally:
        mine.close()
        theirs.close()


def test_many_sequences_are_taken_in_one_call_each_as_alone(database_url: str) -> None:
    # More sequences than one statement holds (PostgreSQL sends 64 takes to a statement), a
    # sequence asked twice in one call, and one whose stride changed under the server (it
    # goes the long way, alone): each block is what a call of its own would have taken.
    server, other = TicketServer(database_url), TicketServer(database_url)
    try:
        names = [f"take{i:03d}" for i in range(150)]
        server.prepare(names)
        before = {name: server.next_block(name, 1) for name in names}
        for name in names[::5]:  # another client moves these meanwhile
            other.next_block(name, 7)
        requests = [(name, 3, 64) for name in names] + [(names[0], 2, 64), (names[1], 4, 64)]
        blocks = server.next_blocks(requests)
        seen: dict[str, set[int]] = {}
        for (name, count, _), block in zip(requests, blocks, strict=True):
            assert isinstance(block, range) and len(block) == count, (name, block)
            assert block.start > before[name][-1] + (7 if name in names[::5] else 0)
            assert not seen.setdefault(name, set()) & set(block)
            seen[name] |= set(block)
        assert blocks[-2].start == blocks[0].stop and blocks[-1].start == blocks[1].stop
        for name in names:  # each table's row says what was taken, and nothing more
            assert server.describe(name).last_id == max(  # type: ignore[union-attr]
                b[-1] for (n, _, _), b in zip(requests, blocks, strict=True)
                if n == name and isinstance(b, range))
    finally:
        server.close()
        other.close()


def test_many_sequences_go_back_in_one_call_each_latest_block_first(database_url: str) -> None:
    # More sequences than one statement holds (PostgreSQL sends them 64 to a statement), a
    # sequence given back twice in one call (its latest block, then the one before), and
    # blocks that are not the latest any more: each goes back exactly when one call at a time
    # would have taken it, whatever the batching.
    server, other = TicketServer(database_url), TicketServer(database_url)
    try:
        names = [f"many{i:03d}" for i in range(150)]
        server.prepare(names)
        first = {name: server.next_block(name, 10) for name in names}
        second = {name: server.next_block(name, 5) for name in names}
        stolen = names[::7]  # another client took a block of these since
        for name in stolen:
            other.next_block(name, 1)
        items = [(name, second[name], 64) for name in names]
        items += [(name, first[name], 64) for name in names]
        back = server.give_back_many(items)
        for (name, ids, _), taken in zip(items, back, strict=True):
            assert taken == (0 if name in stolen else len(ids)), (name, ids)
        for name in names:
            again = server.next_block(name, 20)
            if name in stolen:
                assert again.start > second[name][-1] + 1
            else:
                assert again == range(first[name].start, first[name].start + 20)
    finally:
        server.close()
        other.close()


def test_flickr_tables_and_wrong_strides_are_refused(database_url: str) -> None:
    server = TicketServer(database_url)
    try:
        server.create(None)
        block = server.next_block(None, 5)
        assert server.give_back(None, block) == 0  # REPLACE INTO clients share the table
        assert server.describe(None).last_id == block[-1]  # type: ignore[union-attr]
        named = server.next_block("photos", 6)
        assert server.give_back("photos", range(named.start, named.stop + 6, 2)) == 0
        assert server.give_back("photos", named[::2]) == 0
        assert server.give_back("photos", range(0)) == 0
        assert server.next_id("photos") == named[-1] + 1
    finally:
        server.close()


def _draw_and_give_back(url: str, seed: int, rounds: int) -> list[int]:
    """In a child: three threads take blocks and give some back at once, some later; the ids
    kept (those the server did not take back)."""
    server = TicketServer(url)
    kept: list[int] = []
    lock = threading.Lock()

    def work(k: int) -> None:
        rng = random.Random(seed * 10 + k)
        mine: list[int] = []
        for _ in range(rounds):
            block = server.next_block("shared", rng.choice([1, 3, 17]))
            if rng.random() < 0.5 and server.give_back("shared", block) == len(block):
                continue
            mine.extend(block)
        with lock:
            kept.extend(mine)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.close()
    return kept


@pytest.mark.slow
def test_giving_back_under_contention_never_duplicates(database_url: str) -> None:
    TicketServer(database_url).create("shared")
    ctx = WORKERS
    with ctx.Pool(4) as pool:
        results = pool.starmap(_draw_and_give_back, [(database_url, s, 150) for s in range(4)])
    kept = [i for chunk in results for i in chunk]
    server = TicketServer(database_url)
    try:
        last = server.describe("shared").last_id  # type: ignore[union-attr]
        assert len(set(kept)) == len(kept)
        assert max(kept) <= last
        # Some went back and came out again: fewer ids burned than blocks given back.
        assert last - len(kept) < 4 * 3 * 150 * 17 // 2
    finally:
        server.close()


def test_servers_route_ids_back_to_the_server_that_issued_them(
    make_database: Any, backend: str
) -> None:
    servers = TicketServers([make_database(backend), make_database(backend)])
    try:
        odd = servers.next_block("photos", 4)
        even = servers.next_block("photos", 4)
        assert {odd.start % 2, even.start % 2} == {0, 1} and odd.step == even.step == 2
        assert servers.give_back("photos", range(odd.start, odd.stop, 1)) == 0  # wrong step
        assert servers.give_back("photos", even) == 4
        assert servers.give_back("photos", odd) == 4
        again = [servers.next_block("photos", 4) for _ in range(2)]
        assert sorted(again, key=lambda r: r.start) == sorted([odd, even], key=lambda r: r.start)
        # Through a cache: closing it gives each server back its own ids.
        cache = CachedSource(servers, min_block=40)
        drawn = [cache.next_id("photos") for _ in range(100)]
        cache.wait_idle(10)
        assert cache.stats()["in_hand"] > 0
        assert cache.close() == 0
        after = sorted(servers.next_id("photos") for _ in range(2))
        # Each server issues again the lowest of its ids that the cache did not hand out.
        expected = []
        for block in sorted(again, key=lambda r: r.start):
            mine = [i for i in drawn if i % 2 == block.start % 2]
            candidates = range(block[-1] + 2, max(mine) + 4, 2)
            expected.append(min(set(candidates) - set(drawn)))
        assert after == sorted(expected)
    finally:
        servers.close()


#: What a child process keeps until it exits, as an application keeps its configured source.
_KEPT: list[CachedSource] = []


def _cache_then_exit(url: str, tiers: int, close: bool, queue: Any) -> None:
    """In a child: draw ids through ``tiers`` nested caches, report the highest and what the
    caches hold, then close them or simply return (the process's exit closes them)."""
    source: Any = TicketServer(url)
    caches = _KEPT
    for _ in range(tiers):
        source = CachedSource(source, min_block=64)
        caches.append(source)
    highest = max(source.next_id("jobs") for _ in range(500))
    for cache in reversed(caches):
        cache.wait_idle(10)
    held = sum(cache.stats()["in_hand"] for cache in caches)
    burned = sum(cache.close() for cache in reversed(caches)) if close else None
    queue.put((highest, held, burned))


def _cache_then_wait(url: str, queue: Any, stop: Any) -> None:
    """In a child: draw ids through a cache, report every one, then wait to be killed."""
    cache = CachedSource(TicketServer(url), min_block=64)
    ids = [cache.next_id("jobs") for _ in range(500)]
    ids += cache.next_block("jobs", 30)
    cache.wait_idle(10)
    queue.put(ids)
    stop.wait(60)


@pytest.mark.parametrize("tiers", [1, 2])
@pytest.mark.parametrize("close", [True, False], ids=["close", "exit"])
def test_a_process_that_exits_cleanly_burns_nothing(
    database_url: str, tiers: int, close: bool
) -> None:
    ctx = WORKERS
    queue = ctx.Queue()
    child = ctx.Process(target=_cache_then_exit, args=(database_url, tiers, close, queue))
    child.start()
    highest, held, burned = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert held > 0
    assert burned in (0, None)
    server = TicketServer(database_url)
    try:
        # Everything the child held was its server's last block: it comes out again.
        assert server.next_id("jobs") == highest + 1
    finally:
        server.close()


def test_a_killed_process_burns_what_it_held_and_never_causes_a_duplicate(
    database_url: str,
) -> None:
    ctx = WORKERS
    queue, stop = ctx.Queue(), ctx.Event()
    child = ctx.Process(target=_cache_then_wait, args=(database_url, queue, stop))
    child.start()
    theirs = queue.get(timeout=120)
    os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    with CachedSource(TicketServer(database_url)) as cache:
        ours = [cache.next_id("jobs") for _ in range(2_000)]
    every = theirs + ours
    assert len(set(every)) == len(every)
    assert min(ours) > max(theirs)


def test_interpreter_exit_gives_back_what_caches_hold(database_url: str, tmp_path: Path) -> None:
    """A script that never calls close(): the exit hook gives its ids back (nested caches in
    the order that lets every tier's ids go back)."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import json
        from sqlalchemy_tickets import CachedSource, TicketServer, configure

        inner = CachedSource(TicketServer({database_url!r}), min_block=100)
        # The outer cache is made last: an exit hook that closed caches in the order they
        # were made would close the inner one first.
        outer = CachedSource(inner, min_block=20)
        highest = max(outer.next_id("jobs") for _ in range(300))
        inner.wait_idle(10)
        outer.wait_idle(10)
        held = outer.stats()["in_hand"] + inner.stats()["in_hand"]
        print(json.dumps({{"highest": highest, "held": held}}))
    """))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["held"] > 0
    server = TicketServer(database_url)
    try:
        assert server.next_id("jobs") == report["highest"] + 1
    finally:
        server.close()


@pytest.mark.parametrize("backend", ["postgresql", "mysql"])
@pytest.mark.parametrize("fault", ["hang", "refuse"])
def test_an_exit_while_the_server_is_down_does_not_hang(
    database_url: str, fault: str, tmp_path: Path
) -> None:
    """Refills keep retrying a server that is down; the process still exits at once (refill
    threads used to be joined before the exit hooks ran: an exit waited for ever)."""
    target = make_url(database_url)
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        url = proxy.url(database_url)
        script = tmp_path / "job.py"
        script.write_text(textwrap.dedent(f"""
            import sys
            from sqlalchemy_tickets import CachedSource, TicketServer, TicketServerUnavailable

            cache = CachedSource(TicketServer({url!r}, timeout=0.5), timeout=0.5, backoff=0.05)
            for _ in range(100):
                cache.next_id("jobs")
            print("ready", flush=True)
            sys.stdin.readline()  # the server goes down now
            try:
                while True:
                    cache.next_id("jobs")
            except TicketServerUnavailable:
                print("unavailable", flush=True)
        """))
        child = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=_env(),
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "ready"
            getattr(proxy, fault)()
            started = time.monotonic()
            out, err = child.communicate("go\n", timeout=60)
            took = time.monotonic() - started
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 0, err
        assert out.strip() == "unavailable"
        assert took < 15, f"exit took {took:.1f} s"


class _Recording:
    """A source in front of another that records the ids it passed on (a test's window on what
    a cache took)."""

    def __init__(self, source: Any) -> None:
        self.source = source
        self.taken: list[int] = []

    def next_id(self, sequence: str | None = None, *, bits: int = 64) -> int:
        return self.next_block(sequence, 1, bits=bits).start

    def next_block(self, sequence: str | None, count: int, *, bits: int = 64) -> range:
        block: range = self.source.next_block(sequence, count, bits=bits)
        self.taken.extend(block)
        return block

    def give_back(self, sequence: str | None, ids: range, *, bits: int = 64) -> int:
        return int(self.source.give_back(sequence, ids, bits=bits))


def _worker_over_a_tier(dc_url: str, global_url: str, seed: int, queue: Any) -> None:
    """In a child: a worker of a datacenter, ``CachedSource(DatacenterTier(...))`` as in every
    process there; draws, closes cleanly, reports its ids, those its cache held, and what its
    close burned."""
    tier = DatacenterTier(dc_url, TicketServer(global_url), min_block=200)
    recording = _Recording(tier)
    cache = CachedSource(recording, min_block=32)
    rng = random.Random(seed)
    ids: list[int] = []
    for _ in range(300):
        if rng.random() < 0.2:
            ids.extend(cache.next_block("orders", rng.choice([2, 9, 40])))
        else:
            ids.append(cache.next_id("orders"))
    cache.wait_idle(10)
    held = sorted(set(recording.taken) - set(ids))
    queue.put((ids, held, cache.close()))
    tier.close()


@pytest.mark.slow
def test_a_rolling_restart_over_a_datacenter_tier_burns_nothing(
    backend: str, make_database: Any
) -> None:
    """Two rounds of three workers at once sharing one tier, each closing cleanly: 0 burned,
    the ids the first round held come out again in the second, and no id twice."""
    dc_url, global_url = make_database(backend), make_database(backend)
    ctx = WORKERS
    queue = ctx.Queue()
    rounds: list[list[int]] = []
    held: list[list[int]] = []
    for r in range(2):
        children = [
            ctx.Process(target=_worker_over_a_tier, args=(dc_url, global_url, r * 10 + k, queue))
            for k in range(3)
        ]
        for child in children:
            child.start()
        reports = [queue.get(timeout=180) for _ in children]
        for child in children:
            child.join(60)
            assert child.exitcode == 0
        assert [burned for _, _, burned in reports] == [0, 0, 0]
        rounds.append([i for ids, _, _ in reports for i in ids])
        held.append([i for _, kept, _ in reports for i in kept])
    assert held[0]
    every = rounds[0] + rounds[1]
    assert len(set(every)) == len(every)
    # What the first round's workers held at their close went back to the tier, which issues
    # ids given back before ids it never issued: the second round, which drew more than that,
    # got every one of them again (as ids it used, or held at its own close).
    assert len(rounds[1]) > len(set(held[0]))
    assert set(held[0]) <= set(every) | set(held[1])


def test_interpreter_exit_gives_back_to_a_datacenter_tier(
    backend: str, make_database: Any, tmp_path: Path
) -> None:
    """``configure(CachedSource(DatacenterTier(...)))`` and a plain exit: the ids the cache held
    are in the tier's stock again, and the next process gets them first."""
    dc_url, global_url = make_database(backend), make_database(backend)
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(f"""
        import json
        from sqlalchemy_tickets import CachedSource, DatacenterTier, TicketServer, configure

        cache = CachedSource(
            DatacenterTier({dc_url!r}, TicketServer({global_url!r}), min_block=500),
            min_block=50,
        )
        configure(cache)
        highest = max(cache.next_id("jobs") for _ in range(400))
        cache.wait_idle(10)
        print(json.dumps({{"highest": highest, "held": cache.stats()["in_hand"]}}))
    """))
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=_env()
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    held = report["held"]
    assert held > 0
    upstream = TicketServer(global_url)
    try:
        with DatacenterTier(dc_url, upstream, min_block=500) as tier:
            drawn: list[int] = []
            while len(drawn) < held:
                drawn.extend(tier.next_block("jobs", held - len(drawn)))
    finally:
        upstream.close()
    assert sorted(drawn) == list(range(report["highest"] + 1, report["highest"] + 1 + held))
