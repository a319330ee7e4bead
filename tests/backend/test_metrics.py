"""Metrics read back through OpenTelemetry's SDK and through a real Prometheus scrape."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from sqlalchemy_tickets import CachedSource, TicketServer
from sqlalchemy_tickets.metrics import INSTRUMENTS, PrometheusCollector, enable, figures
from support.proxy import TcpProxy

# Figure in stats() behind each instrument of the contract.
STATS_KEY = {
    "tickets.ids.issued": "issued",
    "tickets.ids.burned": "burned",
    "tickets.cache.in_hand": "in_hand",
    "tickets.cache.blocking_waits": "blocking_waits",
    "tickets.source.round_trips": "round_trips",
    "tickets.cache.refill_failures": "failures",
    "tickets.ids.given_back": "given_back",
}


def _name() -> str:
    """A sequence no other test of this process uses: metrics sum every cache it has."""
    return "m" + secrets.token_hex(6)


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    assert enable(provider)
    yield reader
    provider.shutdown()


@pytest.fixture
def server(tmp_path) -> Iterator[TicketServer]:
    server = TicketServer(f"sqlite:///{tmp_path / 'tickets.db'}")
    yield server
    server.close()


def read_back(reader: InMemoryMetricReader) -> dict[str, dict[tuple[str, int], float]]:
    """Every data point collected now: instrument name → (sequence, bits) → value."""
    data = reader.get_metrics_data()
    assert data is not None
    values: dict[str, dict[tuple[str, int], float]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "sqlalchemy_tickets"
            for metric in scope.metrics:
                points = values.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    attrs = point.attributes or {}
                    points[str(attrs["sequence"]), int(attrs["bits"])] = point.value
    return values


def test_each_instrument_reads_back_what_stats_says(reader, server) -> None:
    photos, accounts = _name(), _name()
    # The rate a cache reports is the estimate a sample taken at the moment of reading would
    # make (a quiet lane's decays as time passes): two reads compare equal only at one moment
    # of the cache's clock, which is stopped once the ids are drawn.
    stopped: list[float] = []
    cache = CachedSource(server, min_block=50,
                         clock=lambda: stopped[0] if stopped else time.monotonic())
    try:
        ids = [cache.next_id(photos) for _ in range(120)]
        while len(ids) < 150:  # a cache may hand out fewer than asked: ask again
            ids += list(cache.next_block(photos, 150 - len(ids)))
        small = [cache.next_id(accounts, bits=32) for _ in range(7)]
        assert len(set(ids)) == 150 and len(small) == 7
        assert cache.wait_idle(10)
        stopped.append(time.monotonic())
        values = read_back(reader)
        stats = cache.stats()["sequences"]
        for instrument, key in STATS_KEY.items():
            for sequence, bits in ((photos, 64), (accounts, 32)):
                expected = stats[f"{sequence}/{bits}"][key]
                assert values[instrument][sequence, bits] == expected, instrument
        assert values["tickets.ids.issued"][photos, 64] == 150
        assert values["tickets.ids.issued"][accounts, 32] == 7
        # The first call of each sequence found the cache empty.
        assert values["tickets.cache.blocking_waits"][photos, 64] >= 1
        assert values["tickets.cache.in_hand"][photos, 64] > 0
        assert values["tickets.source.round_trips"][accounts, 32] >= 1
        used = values["tickets.ids.space_used"][accounts, 32]
        assert used == pytest.approx(stats[f"{accounts}/32"]["last_issued"] / (2**31 - 1))
        assert 0 < used < 1e-6
        assert values["tickets.cache.rate"][photos, 64] == stats[f"{photos}/64"]["rate"]
        assert {i.name for i in INSTRUMENTS} <= set(values)
    finally:
        cache.close()


def test_a_rewind_is_counted_under_its_sequence(reader, server) -> None:
    """A table behind ids already in use (told by ensure_above, as the flush does with a
    table's largest key) is healed: one rewind, counted for that sequence and no other."""
    photos, other = _name(), _name()
    cache = CachedSource(server, min_block=10)
    try:
        first = cache.next_id(photos)
        cache.next_id(other)
        assert cache.ensure_above(photos, first + 5_000)
        assert cache.next_id(photos) > first + 5_000
        values = read_back(reader)
        assert values["tickets.rewinds"][photos, 64] == 1
        assert values["tickets.rewinds"][other, 64] == 0
        assert cache.stats()["rewinds"] == server.stats()["rewinds"] == 1
    finally:
        cache.close()


def _cache_holding_ids(server: TicketServer) -> tuple[str, CachedSource, int]:
    """A cache of a fresh sequence that issued 10 ids and holds more: (sequence, cache, held)."""
    sequence = _name()
    cache = CachedSource(server, min_block=100)
    for _ in range(10):
        cache.next_id(sequence)
    assert cache.wait_idle(10)
    held = cache.stats()["in_hand"]
    assert held > 0
    return sequence, cache, held


def test_counters_of_a_closed_cache_are_kept_and_burned_ids_show(reader, server) -> None:
    sequence, cache, held = _cache_holding_ids(server)
    before = read_back(reader)
    assert before["tickets.ids.burned"][sequence, 64] == 0
    # Another client takes a block after the cache's: the server cannot take them back.
    server.next_id(sequence)
    burned = cache.close()
    assert burned == held
    after = read_back(reader)
    assert after["tickets.ids.burned"][sequence, 64] == burned
    assert after["tickets.ids.issued"][sequence, 64] == 10  # counters never go back
    assert after["tickets.source.round_trips"][sequence, 64] == before[
        "tickets.source.round_trips"][sequence, 64]
    assert after["tickets.cache.in_hand"][sequence, 64] == 0


def test_ids_given_back_on_closing_show_and_are_not_burned(reader, server) -> None:
    sequence, cache, held = _cache_holding_ids(server)
    assert cache.close() == 0  # its blocks were the server's last: taken back
    after = read_back(reader)
    assert after["tickets.ids.given_back"][sequence, 64] == held
    assert after["tickets.ids.burned"][sequence, 64] == 0


def test_two_caches_of_one_sequence_are_summed(reader, server) -> None:
    sequence = _name()
    first, second = CachedSource(server), CachedSource(server)
    try:
        a = [first.next_id(sequence) for _ in range(5)]
        b = [second.next_id(sequence) for _ in range(8)]
        assert not set(a) & set(b)
        values = read_back(reader)
        assert values["tickets.ids.issued"][sequence, 64] == 13
        assert values["tickets.cache.blocking_waits"][sequence, 64] == (
            first.stats()["blocking_waits"] + second.stats()["blocking_waits"]
        )
    finally:
        first.close()
        second.close()


@pytest.mark.backend("postgresql")
def test_failing_refills_show_until_one_works(reader, make_database, backend: str) -> None:
    url = make_database(backend)
    target = sa.engine.make_url(url)
    sequence = _name()
    with TcpProxy(target.host or "127.0.0.1", target.port or 0) as proxy:
        server = TicketServer(proxy.url(url), timeout=1.0)
        cache = CachedSource(server, min_block=16, max_block=16, backoff=0.05)
        try:
            cache.next_id(sequence)
            assert cache.wait_idle(10)
            proxy.refuse()
            deadline = time.monotonic() + 20
            # Draw what is held: the refills this starts fail while the proxy refuses.
            while read_back(reader)["tickets.cache.refill_failures"][sequence, 64] == 0:
                assert time.monotonic() < deadline, "no failed refill was reported"
                if cache.stats()["in_hand"]:
                    cache.next_id(sequence)
                threading.Event().wait(0.01)
            proxy.forward()
            assert cache.wait_idle(20)  # the refill in flight retries until it works
            assert read_back(reader)["tickets.cache.refill_failures"][sequence, 64] == 0
        finally:
            cache.close()
            server.close()


def test_figures_match_stats_per_sequence(server) -> None:
    sequence = _name()
    with CachedSource(server) as cache:
        cache.next_id(sequence)
        assert cache.wait_idle(10)  # a refill landing between the two reads changes both
        (entry,) = [f for f in figures() if f.sequence == sequence]
        lane = cache.stats()["sequences"][f"{sequence}/64"]
        assert (entry.issued, entry.in_hand, entry.round_trips, entry.bits) == (
            lane["issued"], lane["in_hand"], lane["round_trips"], 64
        )


def test_prometheus_scrapes_the_collector_over_http(server) -> None:
    registry = CollectorRegistry()
    registry.register(PrometheusCollector())
    httpd, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    sequence = _name()
    cache = CachedSource(server)
    try:
        for _ in range(25):
            cache.next_id(sequence)
        assert cache.wait_idle(10)
        port = httpd.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            body = reply.read().decode()
        samples = {
            (sample.name, sample.labels.get("sequence")): sample
            for family in text_string_to_metric_families(body)
            for sample in family.samples
        }
        stats = cache.stats()["sequences"][f"{sequence}/64"]
        for name, key in [
            ("tickets_ids_issued_total", "issued"),
            ("tickets_ids_burned_total", "burned"),
            ("tickets_cache_in_hand", "in_hand"),
            ("tickets_cache_blocking_waits_total", "blocking_waits"),
            ("tickets_source_round_trips_total", "round_trips"),
        ]:
            sample = samples[name, sequence]
            assert sample.value == stats[key], name
            assert sample.labels == {"sequence": sequence, "bits": "64"}
        assert ("tickets_cache_rate_per_second", sequence) in samples
        assert samples["tickets_ids_space_used", sequence].value == pytest.approx(
            stats["last_issued"] / (2**63 - 1))
    finally:
        cache.close()
        httpd.shutdown()
        thread.join(10)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )


