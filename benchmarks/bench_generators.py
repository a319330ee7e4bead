"""App-side id generators against their PyPI peers, side by side in one process.

Each variant makes ``N`` ids in a plain loop; every figure is the median of per-round time
ratios, ours / peer (lower is faster). Targets:

* Snowflake, Twitter layout (41/10/12): ``SnowflakeId(worker_id=1).new_id`` vs ``snowflake-id``:
  >= 1.5x its rate (time ratio <= 0.667). That layout allows 4,096 ids per ms, one per 244 ns;
  ours waits for the next millisecond, ``snowflake-id`` returns ``None`` (counted). Also with a
  16-bit sequence (41/6/16), where the layout is not the limit: the cost of the code itself.
* UUIDv7: ``UUID7().new_id`` (a ``uuid.UUID``) vs ``uuid_utils.uuid7`` (its own Rust type):
  <= 1.2x; also vs ``uuid_utils.compat.uuid7``, ``uuid6.uuid7`` and the floor, uuid_utils'
  integer in the cheapest ``uuid.UUID`` there is (``object.__new__`` + two slot writes).
* Prefixed: ``PrefixedId("post").new_id`` vs ``str(typeid.TypeID("post"))`` and
  ``str(ulid.ULID())``: < 1.0 each. ObjectId: ``ObjectId().new_id`` vs ``str(bson.ObjectId())``.

    .venv/bin/python benchmarks/bench_generators.py [--smoke] [--rounds R]
"""

from __future__ import annotations

import sys
import uuid
from typing import Any

import _common as h
import bson
import snowflake
import uuid6
import uuid_utils
import uuid_utils.compat
from typeid import TypeID
from ulid import ULID

from sqlalchemy_tickets import UUID7, ObjectId, PrefixedId, SnowflakeId

NAME = "bench_generators"
# uuid_utils' integer-only entry point where the installed release has it (not 0.10-0.12).
_uuid7_int = getattr(uuid_utils, "_uuid7_int", None) or (lambda: uuid_utils.uuid7().int)
_set_int, _set_safe = uuid.UUID.__dict__["int"].__set__, uuid.UUID.__dict__["is_safe"].__set__


def uuid7_floor() -> uuid.UUID:
    """uuid_utils' integer wrapped in the cheapest possible ``uuid.UUID``."""
    u: uuid.UUID = object.__new__(uuid.UUID)
    _set_int(u, _uuid7_int())
    _set_safe(u, uuid.SafeUUID.unknown)
    return u


def groups(n: int, nones: dict[str, list[int]]) -> dict[str, dict[str, tuple[Any, float | None]]]:
    """group -> variant -> (a run making ``n`` ids, target for ours / it); "ours" first."""
    wide = SnowflakeId(worker_id=2, timestamp_bits=41, worker_bits=6, sequence_bits=16)
    made = {
        "snowflake 41/10/12": {"ours": SnowflakeId(worker_id=1).new_id, "snowflake-id": None},
        "snowflake 41/6/16": {"ours": wide.new_id, "snowflake-id": None},
        "uuid7": {
            "ours": UUID7().new_id,
            "uuid_utils": uuid_utils.uuid7,
            "uuid_utils.compat": uuid_utils.compat.uuid7,
            "uuid6": uuid6.uuid7,
            "floor": uuid7_floor,
        },
        "prefixed": {
            "ours": PrefixedId("post").new_id,
            "typeid-python": lambda: str(TypeID("post")),
            "python-ulid": lambda: str(ULID()),
            "ours typeid": PrefixedId("post", format="typeid").new_id,
        },
        "objectid": {"ours": ObjectId().new_id, "bson": lambda: str(bson.ObjectId())},
    }
    targets = {"snowflake-id": 1 / 1.5, "uuid_utils": 1.2, "typeid-python": 1.0, "python-ulid": 1.0}
    return {
        group: {
            name: (
                h.loop(f, n)
                if f
                else h.none_counting_loop(
                    snowflake.SnowflakeGenerator(1).__next__, n, nones[group]
                ),
                targets.get(name),
            )
            for name, f in variants.items()
        }
        for group, variants in made.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv)
    n = 2_000 if args.smoke else 200_000
    env = h.environment(
        "snowflake-id", "uuid-utils", "uuid6", "typeid-python", "python-ulid", "pymongo"
    )
    nones: dict[str, list[int]] = {"snowflake 41/10/12": [], "snowflake 41/6/16": []}
    results: dict[str, Any] = {}
    checks = {}
    for group, variants in groups(n, nones).items():
        chosen = [h.Variant(name, run, per=n) for name, (run, _) in variants.items()]
        timings = h.interleave(chosen, h.rounds(args, 15), label=f"{group}: ")
        ratios = {
            f"ours/{p}": h.ratio_summary(timings, "ours", p, t)
            for p, (_, t) in variants.items()
            if p != "ours"
        }
        checks.update({f"{group} {k}": v for k, v in ratios.items() if "target" in v})
        results[group] = {
            "ratios": ratios,
            "median_ns_per_id": {v: timings.median(v) * 1e9 for v in timings.seconds},
            **timings.to_json(),
        }
    results["snowflake-id None results per run"] = nones
    title = f"App-side id generators vs PyPI peers ({n:,} ids per run)"
    fig, (left, right) = h.figure(2, title, env, height=7)
    h.ratio_panel(left, h.flatten(results, "ratios"), "time per id, ours / peer", log_scale=True)
    ns = h.flatten(results, "median_ns_per_id")
    h.value_panel(right, ns, "median ns per id", "ns", log_scale=True)
    return h.report(
        args,
        NAME,
        env=env,
        parameters={"ids_per_run": n},
        results=results,
        checks=checks,
        figure=fig,
    )


if __name__ == "__main__":
    sys.exit(main())
