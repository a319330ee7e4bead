"""ZooKeeperSource when the ensemble fails: real members killed (SIGKILL) or stalled (SIGSTOP),
a client cut off by a TCP proxy, a session expired with a write in flight, a node made again
lower, the whole ensemble restored from older data directories, and a datacenter tier riding
out a whole-ensemble outage. Long scenarios: ``slow``."""

from __future__ import annotations

import json
import logging
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient

from sqlalchemy_tickets import (
    DatacenterTier,
    RewindError,
    TicketServerUnavailable,
    ZooKeeperSource,
)
from sqlalchemy_tickets.sources.datacenter import describe_datacenter
from support.proxy import TcpProxy
from support.zookeeper import Ensemble, four_letter, synced_reader

pytestmark = pytest.mark.slow

MARGIN = 1_000_000


@pytest.fixture
def observer(zookeeper: Ensemble) -> Iterator[KazooClient]:
    client = synced_reader(zookeeper.hosts)
    yield client
    client.stop()
    client.close()


def _mark(observer: KazooClient, path: str) -> int:
    observer.sync(path)
    return int(json.loads(observer.get(path)[0])["last"])


class Drawer:
    """A thread drawing blocks back to back, recording each call's outcome and time."""

    def __init__(self, source: ZooKeeperSource, sequence: str) -> None:
        self.source, self.sequence = source, sequence
        self.blocks: list[range] = []
        self.errors: list[BaseException] = []
        self.delays: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.blocks.append(self.source.next_block(self.sequence, 3))
            except Exception as error:  # noqa: BLE001 - recorded, asserted on
                self.errors.append(error)
            self.delays.append(time.monotonic() - started)

    def __enter__(self) -> Drawer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def wait_blocks(self, n: int, timeout: float = 60) -> None:
        """Until ``n`` more blocks than now came out (polls)."""
        target = len(self.blocks) + n
        deadline = time.monotonic() + timeout
        while len(self.blocks) < target:
            assert time.monotonic() < deadline, f"{len(self.blocks)} blocks, errors {self.errors}"
            assert not self.errors, self.errors
            time.sleep(0.01)


def _unique(blocks: list[range]) -> None:
    ids = [i for block in blocks for i in block]
    assert len(ids) == len(set(ids))
    assert ids == sorted(ids)  # one thread: every block above the one before


def test_killing_the_leader_costs_callers_no_error(zookeeper: Ensemble, zk_path: str) -> None:
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=2.0)
    try:
        with Drawer(source, "lead") as drawer:
            drawer.wait_blocks(20)
            zookeeper.kill(zookeeper.leader())
            drawer.wait_blocks(50)  # a new leader was elected and writes go on
        assert drawer.errors == []
        assert max(drawer.delays) < 2.0 + 0.5
        _unique(drawer.blocks)
    finally:
        source.close()


def test_a_stalled_leader_and_a_stalled_server_cost_callers_no_error(
    zookeeper: Ensemble, zk_path: str
) -> None:
    # The leader stopped (SIGSTOP: no connection closes, the followers must notice it by
    # its silence), then the server the source's session is on. The timeout covers noticing
    # (syncLimit: 1 s), an election and a session's move with three JVMs on a loaded two-core
    # machine (4 s was once not enough there: "did not grant within 4 s").
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=8.0)
    try:
        with Drawer(source, "stall") as drawer:
            drawer.wait_blocks(20)
            leader = zookeeper.leader()
            zookeeper.pause(leader)
            drawer.wait_blocks(30)
            zookeeper.resume(leader)
            zookeeper.wait_serving()
            drawer.wait_blocks(10)
            session = f"sid={source.session_id:#x}"
            mine = next(i for i, m in enumerate(zookeeper.members)
                        if session in four_letter(m.client_port, "cons"))
            zookeeper.pause(mine)
            drawer.wait_blocks(30)
            session = f"sid={source.session_id:#x}"  # the same, or a new one if it expired
            assert any(session in four_letter(m.client_port, "cons")
                       for i, m in enumerate(zookeeper.members) if i != mine)  # it moved
            zookeeper.resume(mine)
            zookeeper.wait_serving()
        assert drawer.errors == []
        _unique(drawer.blocks)
    finally:
        source.close()