def test_the_global_provider_gets_the_instruments_without_a_call(tmp_path) -> None:
    """A provider set after the first cache still receives them (the API's proxy meter)."""
    done = _run(f"""
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from sqlalchemy_tickets import CachedSource, TicketServer

        cache = CachedSource(TicketServer("sqlite:///{tmp_path / 't.db'}"))
        for _ in range(9):
            cache.next_id("photos")
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        data = reader.get_metrics_data()
        points = {{
            m.name: p.value
            for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics
            for p in m.data.data_points if p.attributes["sequence"] == "photos"
        }}
        assert points["tickets.ids.issued"] == 9, points
        assert points["tickets.cache.blocking_waits"] == cache.stats()["blocking_waits"]
        print("ok")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_switched_off_by_the_environment(tmp_path) -> None:
    done = _run(f"""
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from sqlalchemy_tickets import CachedSource, TicketServer

        reader = InMemoryMetricReader()
        metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
        cache = CachedSource(TicketServer("sqlite:///{tmp_path / 't.db'}"))
        cache.next_id("photos")
        data = reader.get_metrics_data()
        assert data is None or not data.resource_metrics, data
        print("ok")
    """, SQLALCHEMY_TICKETS_METRICS="off")
    assert done.returncode == 0, done.stderr


BLOCK_OTEL = """
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, NotInstalled())
"""


def test_nothing_of_opentelemetry_is_imported_when_it_is_not_installed(tmp_path) -> None:
    done = _run(BLOCK_OTEL + f"""
    import sqlalchemy_tickets.metrics as m
    from sqlalchemy_tickets import CachedSource, TicketServer

    cache = CachedSource(TicketServer("sqlite:///{tmp_path / 't.db'}"))
    assert cache.next_id("photos") == 1
    assert m.enable() is False
    assert [f.issued for f in m.figures()] == [1]
    cache.close()
    loaded = [n for n in sys.modules if n.startswith(("opentelemetry", "prometheus_client"))]
    assert not loaded, loaded
    print("ok")
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_importing_the_package_imports_no_opentelemetry() -> None:
    done = _run("""
    import sys
    import sqlalchemy_tickets, sqlalchemy_tickets.metrics
    loaded = [n for n in sys.modules if n.startswith(("opentelemetry", "prometheus_client"))]
    assert not loaded, loaded
    print("ok")
    """)
    assert done.returncode == 0, done.stderr
