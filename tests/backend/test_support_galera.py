"""The private Galera cluster of ``support.galera``, exercised for real.

Library tests will rely on it to produce Galera's own faults (certification failures, a node
vanishing mid-transaction); if the "cluster" were three unrelated servers, or a killed node
never really came back, those tests would prove nothing. Each test here checks an effect
that only a working multi-primary cluster shows.

One cluster serves the whole module (starting one takes ~12 s); the kill/rejoin test puts
it back to three Synced nodes before it returns.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from support.galera import GaleraCluster

#: Long scenarios: run once per make test (see the ``slow`` marker).
pytestmark = pytest.mark.slow

#: MariaDB's ER_LOCK_DEADLOCK: what a Galera certification failure looks like to a client.
ER_LOCK_DEADLOCK = 1213


@pytest.fixture(scope="module")
def cluster(galera_cluster: GaleraCluster) -> GaleraCluster:
    """The session's 3-node Galera cluster (``conftest.galera_cluster``)."""
    return galera_cluster


@pytest.fixture(scope="module")
def database(cluster: GaleraCluster) -> Iterator[list[str]]:
    """A database on the cluster; its URL on node 1, 2, 3."""
    name = f"tickets_g_{secrets.token_hex(4)}"
    urls = cluster.create_database(name)
    yield urls
    cluster.drop_database(name)


def _engine(url: str) -> Engine:
    """An engine whose reads wait until the node applied everything committed before them
    anywhere in the cluster (``wsrep_sync_wait``): read-your-writes across nodes."""
    return create_engine(
        url,
        connect_args={
            "init_command": "SET SESSION wsrep_sync_wait = 1",
            "connect_timeout": 5,
            "read_timeout": 30,
        },
    )


class _Engines:
    """One engine per node URL, disposed together."""

    def __init__(self, urls: list[str]) -> None:
        self.engines = [_engine(url) for url in urls]

    def __getitem__(self, node_number: int) -> Engine:
        return self.engines[node_number - 1]  # 1-based, like the node names

    def dispose(self) -> None:
        for engine in self.engines:
            engine.dispose()


@pytest.fixture
def nodes(database: list[str]) -> Iterator[_Engines]:
    engines = _Engines(database)
    yield engines
    engines.dispose()


def test_three_nodes_synced_in_one_cluster(cluster: GaleraCluster) -> None:
    assert len(cluster.nodes) == 3
    assert len({node.port for node in cluster.nodes}) == 3
    statuses = [node.status() for node in cluster.nodes]
    for status in statuses:
        assert status["wsrep_local_state_comment"] == "Synced"
        assert status["wsrep_cluster_size"] == "3"
        assert status["wsrep_cluster_status"] == "Primary"
        assert status["wsrep_ready"] == "ON"
    # One cluster, not three that happen to look alike.
    assert len({status["wsrep_cluster_state_uuid"] for status in statuses}) == 1
    assert len({status["wsrep_local_index"] for status in statuses}) == 3


def test_auto_increment_is_spread_over_the_nodes(cluster: GaleraCluster) -> None:
    settings = []
    for node in cluster.nodes:
        engine = create_engine(node.url)
        try:
            with engine.connect() as conn:
                settings.append(
                    conn.execute(
                        text("SELECT @@auto_increment_increment, @@auto_increment_offset")
                    ).one()
                )
        finally:
            engine.dispose()
    assert [increment for increment, _ in settings] == [3, 3, 3]
    assert sorted(offset for _, offset in settings) == [1, 2, 3]


def test_writes_replicate_between_nodes(nodes: _Engines) -> None:
    with nodes[1].begin() as conn:
        conn.execute(text("CREATE TABLE replicated (id INT PRIMARY KEY, note VARCHAR(20))"))
    with nodes[3].connect() as conn:
        tables = conn.execute(text("SHOW TABLES LIKE 'replicated'")).scalars().all()
    assert tables == ["replicated"]

    with nodes[2].begin() as conn:
        conn.execute(text("INSERT INTO replicated VALUES (2, 'from node 2')"))
    with nodes[1].connect() as conn:
        assert conn.execute(text("SELECT note FROM replicated WHERE id = 2")).scalar_one() == (
            "from node 2"
        )


def test_create_database_gives_each_node_url(cluster: GaleraCluster) -> None:
    name = f"tickets_g_{secrets.token_hex(4)}"
    urls = cluster.create_database(name)
    try:
        assert urls == [node.url_for(name) for node in cluster.nodes]
        for url, node in zip(urls, cluster.nodes, strict=True):
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    row = conn.execute(text("SELECT DATABASE(), @@port")).one()
            finally:
                engine.dispose()
            assert tuple(row) == (name, node.port)
    finally:
        cluster.drop_database(name)