def test_losing_the_quorum_is_unavailable_within_the_timeout_then_recovers(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=2.0)
    try:
        before = source.next_block("quorum", 10)
        leader = zookeeper.leader()
        followers = [i for i in range(3) if i != leader]
        zookeeper.kill(followers[0])
        zookeeper.kill(leader)
        for _ in range(3):  # every call, not just the first, gives up in time
            started = time.monotonic()
            with pytest.raises(TicketServerUnavailable, match="did not grant within 2 s"):
                source.next_block("quorum", 10)
            assert 1.9 < time.monotonic() - started < 3.0
        # The member left alone never served a write: a minority issues nothing.
        assert "Mode: leader" not in four_letter(zookeeper.members[followers[1]].client_port)
        zookeeper.start()
        zookeeper.wait_serving()
        deadline = time.monotonic() + 30
        while True:
            try:
                after = source.next_block("quorum", 10)
                break
            except TicketServerUnavailable:
                assert time.monotonic() < deadline
        assert after.start > before[-1]
        assert _mark(observer, f"{zk_path}/quorum-64") == after[-1]
    finally:
        source.close()


def _session_listed(zookeeper: Ensemble, session: int) -> bool | None:
    """Whether the leader lists ``session`` among live sessions (``None``: no answer)."""
    dump = four_letter(zookeeper.members[zookeeper.leader()].client_port, "dump")
    if "SessionTracker dump" not in dump:
        return None
    return f"{session:#x}" in dump


