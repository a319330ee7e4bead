"""ZooKeeperSource on a real 3-server ensemble: the source protocol, exhaustion, names, many
processes at once, URLs, the tiers above it, and what a user without kazoo sees."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

from sqlalchemy_tickets import (
    CachedSource,
    DatacenterTier,
    ExhaustedError,
    TicketsError,
    UnknownSequenceError,
    ZooKeeperSource,
    configure,
)
from sqlalchemy_tickets.sources.base import GivesBack, KeepsAbove, Prepares, TicketSource
from sqlalchemy_tickets.sources.default import configured_source
from support.processes import WORKERS, run_processes
from support.proxy import TcpProxy
from support.zookeeper import Ensemble, synced_reader

MAX64 = 2**63 - 1
MAX32 = 2**31 - 1


@pytest.fixture
def source(zookeeper: Ensemble, zk_path: str) -> Iterator[ZooKeeperSource]:
    made = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    yield made
    made.close()


@pytest.fixture
def observer(zookeeper: Ensemble) -> Iterator[KazooClient]:
    """A plain kazoo client: what the ensemble holds, read beside the source under test."""
    client = synced_reader(zookeeper.hosts)
    yield client
    client.stop()
    client.close()


def _mark(observer: KazooClient, path: str) -> int:
    # A follower may answer a read before it applied the latest writes: synced first.
    observer.sync(path)
    data, _ = observer.get(path)
    return int(json.loads(data)["last"])


def test_blocks_are_exact_increasing_and_written_before_they_are_returned(
    source: ZooKeeperSource, observer: KazooClient, zk_path: str
) -> None:
    assert isinstance(source, TicketSource) and isinstance(source, KeepsAbove)
    assert isinstance(source, Prepares)
    first = source.next_block("Photos", 10)
    assert first == range(1, 11)
    assert source.next_id("photos") == 11
    assert source.next_block("PHOTOS", 5) == range(12, 17)
    # The mark in the ensemble covers every id returned.
    assert _mark(observer, f"{zk_path}/photos-64") == 16
    stats = source.stats()
    assert stats["issued"] == 16 and stats["rewinds"] == 0
    assert stats["round_trips"] >= 6  # a read and a write per block, at least


def test_32_and_64_bit_sequences_of_one_name_are_separate_id_spaces(
    source: ZooKeeperSource, observer: KazooClient, zk_path: str
) -> None:
    assert source.next_block("users", 3, bits=64) == range(1, 4)
    assert source.next_block("users", 2, bits=32) == range(1, 3)
    assert source.next_id(None) == 1  # Flickr-style default sequence: a node of its own
    assert source.next_id(None, bits=32) == 1
    assert sorted(observer.get_children(zk_path)) == [
        "Tickets32", "Tickets64", "users-32", "users-64"]
    assert source.sequences() == [(None, 32), (None, 64), ("users", 32), ("users", 64)]


@pytest.mark.parametrize("bad", ["", "1abc", "a-b", "x" * 41, "a b", "ok;drop"])
def test_invalid_names_bits_and_counts_are_refused_before_any_write(
    source: ZooKeeperSource, observer: KazooClient, zk_path: str, bad: str
) -> None:
    with pytest.raises(TicketsError, match="invalid sequence name"):
        source.next_block(bad, 1)
    with pytest.raises(TicketsError, match="bits must be 32 or 64"):
        source.next_block("ok", 1, bits=16)
    for count in (0, -1, 1.5, True):
        with pytest.raises(TicketsError, match="count must be a positive integer"):
            source.next_block("ok", count)  # type: ignore[arg-type]
    assert not observer.exists(zk_path)


def test_exhaustion_comes_before_any_id_past_the_bit_width(
    source: ZooKeeperSource, observer: KazooClient, zk_path: str
) -> None:
    assert source.create("small", bits=32, start=MAX32 - 9)
    with pytest.raises(ExhaustedError) as raised:
        source.next_block("small", 11, bits=32)
    assert raised.value.remaining == 10
    assert _mark(observer, f"{zk_path}/small-32") == MAX32 - 10  # nothing written
    assert source.next_block("small", 10, bits=32) == range(MAX32 - 9, MAX32 + 1)
    with pytest.raises(ExhaustedError) as raised:
        source.next_id("small", bits=32)
    assert raised.value.remaining == 0
    with pytest.raises(ExhaustedError):
        source.next_block("big", MAX64 + 1)
    assert source.create("big", start=MAX64)
    assert source.next_id("big") == MAX64
    with pytest.raises(ExhaustedError):
        source.next_id("big")


def test_create_missing_false_and_an_existing_sequence(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    strict = ZooKeeperSource(zookeeper.hosts, path=zk_path, create_missing=False)
    try:
        with pytest.raises(UnknownSequenceError, match="sqlalchemy-tickets init"):
            strict.next_id("orders")
        assert not observer.exists(f"{zk_path}/orders-64")
        assert strict.create("orders", start=500) is True
        assert strict.create("Orders", start=7) is False  # left as it is
        assert strict.next_id("orders") == 500
    finally:
        strict.close()


def test_a_node_that_is_not_ours_is_refused(
    source: ZooKeeperSource, observer: KazooClient, zk_path: str
) -> None:
    observer.create(f"{zk_path}/foreign-64", b"hello", makepath=True)
    with pytest.raises(TicketsError, match="does not hold a sqlalchemy-tickets mark"):
        source.next_id("foreign")
    assert observer.get(f"{zk_path}/foreign-64")[0] == b"hello"


def test_ensure_above_moves_a_sequence_below_ids_in_use_once(
    source: ZooKeeperSource, caplog: pytest.LogCaptureFixture
) -> None:
    source.next_block("moved", 10)
    with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
        assert source.ensure_above("moved", 5) is False
        assert source.ensure_above("moved", 5_000) is True
        assert source.ensure_above("moved", 5_000) is False
    assert source.next_id("moved") == 5_000 + 1_000_000 + 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "went back in time" in warnings[0].getMessage()
    assert source.stats()["rewinds"] == 1


def test_ensure_above_refused_under_on_rewind_refuse(
    zookeeper: Ensemble, zk_path: str
) -> None:
    strict = ZooKeeperSource(zookeeper.hosts, path=zk_path, on_rewind="refuse")
    try:
        strict.next_id("r")
        with pytest.raises(TicketsError, match=r"sqlalchemy-tickets sync --url zookeeper://"):
            strict.ensure_above("r", 100)
    finally:
        strict.close()


def test_prepare_creates_many_nodes(source: ZooKeeperSource, observer: KazooClient,
                                    zk_path: str) -> None:
    source.prepare([f"s{i}" for i in range(20)], bits=32)
    assert len(observer.get_children(zk_path)) == 20
    blocks = source.next_blocks([("s1", 3, 32), ("bad name", 1, 64), ("s2", 2, 32)])
    assert blocks[0] == range(1, 4) and blocks[2] == range(1, 3)
    assert isinstance(blocks[1], TicketsError)


def test_give_back_takes_the_end_of_the_latest_block_while_nobody_wrote_since(
    source: ZooKeeperSource, zookeeper: Ensemble, zk_path: str
) -> None:
    assert isinstance(source, GivesBack)
    source.next_block("gb", 10)
    assert source.next_block("gb", 10) == range(11, 21)
    assert source.give_back("gb", range(5, 8)) == 0  # not the end of the latest block
    assert source.give_back("gb", range(16, 21)) == 5
    assert source.next_block("gb", 3) == range(16, 19)  # issued again, not a rewind
    other = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    try:
        assert other.next_block("gb", 2) == range(19, 21)
        assert source.give_back("gb", range(16, 19)) == 0  # written since by another client
    finally:
        other.close()
    assert source.stats()["rewinds"] == 0
    # A cache over it closes without burning: what it holds ends with its latest block.
    cache = CachedSource(source)
    cache.next_id("gb")
    assert cache.close() == 0


def test_next_blocks_pipelined_by_racing_threads(source: ZooKeeperSource) -> None:
    import threading

    names = [f"p{i}" for i in range(6)]
    found: list[list[range | TicketsError]] = []

    def batches() -> None:
        for _ in range(15):
            found.append(source.next_blocks([(name, 4, 64) for name in names]))

    threads = [threading.Thread(target=batches) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(found) == 45
    for k, name in enumerate(names):
        blocks = [batch[k] for batch in found]
        assert all(isinstance(b, range) and len(b) == 4 for b in blocks), name
        ids = sorted(i for b in blocks for i in b)  # type: ignore[union-attr]
        assert ids == list(range(1, 45 * 4 + 1)), name


def _draw(hosts: str, path: str, blocks: int, barrier: Any) -> list[tuple[int, int]]:
    source = ZooKeeperSource(hosts, path=path, timeout=30)
    try:
        barrier.wait(60)
        got = []
        for i in range(blocks):
            block = source.next_block("shared", 1 + i % 7)
            got.append((block.start, block.stop))
        return got
    finally:
        source.close()


def test_processes_racing_on_one_sequence_never_share_an_id(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    processes, blocks = 6, 40
    barrier = WORKERS.Barrier(processes)
    results = run_processes(
        _draw, [(zookeeper.hosts, zk_path, blocks, barrier)] * processes, timeout=240
    )
    ids = [i for found in results for start, stop in found for i in range(start, stop)]
    assert len(ids) == len(set(ids))
    # No lost write either: every id up to the mark was issued, once.
    assert sorted(ids) == list(range(1, _mark(observer, f"{zk_path}/shared-64") + 1))


def test_a_forked_child_opens_its_own_session(source: ZooKeeperSource) -> None:
    import os

    source.next_id("forked")
    parent_session = source.session_id
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            block = source.next_block("forked", 3)
            os.write(write, json.dumps([block.start, source.session_id]).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as stream:
        start, child_session = json.loads(stream.read())
    assert start == 2 and child_session not in (None, parent_session)
    # The parent's session is untouched: it goes on with its own next block.
    assert source.session_id == parent_session
    assert source.next_id("forked") == 5


def test_configure_takes_a_zookeeper_url(zookeeper: Ensemble, zk_path: str) -> None:
    configure(zookeeper.url(zk_path + "?timeout=5"))
    try:
        cache = configured_source()
        assert isinstance(cache, CachedSource)
        inner = cache.source
        assert isinstance(inner, ZooKeeperSource)
        assert inner.path == zk_path and inner.timeout == 5.0
        ids = [cache.next_id("configured") for _ in range(50)]
        assert ids == sorted(set(ids))
    finally:
        configure(None)
    assert inner._client is None  # the source configure() built is closed with the cache


def test_bad_zookeeper_urls_are_refused_without_io() -> None:
    for bad in ("zookeeper://", "zookeeper://h:99999/x", "zookeeper://h:1/x?nope=1",
                "zookeeper://h:1/zookeeper"):
        with pytest.raises(TicketsError, match="invalid ZooKeeper URL"):
            configure(bad)
    assert configured_source() is None


def test_under_a_datacenter_tier_and_a_cache(
    zookeeper: Ensemble, zk_path: str, make_database: Any
) -> None:
    upstream = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    try:
        with DatacenterTier(make_database("sqlite"), upstream, supply=0.001,
                            min_block=100) as tier:
            cache = CachedSource(tier)
            try:
                ids = [cache.next_id("layered") for _ in range(1_000)]
            finally:
                cache.close()
        assert len(set(ids)) == 1_000 and ids == sorted(ids)
        assert upstream.stats()["issued"] >= 1_000
    finally:
        upstream.close()


def test_the_event_loop_keeps_running_while_the_ensemble_does_not_answer(
    zookeeper: Ensemble, zk_path: str
) -> None:
    import asyncio

    with TcpProxy("127.0.0.1", zookeeper.members[0].client_port).start() as proxy:
        source = ZooKeeperSource(f"127.0.0.1:{proxy.port}", path=zk_path, timeout=5.0)
        cache = CachedSource(source, timeout=8.0, backoff=0.05)
        try:
            source.next_id("async")  # connected
            proxy.hang()

            async def main() -> tuple[int, int]:
                ticks = 0
                done = asyncio.Event()

                async def heartbeat() -> None:
                    nonlocal ticks
                    while not done.is_set():
                        ticks += 1
                        await asyncio.sleep(0.01)

                beat = asyncio.create_task(heartbeat())
                asyncio.get_running_loop().call_later(1.5, proxy.forward)
                new = await cache.next_id_async("async")
                done.set()
                await beat
                return new, ticks

            new, ticks = asyncio.run(main())
            assert new > 1
            assert ticks > 50  # the loop ran all along the wait for the ensemble
        finally:
            cache.close()
            source.close()


def test_without_kazoo_the_error_names_the_extra() -> None:
    code = textwrap.dedent("""
        import sys
        sys.modules["kazoo"] = None  # as if not installed
        import sqlalchemy_tickets
        from sqlalchemy_tickets import DriverNotInstalledError
        try:
            sqlalchemy_tickets.ZooKeeperSource("127.0.0.1:2181")
        except DriverNotInstalledError as error:
            print(error)
        try:
            sqlalchemy_tickets.configure("zookeeper://127.0.0.1:2181/x")
        except DriverNotInstalledError as error:
            print(error)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    assert all("pip install sqlalchemy-tickets[zookeeper]" in line for line in lines)
