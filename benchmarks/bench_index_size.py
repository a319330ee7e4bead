"""Why tickets: primary-key index size, table size and insert time by key type.

On PostgreSQL and MariaDB, ``(id <key> PRIMARY KEY, n BIGINT, INDEX(n))`` per key type, ids
inserted in creation order, in batches; sizes after ``ANALYZE``. Also writes
``<out>/bench_index_size.md``, the table ``docs/choosing.md`` quotes.

    .venv/bin/python benchmarks/bench_index_size.py [--rows 1000000] [--batch 10000] [--smoke]
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

import _harness as h
import sqlalchemy as sa

from sqlalchemy_tickets import UUID7, PrefixedId, SnowflakeId, TicketId, TicketServer

NAME, MIB = "bench_index_size", 2**20
KEYS = {"TicketId": 8, "SnowflakeId": 8, "UUID7": 16, "UUIDv4": 16, "PrefixedId": 31}  # bytes
SIZES = {
    "postgresql": "SELECT pg_relation_size(CAST(:t AS regclass)), "
    "pg_relation_size(CAST(:t || '_pkey' AS regclass)), "
    "pg_relation_size(CAST('ix_' || :t || '_n' AS regclass)), "
    "pg_total_relation_size(CAST(:t AS regclass))",
    "mysql": "SELECT t.data_length, p.stat_value * @@innodb_page_size, "
    "s.stat_value * @@innodb_page_size, t.data_length + t.index_length "
    "FROM information_schema.TABLES t JOIN mysql.innodb_index_stats p "
    "ON p.database_name = t.table_schema AND p.table_name = t.table_name "
    "AND p.index_name = 'PRIMARY' AND p.stat_name = 'size' JOIN mysql.innodb_index_stats s "
    "ON s.database_name = t.table_schema AND s.table_name = t.table_name "
    "AND s.index_name = CONCAT('ix_', :t, '_n') AND s.stat_name = 'size' "
    "WHERE t.table_schema = DATABASE() AND t.table_name = :t",
}
ANALYZE = {"postgresql": "VACUUM ANALYZE {}", "mysql": "ANALYZE TABLE {}"}
GENERATORS = {"SnowflakeId": SnowflakeId(worker_id=1), "UUID7": UUID7(),
              "PrefixedId": PrefixedId("post")}


def make_ids(key: str, url: sa.URL, rows: int) -> list[Any]:
    if key == "TicketId":
        with contextlib.closing(TicketServer(url, timeout=h.SETUP_TIMEOUT)) as server:
            return list(server.next_block("bench", rows))  # untimed: made before the clock
    if key == "UUIDv4":
        return [uuid.uuid4() for _ in range(rows)]
    new_id = GENERATORS[key].new_id
    return [new_id() for _ in range(rows)]


def measure(engine: sa.Engine, backend: str, key: str, rows: int, batch: int) -> dict[str, Any]:
    column = {"TicketId": TicketId("bench"), "UUIDv4": sa.Uuid()}.get(key) or GENERATORS[key]
    name = f"bench_{key.lower()}"
    table = sa.Table(name, sa.MetaData(),
                     sa.Column("id", column, primary_key=True, autoincrement=False),
                     sa.Column("n", sa.BigInteger, nullable=False), sa.Index(f"ix_{name}_n", "n"))
    table.create(engine)
    ids = make_ids(key, engine.url, rows)
    seconds = 0.0
    for start in range(0, rows, batch):
        chunk = [{"id": value, "n": start + k} for k, value in enumerate(ids[start:start + batch])]
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(table.insert(), chunk)
        seconds += time.perf_counter() - t0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(ANALYZE[backend].format(name)).close()
        sizes = conn.execute(sa.text(SIZES[backend]), {"t": name}).one()
    table.drop(engine)  # frees the space before the next key type
    fields = ("table_bytes", "pk_index_bytes", "secondary_index_bytes", "total_bytes")
    return {"insert_seconds": seconds, "rows_per_second": rows / seconds,
            **dict(zip(fields, map(int, sizes), strict=False))}


def markdown(results: dict[str, Any], rows: int) -> str:
    lines = [f"{rows:,} rows `(id PK, n BIGINT, INDEX(n))` per key type, ids in creation order.",
             "", "| backend | key | key bytes | PK index MiB | index on `n` MiB | total MiB "
             "| insert s | PK vs TicketId |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for backend, keys in results.items():
        base = keys["TicketId"]["pk_index_bytes"]
        lines += [f"| {h.LABELS[backend]} | {key} | {KEYS[key]} | {r['pk_index_bytes'] / MIB:.1f} "
                  f"| {r['secondary_index_bytes'] / MIB:.1f} | {r['total_bytes'] / MIB:.1f} | "
                  f"{r['insert_seconds']:.1f} | {r['pk_index_bytes'] / base:.2f}x |"
                  for key, r in keys.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = h.parse_args(__doc__, argv, {
        "--rows": dict(type=int, default=None, help="rows per key type (1,000,000)"),
        "--batch": dict(type=int, default=10_000, help="rows per executemany")},
        backends=("postgresql", "mysql"))
    rows = args.rows or (200 if args.smoke else 1_000_000)
    results = {}
    for backend in (b for b in args.backends if b != "sqlite"):
        with h.throwaway_engine(backend) as engine:
            results[backend] = {k: measure(engine, backend, k, rows, args.batch) for k in KEYS}
        h.log(markdown({backend: results[backend]}, rows))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{NAME}.md").write_text(markdown(results, rows))
    panels = {"pk_index_bytes": "primary-key index",
              "secondary_index_bytes": "index on n (carries the PK on InnoDB)",
              "total_bytes": "table + indexes"}
    fig, axes = h.figure(len(panels), f"Why tickets: {rows:,} rows per key type (lower is "
                         "better)", args.env, "ids in creation order, Core executemany")
    for ax, (key, label) in zip(axes, panels.items(), strict=True):
        h.value_panel(ax, {f"{h.LABELS[b]}: {k}": r[key] / MIB for b, ks in results.items()
                           for k, r in ks.items()}, label, "MiB")
    return h.report(args, NAME, results, figure=fig,
                    parameters={"rows": rows, "batch": args.batch})


if __name__ == "__main__":
    raise SystemExit(main())