def test_a_session_that_expired_with_its_write_in_flight_never_reuses_that_block(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    member = zookeeper.members[0]
    with TcpProxy("127.0.0.1", member.client_port).start() as proxy:
        source = ZooKeeperSource(f"127.0.0.1:{proxy.port}", path=zk_path, timeout=30.0,
                                 session_timeout=0.8)
        try:
            assert source.next_block("expiry", 100) == range(1, 101)
            session = source.session_id
            assert session is not None
            # The write of the next block reaches the ensemble; its answer is dropped and the
            # proxy hangs: the source cannot learn the outcome, nor reach anyone else.
            proxy.swallow_reply_after(b'"last":200', then_hang=True)
            found: list[range] = []
            call = threading.Thread(target=lambda: found.append(source.next_block("expiry", 100)))
            call.start()
            deadline = time.monotonic() + 30
            while _mark(observer, f"{zk_path}/expiry-64") != 200:  # it landed
                assert time.monotonic() < deadline
                time.sleep(0.02)
            while _session_listed(zookeeper, session) is not False:  # until it expired
                assert time.monotonic() < deadline, "the session did not expire"
                time.sleep(0.05)
            assert proxy.faults_fired == 1 and call.is_alive()
            proxy.forward()
            call.join(30)
            assert found == [range(201, 301)]  # never 101..200, whose answer was lost
            stats = source.stats()
            assert stats["retries"] >= 1
            # The leader no longer listing the session is not proof that it expired: twice in
            # three CI runs kazoo resumed it when the link came back (no "Session has
            # expired"). Either way the block whose answer was lost is never reused; a session
            # replaced is counted as lost, and only then.
            assert (source.session_id != session) == (stats["sessions_lost"] >= 1), stats
            assert _mark(observer, f"{zk_path}/expiry-64") == 300
        finally:
            source.close()


def test_a_node_made_again_lower_is_healed_above_what_was_issued(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    try:
        issued = source.next_block("again", 500)
        node = f"{zk_path}/again-64"
        observer.delete(node)
        observer.create(node, json.dumps({"last": 0, "bits": 64}).encode())
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            after = source.next_block("again", 10)
        assert after.start > issued[-1] + MARGIN - 1
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "made again" in warnings[0]
        assert source.stats()["rewinds"] == 1
        # Even a node made again *above* the marks this process knows is a rewind: others may
        # have issued more.
        observer.delete(node)
        observer.create(node, json.dumps({"last": after[-1] + 5, "bits": 64}).encode())
        assert source.next_id("again") > after[-1] + 5 + MARGIN
        assert source.stats()["rewinds"] == 2
    finally:
        source.close()


def test_a_refused_rewind_resumes_after_sync_in_the_running_process(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path, on_rewind="refuse")
    admin = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    try:
        issued = source.next_block("refused", 50)
        node = f"{zk_path}/refused-64"
        observer.delete(node)
        observer.create(node, json.dumps({"last": 3, "bits": 64}).encode())
        with pytest.raises(RewindError, match=r"sync --url zookeeper://.* --above N refused"):
            source.next_id("refused")
        assert _mark(observer, node) == 3  # nothing issued
        with pytest.raises(RewindError):
            source.next_id("refused")
        admin.sync_above("refused", 1_000)
        assert source.next_id("refused") == 1_001 > issued[-1]
    finally:
        source.close()
        admin.close()


def _restart_with(zookeeper: Ensemble, data: Path) -> None:
    zookeeper.stop_all()
    zookeeper.restore_data(data)
    zookeeper.start()
    zookeeper.wait_serving()


def test_an_ensemble_restored_from_an_older_snapshot_is_recognised_by_a_running_source(
    zookeeper: Ensemble, zk_path: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=5.0)
    saved = Path(tempfile.mkdtemp(prefix="tickets-zk-snap-"))
    try:
        first = source.next_block("restored", 100)
        zookeeper.stop_all()
        zookeeper.copy_data(saved / "copy")
        zookeeper.start()
        zookeeper.wait_serving()
        second = source.next_block("restored", 100)  # issued after the copy: lost by it
        _restart_with(zookeeper, saved / "copy")
        with caplog.at_level(logging.WARNING, logger="sqlalchemy_tickets"):
            deadline = time.monotonic() + 30
            while True:
                try:
                    third = source.next_block("restored", 100)
                    break
                except TicketServerUnavailable:
                    assert time.monotonic() < deadline
        assert third.start > second[-1] + MARGIN - 1 > first[-1]
        assert source.stats()["rewinds"] == 1
        assert any("went back in time" in r.getMessage() for r in caplog.records)
    finally:
        source.close()
        import shutil

        shutil.rmtree(saved, ignore_errors=True)


def _tier_ids(tier: DatacenterTier, sequence: str, n: int) -> list[int]:
    ids: list[int] = []
    deadline = time.monotonic() + 60
    while len(ids) < n:
        try:
            ids.extend(tier.next_block(sequence, min(50, n - len(ids))))
        except TicketServerUnavailable:
            assert time.monotonic() < deadline
    return ids


TIER: dict[str, Any] = {"supply": 0.001, "min_block": 100, "max_block": 200, "timeout": 5.0}


def test_a_restore_is_recognised_by_a_new_process_through_the_tiers_marks(
    zookeeper: Ensemble, zk_path: str, make_database: Any
) -> None:
    database = make_database("sqlite")
    saved = Path(tempfile.mkdtemp(prefix="tickets-zk-snap-"))
    try:
        up = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=5.0)
        with DatacenterTier(database, up, **TIER) as tier:
            early = _tier_ids(tier, "marks", 300)
        up.close()
        zookeeper.stop_all()
        zookeeper.copy_data(saved / "copy")
        zookeeper.start()
        zookeeper.wait_serving()
        up = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=5.0)
        with DatacenterTier(database, up, **TIER) as tier:
            late = _tier_ids(tier, "marks", 1_000)  # stored by the tier: its marks
        up.close()
        _restart_with(zookeeper, saved / "copy")
        # A new source (a new process: no marks of its own) under a tier that remembers.
        fresh = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=5.0)
        with DatacenterTier(database, fresh, **TIER) as tier:
            after = _tier_ids(tier, "marks", 1_000)
            rewinds = tier.stats()["rewinds"]  # the tier's and its upstream's
        fresh.close()
        everything = early + late + after
        assert len(everything) == len(set(everything))
        assert rewinds >= 1
    finally:
        import shutil

        shutil.rmtree(saved, ignore_errors=True)


def _stock(database: str, sequence: str) -> int:
    return sum(s.stock for s in describe_datacenter(database) if s.sequence == sequence)


def test_a_datacenter_tier_issues_from_its_stock_through_a_whole_ensemble_outage(
    zookeeper: Ensemble, zk_path: str, make_database: Any
) -> None:
    up = ZooKeeperSource(zookeeper.hosts, path=zk_path, timeout=1.0)
    database = make_database("sqlite")
    try:
        with DatacenterTier(database, up, supply=60.0, min_block=5_000, timeout=2.0) as tier:
            before = _tier_ids(tier, "outage", 200)
            deadline = time.monotonic() + 30
            while _stock(database, "outage") < 2_000:  # refilled
                assert time.monotonic() < deadline
                time.sleep(0.05)
            zookeeper.stop_all()
            during = [i for _ in range(20) for i in tier.next_block("outage", 50)]
            zookeeper.start()
            zookeeper.wait_serving()
        assert len(during) == 1_000
        assert len(set(before + during)) == 1_200
    finally:
        up.close()
