"""App-side id generators against their PyPI peers, side by side in one process.

Each variant makes ``N`` ids in a plain loop (``for _ in repeat(None, N): new_id()``); variants
run in interleaved rounds (order rotated each round) and every reported figure is the median of
per-round time ratios, ours / peer (lower is faster).

* Snowflake, Twitter layout (41/10/12): ``SnowflakeId(worker_id=1).new_id`` vs ``snowflake-id``.
  Target: >= 1.5x its rate (time ratio <= 0.667). NB: that layout allows 4,096 ids per ms per
  worker, i.e. at most one id per 244 ns; ours waits for the next millisecond when a sequence
  runs out, ``snowflake-id`` returns ``None`` instead (counted below).
* Snowflake, 16-bit sequence (41/6/16): the same generator where the layout is not the limit —
  the cost of the code itself — vs ``snowflake-id``; same target.
* UUIDv7: ``UUID7().new_id`` (returns ``uuid.UUID``) vs ``uuid_utils.uuid7`` (returns its own
  Rust ``UUID`` type; target <= 1.2x its time), ``uuid_utils.compat.uuid7`` (returns
  ``uuid.UUID``, like ours), ``uuid6.uuid7``; plus the floor: ``uuid_utils``' integer and the
  cheapest ``uuid.UUID`` construction there is (``object.__new__`` + two slot writes).
* Prefixed: ``PrefixedId("post").new_id`` (and ``format="typeid"``) vs
  ``str(typeid.TypeID("post"))`` and ``str(ulid.ULID())``. Target: faster than both (< 1.0).
* ObjectId: ``ObjectId().new_id`` vs ``str(bson.ObjectId())`` (no target).

    .venv/bin/python benchmarks/bench_generators.py [--quick] [--rounds R]
"""

from __future__ import annotations

import statistics
import sys
import uuid
from itertools import repeat
from typing import Any

import bson
import snowflake
import uuid6
import uuid_utils
import uuid_utils.compat
from _common import (
    RESULTS_DIR,
    Variant,
    environment,
    interleave,
    load_text,
    log,
    parse_args,
    ratio_summary,
    verdict_lines,
    write_json,
)
from typeid import TypeID
from ulid import ULID

from sqlalchemy_tickets.app_types import UUID7, ObjectId, PrefixedId, SnowflakeId
from sqlalchemy_tickets.generators import SnowflakeGenerator, SnowflakeLayout

NAME = "bench_generators"
PEERS = ("snowflake-id", "uuid-utils", "uuid6", "typeid-python", "python-ulid", "pymongo")


def _loop(new_id: Any, n: int) -> Any:
    def run(_: Any) -> None:
        for _ in repeat(None, n):
            new_id()

    return run


def _none_counting(gen: Any, n: int) -> tuple[Any, list[int]]:
    nones: list[int] = []

    def run(_: Any) -> None:
        step = gen.__next__
        missed = 0
        for _ in repeat(None, n):
            if step() is None:
                missed += 1
        nones.append(missed)

    return run, nones


_UUID = uuid.UUID
_new = object.__new__
_set_int = _UUID.__dict__["int"].__set__
_set_safe = _UUID.__dict__["is_safe"].__set__
_UNKNOWN = uuid.SafeUUID.unknown
_uuid7_int = uuid_utils._uuid7_int  # type: ignore[attr-defined]


def uuid7_floor() -> uuid.UUID:
    """uuid_utils' integer wrapped in the cheapest possible ``uuid.UUID``."""
    u: uuid.UUID = _new(_UUID)
    _set_int(u, _uuid7_int())
    _set_safe(u, _UNKNOWN)
    return u


# group -> (ours, [(peer, target or None)])
GROUPS: dict[str, tuple[str, list[tuple[str, float | None]]]] = {
    "snowflake 41/10/12": ("ours", [("snowflake-id", 1 / 1.5)]),
    "snowflake 41/6/16": ("ours", [("snowflake-id", 1 / 1.5)]),
    "uuid7": (
        "ours",
        [("uuid_utils", 1.2), ("uuid_utils.compat", None), ("uuid6", None), ("floor", None)],
    ),
    "prefixed": ("ours", [("typeid-python", 1.0), ("python-ulid", 1.0), ("ours typeid", None)]),
    "objectid": ("ours", [("bson", None)]),
}


