"""The command line on a ``zookeeper://`` URL: ``init``, ``next``, ``status`` (with forecasts),
``sync --above`` (never down), the checks made before anything is read or written (exit 2),
and failures in one line (exit 1), run as a user runs it: the console script in a process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from support.cli import run
from support.zookeeper import Ensemble, synced_reader


@pytest.fixture
def observer(zookeeper: Ensemble) -> Iterator[KazooClient]:
    client = synced_reader(zookeeper.hosts)
    yield client
    client.stop()
    client.close()


def _last(observer: KazooClient, node: str) -> int:
    return int(json.loads(observer.get(node)[0])["last"])


def _clean(done: object) -> None:
    stderr = done.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr


def test_init_next_status_and_sync(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    url = zookeeper.url(zk_path)
    done = run("init", "--url", url, "Photos", "users", "--bits", "32")
    assert done.returncode == 0, done.stderr
    assert "photos: ready (created; last id -)" in done.stdout
    assert sorted(observer.get_children(zk_path)) == ["photos-32", "users-32"]
    again = run("init", "--url", url, "photos", "--bits", "32")
    assert again.returncode == 0 and "there already, left as it is" in again.stdout

    done = run("next", "--url", url, "PHOTOS", "--bits", "32", "--count", "5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "2", "3", "4", "5"]
    assert _last(observer, f"{zk_path}/photos-32") == 5

    done = run("status", "--url", url, "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["sequence"]: row for row in json.loads(done.stdout)}
    assert rows["photos"]["last_id"] == 5 and rows["users"]["last_id"] == 0
    assert rows["photos"]["used_32"] == pytest.approx(5 / (2**31 - 1))

    done = run("sync", "--url", url, "--above", "1000", "photos", "--bits", "32")
    assert done.returncode == 0, done.stderr
    assert "every new id is above it (last id now 1000)" in done.stdout
    assert run("next", "--url", url, "photos", "--bits", "32").stdout.split() == ["1001"]


def test_sync_never_lowers_and_changes_nothing(
    zookeeper: Ensemble, zk_path: str, observer: KazooClient
) -> None:
    url = zookeeper.url(zk_path)
    assert run("init", "--url", url, "a", "b", "--start", "500").returncode == 0
    before = observer.get(f"{zk_path}/a-64")[1].version
    done = run("sync", "--url", url, "--above", "100")  # every sequence; both issued to 499
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "sync never lowers" in done.stderr
    _clean(done)
    assert observer.get(f"{zk_path}/a-64")[1].version == before
    assert _last(observer, f"{zk_path}/b-64") == 499
    done = run("sync", "--url", url, "--above", "7000")
    assert done.returncode == 0, done.stderr
    assert _last(observer, f"{zk_path}/a-64") == _last(observer, f"{zk_path}/b-64") == 7000


def test_status_forecasts_the_end_of_each_id_space(
    zookeeper: Ensemble, zk_path: str
) -> None:
    from sqlalchemy_tickets import ZooKeeperSource

    url = zookeeper.url(zk_path)
    assert run("init", "--url", url, "busy", "--bits", "32",
               "--start", str(int(0.9 * 2**31))).returncode == 0
    source = ZooKeeperSource(zookeeper.hosts, path=zk_path)
    try:
        import threading

        stop = threading.Event()

        def burn() -> None:
            while not stop.is_set():
                source.next_block("busy", 10_000, bits=32)

        burner = threading.Thread(target=burn)
        burner.start()
        try:
            done = run("status", "--url", url, "--sample", "1")
        finally:
            stop.set()
            burner.join(30)
    finally:
        source.close()
    assert done.returncode == 3, done.stderr  # past 80 % of the 32-bit space
    assert "90% of the 32-bit id space is used" in done.stderr
    line = next(line for line in done.stdout.splitlines() if " busy " in f" {line} ")
    today = time.strftime("%Y")
    assert today in line  # the 32-bit space ends soon at that rate: a date this year or next


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["init", "--url", "zookeeper://h:1/x", "--increment", "2", "s"], "--increment is for"),
        (["init", "--url", "zookeeper://h:1/x", "--url", "sqlite:///x.db", "s"],
         "give it alone"),
        (["next", "--url", "zookeeper://h:99999/x", "s"], "invalid ZooKeeper URL"),
        (["sync", "--url", "zookeeper://h:1/x", "--above", "-3", "s"], "must be between"),
        (["restride", "--url", "zookeeper://h:1/x"], "restride is for ticket databases"),
        (["init", "--url", "zookeeper://h:1/x", "--bits", "32", "--start", "3000000000", "s"],
         "--start must be between 1 and 2,147,483,647"),
        (["status", "--url", "zookeeper://h:1/x?timeout=zero"], "invalid ZooKeeper URL"),
    ],
)
def test_bad_arguments_exit_2_before_anything_is_read(
    argv: list[str], message: str
) -> None:
    done = run(*argv)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    _clean(done)


def test_failures_are_one_line_and_exit_1(zookeeper: Ensemble, zk_path: str) -> None:
    url = zookeeper.url(zk_path)
    done = run("next", "--url", url, "missing")
    assert done.returncode == 1
    assert "does not exist" in done.stderr and "sqlalchemy-tickets init" in done.stderr
    assert done.stderr.count("\n") == 1
    _clean(done)
    assert run("init", "--url", url, "small", "--bits", "32").returncode == 0
    done = run("sync", "--url", url, "--above", str(2**31 - 1), "--bits", "32", "small")
    assert done.returncode == 1 and "leaves no id" in done.stderr
    _clean(done)
    # No ensemble there: unavailable within the URL's timeout, one line.
    started = time.monotonic()
    done = run("status", "--url", "zookeeper://127.0.0.1:1/x?timeout=0.5")
    assert done.returncode == 1 and "did not grant within 0.5 s" in done.stderr
    assert done.stderr.count("\n") == 1  # kazoo's own warnings stay off stderr
    assert time.monotonic() - started < 30
    _clean(done)
