"""App-side id generators against their PyPI peers, side by side in one process.

200,000 ids a run, 15 rounds, ours / peer. Targets: ``SnowflakeId`` vs ``snowflake-id`` <= 0.667
(and a 41/6/16 layout); ``UUID7`` vs ``uuid_utils.uuid7`` <= 1.2 (also vs its ``compat``,
``uuid6`` and a floor); ``PrefixedId`` vs ``typeid-python`` and ``python-ulid`` < 1.0;
``ObjectId`` vs ``bson.ObjectId``.

    .venv/bin/python benchmarks/bench_generators.py [--smoke] [--rounds 15]
"""

from __future__ import annotations

import uuid
from typing import Any

import _harness as h
import bson
import snowflake
import uuid6
import uuid_utils
import uuid_utils.compat
from typeid import TypeID
from ulid import ULID

from sqlalchemy_tickets import UUID7, ObjectId, PrefixedId, SnowflakeId

NAME = "bench_generators"
TARGETS = {"snowflake-id": 1 / 1.5, "uuid_utils": 1.2, "typeid-python": 1.0, "python-ulid": 1.0}
# uuid_utils' integer-only entry point where the installed release has it (not 0.10-0.12).
UUID7_INT = getattr(uuid_utils, "_uuid7_int", None) or (lambda: uuid_utils.uuid7().int)
SET_INT, SET_SAFE = uuid.UUID.__dict__["int"].__set__, uuid.UUID.__dict__["is_safe"].__set__


def uuid7_floor() -> uuid.UUID:
    """uuid_utils' integer wrapped in the cheapest possible ``uuid.UUID``."""
    u: uuid.UUID = object.__new__(uuid.UUID)
    SET_INT(u, UUID7_INT())
    SET_SAFE(u, uuid.SafeUUID.unknown)
    return u


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, peers=("snowflake-id", "uuid-utils", "uuid6",
                                              "typeid-python", "python-ulid", "pymongo"))
    n = 2_000 if args.smoke else 200_000
    nones: dict[str, list[int]] = {"snowflake 41/10/12": [], "snowflake 41/6/16": []}
    wide = SnowflakeId(worker_id=2, timestamp_bits=41, worker_bits=6, sequence_bits=16)
    groups: dict[str, dict[str, Any]] = {  # group -> variant -> one id; "ours" first
        "snowflake 41/10/12": {"ours": SnowflakeId(worker_id=1).new_id, "snowflake-id": None},
        "snowflake 41/6/16": {"ours": wide.new_id, "snowflake-id": None},
        "uuid7": {"ours": UUID7().new_id, "uuid_utils": uuid_utils.uuid7,
                  "uuid_utils.compat": uuid_utils.compat.uuid7, "uuid6": uuid6.uuid7,
                  "floor": uuid7_floor},
        "prefixed": {"ours": PrefixedId("post").new_id,
                     "typeid-python": lambda: str(TypeID("post")),
                     "python-ulid": lambda: str(ULID()),
                     "ours typeid": PrefixedId("post", format="typeid").new_id},
        "objectid": {"ours": ObjectId().new_id, "bson": lambda: str(bson.ObjectId())},
    }
    results: dict[str, Any] = {}
    for group, made in groups.items():
        chosen = [h.Variant(name, h.loop(f or snowflake.SnowflakeGenerator(1).__next__, n,
                                         nones=None if f else nones[group]), per=n)
                  for name, f in made.items()]
        timings = h.interleave(chosen, h.rounds(args, 15), label=f"{group}: ")
        ratios = {f"ours/{p}": h.ratio_summary(timings, "ours", p, TARGETS.get(p))
                  for p in made if p != "ours"}
        results[group] = {"ratios": ratios, **timings.to_json("median_ns_per_id", 1e9)}
    results["snowflake-id None results per run"] = nones
    return h.report(args, NAME, results, parameters={"ids_per_run": n}, log_scale=True,
                    title=f"App-side id generators vs PyPI peers ({n:,} ids per run)", height=7,
                    values=("median_ns_per_id", "median ns per id", "ns"))


if __name__ == "__main__":
    raise SystemExit(main())
