"""``examples/multiregion/run.py`` runs, as a user runs it, in a subprocess: a global pair of
ticket servers (PostgreSQL and MariaDB), two datacenters (PostgreSQL, MariaDB) with worker
processes inserting through the ORM, one datacenter cut off the global pair through the real TCP
proxy for a few seconds, then a customer moved between datacenters keeping their keys. Besides
its exit code and its JSON, the databases it leaves are read here."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

RUN = Path(__file__).resolve().parents[2] / "examples" / "multiregion" / "run.py"
#: Seconds one run may take on a loaded two-core machine (it takes about 25).
TIMEOUT = 180
HAVE_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
CUT = 5.0


def _read(url: str) -> dict[str, Any]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return {
                "customers": {cid: home for cid, home in conn.execute(
                    sa.text("SELECT id, home FROM customers"))},
                "orders": {oid: cid for oid, cid in conn.execute(
                    sa.text("SELECT id, customer_id FROM orders"))},
            }
    finally:
        engine.dispose()


@pytest.mark.slow
def test_two_datacenters_one_cut_off_the_global_pair(
    make_database: Callable[[str], str], tmp_path: Path
) -> None:
    global_pair = [make_database("postgresql"), make_database("mysql")]
    na1, eu1 = make_database("postgresql"), make_database("mysql")
    done = subprocess.run(
        [sys.executable, str(RUN), "--out", str(tmp_path),
         "--global", *global_pair, "--na1", na1, "--eu1", eu1,
         # A stock of 1000 ids (the least a tier holds: 8 s at this rate is fewer), refilled
         # under 500: the cut comes once eu1's is down near 500, and drains about 250.
         "--workers", "2", "--rate", "25", "--supply", "8", "--warmup", "2", "--cut", str(CUT),
         # After the cut: the pair's servers, backed off through it (1 s, doubling: up to
         # 4 s by its end), are tried again within one back-off, then a refill lands.
         "--after", "8"],
        cwd=RUN.parent, env=os.environ.copy(), text=True, timeout=TIMEOUT,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    )
    assert done.returncode == 0, done.stdout
    assert done.stdout.rstrip().endswith("OK"), done.stdout
    result = json.loads((tmp_path / "multiregion_example.json").read_text())

    # What the example says of itself.
    assert result["checks_failed"] == []
    assert result["datacenters"] == {"na1": "postgresql", "eu1": "mysql"}
    assert result["failed_inserts"] == {"na1": 0, "eu1": 0}
    assert result["duplicate_keys"] == {"customers": 0, "orders": 0}
    cut = result["cut"]
    assert cut["datacenter"] == "eu1" and cut["mode"] == "hang" and cut["at"] == "low"
    # The worst moment: eu1's stock near its refill mark, so refills were due, and failed,
    # all through the cut.
    assert cut["stock_at_start"]["stock"] <= 1.15 * cut["stock_at_start"]["refill_mark"]
    assert CUT <= cut["seconds"] < CUT + 2
    # The link was down: a ticket server did not answer through it, and eu1 stored no block
    # from the global pair while it was down, yet went on inserting.
    assert cut["probe_through_cut_link"].startswith("TicketServerUnavailable")
    assert cut["refills_at_start"] == cut["refills_at_end"]
    eu1_figures = result["per_datacenter"]["eu1"]
    assert eu1_figures["orders_during_cut"] > 0
    # Refilled once the link was back.
    assert eu1_figures["tier_at_end"]["orders"]["refills"] > cut["refills_at_end"]["orders"]
    in_cut = eu1_figures["orders_per_second"][int(cut["start"]) + 1:int(cut["end"])]
    assert in_cut and all(n > 0 for n in in_cut), eu1_figures["orders_per_second"]
    timeline = result["orders_stock"]["eu1"]
    stock_in_cut = [stock for at, stock in zip(timeline["at"], timeline["stock"], strict=True)
                    if cut["start"] + 1.5 <= at <= cut["end"]]
    assert stock_in_cut == sorted(stock_in_cut, reverse=True), "eu1's stock grew in the cut"
    for dc in ("na1", "eu1"):
        figures = result["per_datacenter"][dc]
        assert figures["workers"] == 2
        assert figures["committed_by_workers"] == {"customers": figures["customers"],
                                                   "orders": figures["orders"]}
        assert figures["upstream_round_trips"] >= 1
        # Nobody waited on the global pair: the stock never ran out.
        assert figures["blocking_waits"]["tier"] == 0
    png = tmp_path / "multiregion_example.png"
    if HAVE_MATPLOTLIB:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # What the databases hold, read apart from the example.
    rows = {"na1": _read(na1), "eu1": _read(eu1)}
    for table in ("customers", "orders"):
        keys = Counter(k for dc in rows.values() for k in dc[table])
        assert keys and max(keys.values()) == 1, f"a {table} key in both datacenters"
    moved = result["migration"]
    customer_id = moved["customer_id"]
    assert moved["copied"] is True and moved["from"] == "na1" and moved["to"] == "eu1"
    # The moved customer is in eu1 with their keys (and signed up in na1), gone from na1.
    assert rows["eu1"]["customers"][customer_id] == "na1"
    assert customer_id not in rows["na1"]["customers"]
    theirs = sorted(oid for oid, cid in rows["eu1"]["orders"].items() if cid == customer_id)
    assert theirs == moved["order_ids"] and len(theirs) > 1
    assert not any(cid == customer_id for cid in rows["na1"]["orders"].values())
    # Every other row stayed where it was written.
    for dc in ("na1", "eu1"):
        expected = result["per_datacenter"][dc]["orders"] + (len(theirs) if dc == "eu1" else
                                                            -len(theirs))
        assert len(rows[dc]["orders"]) == expected