def test_concurrent_updates_of_one_row_fail_certification(nodes: _Engines) -> None:
    """The fault the library must retry: the same row updated on two nodes at once.

    Both transactions commit locally; the one certified second is rolled back with 1213
    (at COMMIT, or earlier if the winner's write set aborts it while it waits on the row).
    Updates that did commit are never lost: the counter equals their number.
    """
    with nodes[1].begin() as conn:
        conn.execute(text("CREATE TABLE t (stub CHAR(1) PRIMARY KEY, id BIGINT NOT NULL)"))
        conn.execute(text("INSERT INTO t VALUES ('a', 0)"))

    attempts = 200
    barrier = threading.Barrier(2)
    failed = threading.Event()
    committed = [0, 0]
    deadlocks: list[tuple[int, str]] = []
    unexpected: list[BaseException] = []

    def hammer(slot: int, engine: Engine) -> None:
        try:
            with engine.connect() as conn:  # connect first: the race starts at the barrier
                conn.rollback()
                barrier.wait(timeout=30)
                for _ in range(attempts):
                    if failed.is_set():
                        return
                    try:
                        conn.execute(text("UPDATE t SET id = id + 1 WHERE stub = 'a'"))
                        conn.commit()
                        committed[slot] += 1
                    except OperationalError as exc:
                        conn.rollback()
                        code = exc.orig.args[0] if exc.orig is not None else None
                        if code != ER_LOCK_DEADLOCK:
                            raise
                        deadlocks.append((slot + 1, str(exc.orig)))
                        failed.set()
        except BaseException as exc:  # reported by the main thread
            unexpected.append(exc)
            failed.set()

    threads = [
        threading.Thread(target=hammer, args=(0, nodes[1])),
        threading.Thread(target=hammer, args=(1, nodes[2])),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert not unexpected, unexpected
    assert deadlocks, f"no certification failure in {attempts} updates per node"
    assert "deadlock" in deadlocks[0][1].lower()
    print(f"galera: 1213 after {committed} committed updates on nodes 1/2: {deadlocks[0]}")
    for node_number in (1, 2, 3):
        with nodes[node_number].connect() as conn:
            value = conn.execute(text("SELECT id FROM t WHERE stub = 'a'")).scalar_one()
        assert value == sum(committed)


def test_sigkilled_node_rejoins_and_catches_up(cluster: GaleraCluster, nodes: _Engines) -> None:
    with nodes[1].begin() as conn:
        conn.execute(text("CREATE TABLE survivors (id INT PRIMARY KEY, note VARCHAR(40))"))
        conn.execute(text("INSERT INTO survivors VALUES (1, 'before the kill')"))
    node2 = cluster.nodes[1]
    port = node2.port

    started = time.monotonic()
    node2.kill()
    assert not node2.is_running
    cluster.wait_synced(timeout=30)  # the survivors agree they are two
    shrunk = time.monotonic() - started
    for node in (cluster.nodes[0], cluster.nodes[2]):
        status = node.status()
        assert status["wsrep_cluster_size"] == "2"
        assert status["wsrep_local_state_comment"] == "Synced"

    # Both survivors still accept writes.
    with nodes[1].begin() as conn:
        conn.execute(text("INSERT INTO survivors VALUES (2, 'node 1, node 2 down')"))
    with nodes[3].begin() as conn:
        conn.execute(text("INSERT INTO survivors VALUES (3, 'node 3, node 2 down')"))

    started = time.monotonic()
    node2.rejoin(timeout=60)
    rejoined = time.monotonic() - started
    print(f"galera: cluster size 2 {shrunk:.1f}s after SIGKILL; rejoin took {rejoined:.1f}s")

    assert node2.is_running
    assert node2.port == port  # URLs handed out before the kill stay valid
    status = node2.status()
    assert status["wsrep_local_state_comment"] == "Synced"
    assert status["wsrep_cluster_size"] == "3"
    # It restarted from its recovered position in this cluster (so IST, not a fresh SST).
    assert node2.start_position is not None
    assert node2.start_position.split(":")[0] == status["wsrep_cluster_state_uuid"]
    cluster.wait_synced(timeout=30)
    nodes.dispose()  # node 2's pooled connections died with it
    with nodes[2].connect() as conn:
        rows = conn.execute(text("SELECT id FROM survivors ORDER BY id")).scalars().all()
    assert rows == [1, 2, 3]
    with nodes[2].begin() as conn:  # and it takes writes again
        conn.execute(text("INSERT INTO survivors VALUES (4, 'node 2 is back')"))
    with nodes[3].connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM survivors")).scalar_one() == 4
