"""The end of the id space: a 32-bit odd/even pair run dry through servers and caches, and counts
larger than any id space (CONTRACT §3)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from sqlalchemy_tickets import (
    CachedSource,
    ExhaustedError,
    TicketServer,
    TicketServers,
)
from sqlalchemy_tickets.sources.base import TicketSource

LIMIT = 2**31 - 1


def _pair(make_database: Callable[[str], str], backend: str, odd: int, even: int) -> list[str]:
    """Two ticket databases for sequence ``edge`` (32 bits, increment 2), with ``odd`` ids left
    on the first (offset 1) and ``even`` on the second (offset 2)."""
    urls = [make_database(backend), make_database(backend)]
    for url, offset, left in ((urls[0], 1, odd), (urls[1], 2, even)):
        last = LIMIT if offset == 1 else LIMIT - 1
        server = TicketServer(url)
        server.create("edge", bits=32, start=last - 2 * (left - 1), increment=2, offset=offset)
        server.close()
    return urls


def _expected(odd: int, even: int) -> set[int]:
    return {LIMIT - 2 * k for k in range(odd)} | {LIMIT - 1 - 2 * k for k in range(even)}


def _drain_ids(source: TicketSource) -> list[int]:
    ids: list[int] = []
    with pytest.raises(ExhaustedError):
        for _ in range(100):
            ids.append(source.next_id("edge", bits=32))
    return ids


def _drain_blocks(source: TicketSource) -> list[int]:
    """Blocks of 3; a source that has fewer left says how many (``remaining``): ask for those."""
    ids: list[int] = []
    count = 3
    for _ in range(100):
        try:
            ids.extend(source.next_block("edge", count, bits=32))
        except ExhaustedError as error:
            if not error.remaining:
                return ids
            assert error.remaining < count
            count = error.remaining
    raise AssertionError("never exhausted")


SHAPES: dict[str, Callable[[TicketServers], TicketSource]] = {
    "servers": lambda s: s,
    "cache": lambda s: CachedSource(s, timeout=5.0),
    "two-tiers": lambda s: CachedSource(CachedSource(s, timeout=5.0), timeout=5.0),
}


@pytest.fixture(params=[(5, 5), (2, 5), (5, 2)], ids=["5-5", "2-5", "5-2"])
def left(request: pytest.FixtureRequest) -> tuple[int, int]:
    value: tuple[int, int] = request.param
    return value


@pytest.fixture(params=list(SHAPES))
def shape(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def pair_source(
    make_database: Callable[[str], str], backend: str, left: tuple[int, int], shape: str
) -> Iterator[TicketSource]:
    servers = TicketServers(_pair(make_database, backend, *left), backoff=0.01)
    source = SHAPES[shape](servers)
    yield source
    if isinstance(source, CachedSource):
        source.close()
    servers.close()


@pytest.mark.parametrize("draw", [_drain_ids, _drain_blocks], ids=["next_id", "next_block"])
def test_every_id_of_a_32_bit_pair_exactly_once_then_only_errors(
    pair_source: TicketSource, left: tuple[int, int], draw: Callable[[TicketSource], list[int]]
) -> None:
    ids = draw(pair_source)
    assert len(ids) == len(set(ids))
    assert set(ids) == _expected(*left)
    assert all(i <= LIMIT for i in ids)
    for _ in range(3):  # nothing after the error
        with pytest.raises(ExhaustedError):
            pair_source.next_id("edge", bits=32)
        with pytest.raises(ExhaustedError):
            pair_source.next_block("edge", 1, bits=32)


@pytest.mark.parametrize("bits", [32, 64])
@pytest.mark.parametrize("count", [2**31, 2**63 - 1, 2**63, 2**64 + 5, 10**30])
def test_counts_beyond_the_id_space_are_exhausted_before_any_sql(
    make_database: Callable[[str], str], backend: str, bits: int, count: int
) -> None:
    if bits == 64 and count < 2**63:
        count = 2**63  # the 2**31 cases only overflow 32 bits
    url = make_database(backend)
    server = TicketServer(url)
    pair = TicketServers([url], backoff=0.01)
    cache = CachedSource(TicketServer(url))
    try:
        for source in (server, pair, cache):
            with pytest.raises(ExhaustedError, match="bit"):
                source.next_block("huge", count, bits=bits)
        # Nothing was written: not even the table (created on first use).
        assert server.stats()["round_trips"] == 0
        with pytest.raises(Exception, match="no ticket table"):
            server.describe("huge", bits=bits)
        # The sequence works afterwards (count - 1 with 2**63 - 1 ids... is exhausted too: only
        # reachable counts issue).
        assert server.next_id("huge", bits=bits) == 1
    finally:
        cache.close()
        server.close()
        pair.close()


def test_a_count_the_server_could_not_step_is_exhausted(
    make_database: Callable[[str], str], backend: str
) -> None:
    """Just under the id space, but times the stride it passes it: no overflow reaches SQL."""
    url = make_database(backend)
    server = TicketServer(url)
    server.create("wide", increment=2, offset=1)
    try:
        with pytest.raises(ExhaustedError, match="left"):
            server.next_block("wide", 2**62 + 1)
        assert server.next_id("wide") == 1
    finally:
        server.close()