def variants(group: str, n: int) -> tuple[list[Variant], dict[str, Any]]:
    extra: dict[str, Any] = {}
    if group == "snowflake 41/10/12":
        theirs, nones = _none_counting(snowflake.SnowflakeGenerator(1), n)
        extra["snowflake-id None results per round"] = nones
        return [
            Variant("ours", _loop(SnowflakeId(worker_id=1).new_id, n)),
            Variant("snowflake-id", theirs),
        ], extra
    if group == "snowflake 41/6/16":
        wide = SnowflakeGenerator(2, layout=SnowflakeLayout(41, 6, 16))
        theirs, nones = _none_counting(snowflake.SnowflakeGenerator(2), n)
        extra["snowflake-id None results per round"] = nones
        return [Variant("ours", _loop(wide.new_id, n)), Variant("snowflake-id", theirs)], extra
    if group == "uuid7":
        return [
            Variant("ours", _loop(UUID7().new_id, n)),
            Variant("uuid_utils", _loop(uuid_utils.uuid7, n)),
            Variant("uuid_utils.compat", _loop(uuid_utils.compat.uuid7, n)),
            Variant("uuid6", _loop(uuid6.uuid7, n)),
            Variant("floor", _loop(uuid7_floor, n)),
        ], extra
    if group == "prefixed":
        return [
            Variant("ours", _loop(PrefixedId("post").new_id, n)),
            Variant("ours typeid", _loop(PrefixedId("post", format="typeid").new_id, n)),
            Variant("typeid-python", _loop(lambda: str(TypeID("post")), n)),
            Variant("python-ulid", _loop(lambda: str(ULID()), n)),
        ], extra
    if group == "objectid":
        return [
            Variant("ours", _loop(ObjectId().new_id, n)),
            Variant("bson", _loop(lambda: str(bson.ObjectId()), n)),
        ], extra
    raise AssertionError(group)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n\n")[0], argv)
    n = 20_000 if args.quick else 200_000
    rounds = args.rounds or (5 if args.quick else 15)
    env = environment()
    env["peer_packages"] = {name: _peer_version(name) for name in PEERS}
    results: dict[str, Any] = {}
    checks: dict[str, dict[str, Any]] = {}
    for group, (ours, peers) in GROUPS.items():
        log(f"{group}: {n:,} ids per variant, {rounds} rounds")
        chosen, extra = variants(group, n)
        timings = interleave(chosen, rounds, warmup=1, label=f"{group}: ")
        ratios = {}
        for peer, target in peers:
            summary = ratio_summary(timings, ours, peer, target)
            ratios[f"{ours}/{peer}"] = summary
            if target is not None:
                checks[f"{group} {ours}/{peer}"] = summary
        results[group] = {
            "ns_per_id_median": {v.name: timings.median(v.name) / n * 1e9 for v in chosen},
            "ids_per_second_median": {v.name: n / timings.median(v.name) for v in chosen},
            "seconds": timings.seconds,
            "ratios": ratios,
            **extra,
        }
    passed = all(summary["passed"] for summary in checks.values())
    payload = {
        "benchmark": NAME,
        "description": __doc__,
        "environment": env,
        "parameters": {
            "ids_per_run": n,
            "rounds": rounds,
            "warmup_rounds": 1,
            "quick": args.quick,
            "reported_ratio": "median over rounds of (ours seconds / peer seconds), same round",
        },
        "groups": results,
        "passed": passed,
    }
    json_path = write_json(NAME, payload)
    png_path = plot_results(results, n, rounds, env)
    log("")
    for group, result in results.items():
        per_id = ", ".join(f"{k} {v:.0f} ns" for k, v in result["ns_per_id_median"].items())
        log(f"  {group}: {per_id}")
        for label, summary in result["ratios"].items():
            spread = f"{summary['min']:.3f}-{summary['max']:.3f}"
            log(f"    {label}: {summary['median']:.3f} (rounds {spread})")
        nones = result.get("snowflake-id None results per round")
        if nones:
            median = statistics.median(nones)
            log(f"    snowflake-id returned None {median:.0f} times per round (median)")
    for line in verdict_lines(checks):
        log(line)
    log(f"overall: {'PASS' if passed else 'FAIL'}")
    log(f"wrote {json_path} and {png_path}")
    return 1 if (args.strict and not passed) else 0


def plot_results(results: dict[str, Any], n: int, rounds: int, env: dict[str, Any]) -> Any:
    """Left: one horizontal bar per comparison (median ours/peer time ratio, dots for rounds,
    a red tick for the target). Right: median ns per id of every variant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [
        (f"{group}: ours / {label.split('/', 1)[1]}", summary)
        for group, result in results.items()
        for label, summary in result["ratios"].items()
    ]
    variants = [
        (f"{group}: {name}", ns)
        for group, result in results.items()
        for name, ns in result["ns_per_id_median"].items()
    ]
    fig, (left, right) = plt.subplots(
        1,
        2,
        figsize=(14, 0.42 * max(len(rows), len(variants)) + 1.8),
        gridspec_kw={"width_ratios": [3, 2]},
    )
    for y, (_, summary) in enumerate(rows):
        target = summary.get("target")
        missed = target is not None and summary["median"] > target
        left.barh(y, summary["median"], color="tab:red" if missed else "tab:blue", alpha=0.75)
        left.scatter(
            summary["per_round"], [y] * len(summary["per_round"]), s=8, color="black", zorder=3
        )
        left.annotate(
            f"{summary['median']:.2f}x",
            (summary["median"], y),
            xytext=(4, -3),
            textcoords="offset points",
            fontsize=8,
        )
        if target is not None:
            left.plot([target, target], [y - 0.4, y + 0.4], color="red", linewidth=2.5)
    left.axvline(1.0, color="grey", linestyle=":", linewidth=1)
    left.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    left.invert_yaxis()
    left.set_xscale("log")
    ticks = [0.1, 0.2, 0.5, 1, 2, 5]
    left.set_xticks(ticks, [f"{t:g}" for t in ticks])
    left.minorticks_off()
    left.set_xlabel("time ratio ours / peer, log scale (lower is faster; red tick: target)")
    left.set_title("median of per-round ratios (dots: rounds; red bar: target missed)", fontsize=10)
    right.barh(range(len(variants)), [ns for _, ns in variants], color="tab:green", alpha=0.75)
    for y, (_, ns) in enumerate(variants):
        right.annotate(f"{ns:.0f}", (ns, y), xytext=(3, -3), textcoords="offset points", fontsize=8)
    right.set_yticks(range(len(variants)), [label for label, _ in variants], fontsize=8)
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("median ns per id (log scale)")
    right.set_title("cost per id", fontsize=10)
    fig.suptitle(f"App-side id generators vs PyPI peers ({n:,} ids per run)", fontsize=12)
    fig.text(
        0.01,
        0.005,
        f"{rounds} interleaved rounds after 1 warm-up, order rotated; one "
        f"process. Twitter layout caps a worker at 4,096 ids/ms (244 ns/id). "
        f"{load_text(env)} at start",
        fontsize=7.5,
        color="dimgray",
    )
    fig.tight_layout(rect=(0, 0.03, 1, 0.96))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _peer_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
