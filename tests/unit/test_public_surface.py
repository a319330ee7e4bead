"""One release verb, one meaning per name: ``close()`` (``dispose()`` a deprecated alias),
``stats()`` counters on every source, ``time_ns`` for the generators' time (``clock`` a
deprecated alias), generators shared per configuration without growing without bound, and a
source ``configure()`` built from a URL closed when it is replaced."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest

from sqlalchemy_tickets import SnowflakeId, TicketServer, TicketServers, configure
from sqlalchemy_tickets.generators import (
    ObjectIdGenerator,
    PrefixedIdGenerator,
    SnowflakeGenerator,
    UUID7Generator,
    _registry,
)
from sqlalchemy_tickets.sources.cache import CachedSource, open_caches
from sqlalchemy_tickets.sources.default import configured_source
from sqlalchemy_tickets.sources.lease import WorkerLease

START_NS = 1_700_000_000_000 * 1_000_000


def _url(tmp_path: Path, name: str) -> str:
    return f"sqlite:///{tmp_path / name}"


def test_dispose_is_a_deprecated_alias_of_close(tmp_path: Path) -> None:
    server = TicketServer(_url(tmp_path, "a.db"))
    servers = TicketServers([_url(tmp_path, "b.db"), _url(tmp_path, "c.db")])
    lease = WorkerLease(_url(tmp_path, "lease.db"))
    try:
        server.next_id("photos")
        lease.acquire(4)
        for closable in (server, servers, lease):
            with pytest.warns(DeprecationWarning, match=r"dispose\(\) is deprecated; use close"):
                closable.dispose()  # type: ignore[attr-defined]
        assert lease._own is None
        # Closed means its connections are gone, not that it is unusable: a later call reopens.
        assert server.next_id("photos") == 2
    finally:
        server.close()
        servers.close()
        lease.close()


def test_stats_are_counters_on_every_source_and_status_is_health(tmp_path: Path) -> None:
    servers = TicketServers([_url(tmp_path, "b.db"), _url(tmp_path, "c.db")])
    try:
        ids = [servers.next_id("photos") for _ in range(5)] + list(servers.next_block("photos", 3))
        assert len(set(ids)) == 8
        stats = servers.stats()
        members = [s.stats() for s in servers.servers]
        assert stats["issued"] == 8 and [m["issued"] for m in members] == [3, 5]  # round robin
        # First contact also creates and checks each table: more round trips than calls.
        assert stats["round_trips"] == sum(m["round_trips"] for m in members) >= 6
        assert [entry["up"] for entry in servers.status()] == [True, True]
    finally:
        servers.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: SnowflakeGenerator(1, **kw),
        lambda **kw: UUID7Generator(**kw),
        lambda **kw: PrefixedIdGenerator("post", **kw),
        lambda **kw: ObjectIdGenerator(**kw),
    ],
    ids=["snowflake", "uuid7", "prefixed", "objectid"],
)
def test_generators_read_time_ns_and_take_clock_as_a_deprecated_alias(
    make: Callable[..., object],
) -> None:
    def fixed() -> int:
        return START_NS

    assert make(time_ns=fixed).time_ns is fixed  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=r"clock=\.\.\.\) is deprecated; use time_ns="):
        generator = make(clock=fixed)
    assert generator.time_ns is fixed  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="not both"):
        make(clock=fixed, time_ns=fixed)


def test_snowflake_column_takes_time_ns_and_the_deprecated_clock() -> None:
    def fixed() -> int:
        return START_NS

    column = SnowflakeId(worker_id=9, time_ns=fixed)
    assert column.generator is not None and column.generator.time_ns is fixed
    with pytest.warns(DeprecationWarning, match="SnowflakeId"):
        old = SnowflakeId(worker_id=9, clock=fixed)
    assert old.generator is column.generator  # one configuration, one generator


def test_generators_are_shared_per_configuration_without_growing() -> None:
    first, second = SnowflakeId(worker_id=7), SnowflakeId(worker_id=7)
    assert first.generator is second.generator
    gc.collect()
    before = len(_registry.snowflakes)
    columns = [SnowflakeId(worker_id=7, time_ns=lambda: START_NS) for _ in range(50)]
    assert len(_registry.snowflakes) == before + 50
    del columns
    gc.collect()
    # Injected time sources are test instruments: their generators go with their columns...
    assert len(_registry.snowflakes) == before
    # ...while a real configuration keeps its generator, so a new column never restarts a
    # worker's sequence within a millisecond it already issued in.
    generator = first.generator
    del first, second
    gc.collect()
    assert SnowflakeId(worker_id=7).generator is generator


def test_configure_closes_the_source_it_built_from_a_url(tmp_path: Path) -> None:
    configure(_url(tmp_path, "tickets.db"))
    try:
        built = configured_source()
        assert isinstance(built, CachedSource)
        built.next_id("photos")
        configure(built)  # the same source again: kept open
        assert built in open_caches()[0]
    finally:
        configure(None)
    assert built not in open_caches()[0]
    assert built.stats()["in_hand"] == 0


def test_configure_leaves_a_source_it_was_given_open(tmp_path: Path) -> None:
    mine = CachedSource(TicketServer(_url(tmp_path, "tickets.db")))
    try:
        configure(mine)
        configure(None)
        assert mine in open_caches()[0]
        assert mine.next_id("photos") >= 1
    finally:
        mine.close()
        mine.source.close()  # type: ignore[attr-defined]
