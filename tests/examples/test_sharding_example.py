"""``examples/sharding/app.py`` runs, as a user runs it, in a subprocess: on SQLite files and on
PostgreSQL and MariaDB shards. Besides its exit code and what it reports, the databases it
leaves are read here: every key on one shard only, each moved user (and their posts) on the
shard the directory names and nowhere else, where ``id % N`` would have looked in vain."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

APP = Path(__file__).resolve().parents[2] / "examples" / "sharding" / "app.py"
#: Seconds one run may take on a loaded two-core machine (it takes a few).
TIMEOUT = 240
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@dataclass
class Run:
    stdout: str
    result: dict[str, Any]
    out: Path


def _run(out: Path, *args: str) -> Run:
    done = subprocess.run(
        [sys.executable, str(APP), "--out", str(out), *args],
        cwd=APP.parent,
        env=os.environ.copy(),
        text=True,
        timeout=TIMEOUT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout
    assert done.stdout.rstrip().endswith("OK"), done.stdout
    result = json.loads((out / "sharding_example.json").read_text())
    return Run(done.stdout, result, out)


def _check_report(run: Run, shards: int) -> None:
    """What the example says of itself."""
    result = run.result
    assert "no key collision" in run.stdout
    assert result["duplicate_keys"] == 0
    assert len(result["shards"]) == shards
    assert result["moved"], "no user was moved"
    assert result["found_after_move"] is True
    # Every moved user left the shard id % N names, so that rule would miss each of them.
    assert result["missed_by_id_mod_n"] == len(result["moved"])
    assert result["directory_lookups_after_move"] > 0
    assert result["statements_to_one_shard_after_move"] >= 2 * len(result["moved"])
    assert sum(result["rows_before"].values()) == sum(result["rows_after_moves"].values())
    png = run.out / "sharding_example.png"
    if HAVE_MATPLOTLIB:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "matplotlib is not installed" in run.stdout and not png.exists()


def _check_databases(run: Run, shard_urls: Sequence[str], directory_url: str) -> None:
    """What the databases hold, read apart from the example."""
    names = list(run.result["shards"])
    keys: dict[str, Counter[int]] = {"users": Counter(), "posts": Counter()}
    where_users: dict[int, set[str]] = {}
    posts_of: dict[tuple[str, int], int] = {}
    for name, url in zip(names, shard_urls, strict=True):
        engine = sa.create_engine(url)
        try:
            with engine.connect() as conn:
                for user_id in conn.scalars(sa.text("SELECT id FROM users")):
                    keys["users"][user_id] += 1
                    where_users.setdefault(user_id, set()).add(name)
                for post_id, user_id in conn.execute(sa.text("SELECT id, user_id FROM posts")):
                    keys["posts"][post_id] += 1
                    posts_of[name, user_id] = posts_of.get((name, user_id), 0) + 1
        finally:
            engine.dispose()
    assert all(n == 1 for counter in keys.values() for n in counter.values())
    assert sum(keys["users"].values()) + sum(keys["posts"].values()) == run.result["rows"]
    engine = sa.create_engine(directory_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT user_id, shard FROM directory")).all()
            directory: dict[int, str] = {user_id: shard for user_id, shard in rows}
    finally:
        engine.dispose()
    # The directory names every user's shard, and the user's posts are there only.
    assert {user_id: {shard} for user_id, shard in directory.items()} == where_users
    assert all(directory[user_id] == name for name, user_id in posts_of)
    for move in run.result["moved"]:
        user_id = move["user_id"]
        assert directory[user_id] == move["target"] != move["source"]
        assert names[user_id % len(names)] == move["source"]  # placed by id % N at first
        assert posts_of[move["target"], user_id] >= move["rows"] - 1
        assert (move["source"], user_id) not in posts_of


def test_sqlite(make_database: Callable[[str], str], tmp_path: Path) -> None:
    shards = [make_database("sqlite") for _ in range(3)]
    tickets = [make_database("sqlite") for _ in range(2)]
    directory = make_database("sqlite")
    run = _run(tmp_path / "out", "--shards", *shards, "--tickets", *tickets,
               "--directory", directory)
    _check_report(run, 3)
    _check_databases(run, shards, directory)
    # 3 shards, 2 ticket servers: no common factor, each server's ids reach every shard.
    assert run.result["shared_factor"] == 1 and "WARNING" not in run.stdout
    assert all(len(fed) == 3 for fed in run.result["server_feeds_shards"].values())


def test_defaults(tmp_path: Path) -> None:
    """As the README runs it: no URL at all, SQLite files in a temporary directory."""
    _check_report(_run(tmp_path), 3)


def test_stride_sharing_a_factor_ties_each_shard_to_one_server(tmp_path: Path) -> None:
    run = _run(tmp_path, "--shard-count", "2")
    _check_report(run, 2)
    assert run.result["shared_factor"] == 2
    assert "WARNING: 2 shards and a stride of 2 share the factor 2" in run.stdout
    # Odd ids (server 1) were all placed on shard1, even ids (server 2) all on shard0.
    assert run.result["server_feeds_shards"] == {"1": ["shard1"], "2": ["shard0"]}


@pytest.mark.parametrize("cached", [False, True], ids=["servers", "cached"])
def test_postgresql_and_mariadb(
    cached: bool, make_database: Callable[[str], str], tmp_path: Path
) -> None:
    shards = [make_database("postgresql"), make_database("mysql"), make_database("postgresql")]
    tickets = [make_database("postgresql"), make_database("mysql")]
    directory = make_database("mysql")
    args = ["--shards", *shards, "--tickets", *tickets, "--directory", directory]
    run = _run(tmp_path, *args, *(["--cached"] if cached else []))
    _check_report(run, 3)
    assert run.result["shards"] == {"shard0": "postgresql", "shard1": "mysql",
                                    "shard2": "postgresql"}
    _check_databases(run, shards, directory)
