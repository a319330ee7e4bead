"""Why tickets: primary-key index size, table size and insert time by key type.

PostgreSQL and MariaDB; one table per key type, ``(id <key> PRIMARY KEY, n BIGINT)`` plus a
secondary index on ``n`` (InnoDB secondary indexes carry the primary key, so they grow with it):

* ``TicketId``   BIGINT, ids pre-made with ``TicketServer(url).next_block("bench", rows)``
* ``SnowflakeId`` BIGINT
* ``UUID7``      ``sa.Uuid``: native UUID (16 bytes) on both servers (MariaDB >= 10.7)
* ``UUIDv4``     ``sa.Uuid`` with ``uuid.uuid4()`` — random order
* ``PrefixedId`` VARCHAR(31) ``post_…`` (COLLATE "C" / ascii_bin)

Ids are made before the clock starts, in creation order, then inserted in batches of
``--batch`` rows, one Core executemany and one commit per batch, one process; only the inserts
are timed. Sizes after ``VACUUM ANALYZE`` (PostgreSQL: ``pg_relation_size`` of heap and each
index) and ``ANALYZE TABLE`` (MariaDB: ``mysql.innodb_index_stats`` pages x page size; InnoDB's
PRIMARY is the clustered index, i.e. the table itself).

    .venv/bin/python benchmarks/bench_index_size.py [--rows 1000000] [--quick]
        [--backends postgresql,mysql] [--batch 10000]

Writes ``results/bench_index_size.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from _common import RESULTS_DIR, environment, load_text, log, parse_args, redact, server_info
from _common import throwaway_database as _throwaway

from sqlalchemy_tickets import TicketId, TicketServer
from sqlalchemy_tickets.app_types import UUID7, PrefixedId, SnowflakeId

NAME = "bench_index_size"
KEYS = ("TicketId", "SnowflakeId", "UUID7", "UUIDv4", "PrefixedId")
KEY_BYTES = {"TicketId": 8, "SnowflakeId": 8, "UUID7": 16, "UUIDv4": 16, "PrefixedId": 31}
SERVER_BACKENDS = ("postgresql", "mysql")
LABEL = {"postgresql": "PostgreSQL", "mysql": "MariaDB"}


def _column_type(key: str) -> Any:
    return {
        "TicketId": TicketId("bench"),
        "SnowflakeId": SnowflakeId(worker_id=1),
        "UUID7": UUID7(),
        "UUIDv4": sa.Uuid(),
        "PrefixedId": PrefixedId("post"),
    }[key]


def make_ids(key: str, url: sa.URL, rows: int) -> list[Any]:
    if key == "TicketId":
        server = TicketServer(url)
        try:
            return list(server.next_block("bench", rows))
        finally:
            server.dispose()
    if key == "UUIDv4":
        return [uuid.uuid4() for _ in range(rows)]
    new_id: Callable[[], Any] = _column_type(key).new_id
    return [new_id() for _ in range(rows)]


def table_for(key: str, metadata: sa.MetaData) -> sa.Table:
    name = f"bench_{key.lower()}"
    return sa.Table(
        name,
        metadata,
        sa.Column("id", _column_type(key), primary_key=True, autoincrement=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        sa.Index(f"ix_{name}_n", "n"),
    )


def insert(engine: sa.Engine, table: sa.Table, ids: list[Any], batch: int) -> float:
    elapsed = 0.0
    for start in range(0, len(ids), batch):
        rows = [{"id": value, "n": start + k} for k, value in enumerate(ids[start : start + batch])]
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(table.insert(), rows)
        elapsed += time.perf_counter() - t0
    return elapsed


def sizes_postgresql(engine: sa.Engine, table: sa.Table) -> dict[str, int]:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"VACUUM ANALYZE {table.name}")
        row = conn.execute(
            sa.text(
                "SELECT pg_relation_size(:t), pg_relation_size(:pk), pg_relation_size(:ix), "
                "pg_total_relation_size(:t), pg_indexes_size(:t)"
            ),
            {"t": table.name, "pk": f"{table.name}_pkey", "ix": f"ix_{table.name}_n"},
        ).one()
    return {
        "table_bytes": int(row[0]),
        "pk_index_bytes": int(row[1]),
        "secondary_index_bytes": int(row[2]),
        "total_bytes": int(row[3]),
        "all_indexes_bytes": int(row[4]),
    }


def sizes_mysql(engine: sa.Engine, table: sa.Table) -> dict[str, int]:
    with engine.connect() as conn:
        conn.exec_driver_sql(f"ANALYZE TABLE {table.name}").all()
        page = int(conn.exec_driver_sql("SELECT @@innodb_page_size").scalar_one())
        stats = dict(
            conn.execute(
                sa.text(
                    "SELECT index_name, stat_value FROM mysql.innodb_index_stats "
                    "WHERE database_name = DATABASE() AND table_name = :t AND stat_name = 'size'"
                ),
                {"t": table.name},
            ).all()
        )
        data, index = conn.execute(
            sa.text(
                "SELECT data_length, index_length FROM information_schema.TABLES "
                "WHERE table_schema = DATABASE() AND table_name = :t"
            ),
            {"t": table.name},
        ).one()
    return {
        "table_bytes": int(data),
        "pk_index_bytes": int(stats["PRIMARY"]) * page,  # clustered: the table itself
        "secondary_index_bytes": int(stats[f"ix_{table.name}_n"]) * page,
        "total_bytes": int(data) + int(index),
        "all_indexes_bytes": int(index),
    }


SIZES = {"postgresql": sizes_postgresql, "mysql": sizes_mysql}


def run_backend(backend: str, rows: int, batch: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with _throwaway(backend) as url:
        info = server_info(backend, url)
        log(f"{backend}: {redact(url)} ({str(info.get('version', ''))[:60]})")
        engine = sa.create_engine(url)
        try:
            metadata = sa.MetaData()
            tables = {key: table_for(key, metadata) for key in KEYS}
            metadata.create_all(engine)
            for key in KEYS:
                t0 = time.perf_counter()
                ids = make_ids(key, url, rows)
                made = time.perf_counter() - t0
                seconds = insert(engine, tables[key], ids, batch)
                del ids
                sizes = SIZES[backend](engine, tables[key])
                results[key] = {
                    "insert_seconds": seconds,
                    "rows_per_second": rows / seconds,
                    "id_generation_seconds": made,
                    **sizes,
                }
                log(
                    f"  {key:12s} insert {seconds:6.1f} s ({rows / seconds:,.0f} rows/s)  "
                    f"pk {sizes['pk_index_bytes'] / 2**20:7.1f} MiB  "
                    f"secondary {sizes['secondary_index_bytes'] / 2**20:6.1f} MiB  "
                    f"total {sizes['total_bytes'] / 2**20:7.1f} MiB"
                )
                with engine.begin() as conn:  # free the space before the next key type
                    conn.execute(sa.delete(tables[key]))
        finally:
            engine.dispose()
    return {"server": info, "keys": results}


def markdown(results: dict[str, Any], rows: int) -> str:
    lines = [
        f"Index size by key type, {rows:,} rows `(id PK, n BIGINT, INDEX(n))`, "
        "ids inserted in creation order (batches via Core executemany, one process).",
        "",
        "| backend | key | key bytes | PK index MiB | index on n MiB | table MiB | "
        "total MiB | insert s | rows/s | PK index vs TicketId |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for backend, result in results.items():
        base = result["keys"]["TicketId"]["pk_index_bytes"]
        for key, r in result["keys"].items():
            lines.append(
                f"| {LABEL[backend]} | {key} | {KEY_BYTES[key]} | "
                f"{r['pk_index_bytes'] / 2**20:.1f} | {r['secondary_index_bytes'] / 2**20:.1f} | "
                f"{r['table_bytes'] / 2**20:.1f} | {r['total_bytes'] / 2**20:.1f} | "
                f"{r['insert_seconds']:.1f} | {r['rows_per_second']:,.0f} | "
                f"{r['pk_index_bytes'] / base:.2f}x |"
            )
    lines += [
        "",
        "PostgreSQL: PK index = `pg_relation_size(<table>_pkey)`, table = heap; MariaDB (InnoDB): "
        "PK index = PRIMARY, the clustered index holding the rows (so it is the table), and "
        "every secondary index stores the primary key of each row.",
    ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], rows: int, env: dict[str, Any]) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("pk_index_bytes", "primary-key index (MiB)", 2**20),
        ("secondary_index_bytes", "index on n (MiB) — carries the PK on InnoDB", 2**20),
        ("total_bytes", "table + indexes (MiB)", 2**20),
        ("insert_seconds", "insert time (s)", 1),
    ]
    fig, axes = plt.subplots(1, len(panels), figsize=(17, 4.8))
    colors = plt.get_cmap("tab10").colors
    backends = list(results)
    width = 0.8 / len(KEYS)
    for ax, (field, title, scale) in zip(axes, panels, strict=True):
        for j, key in enumerate(KEYS):
            xs = [i + (j - (len(KEYS) - 1) / 2) * width for i in range(len(backends))]
            ys = [results[b]["keys"][key][field] / scale for b in backends]
            ax.bar(xs, ys, width * 0.9, label=key, color=colors[j])
            for x, y in zip(xs, ys, strict=True):
                ax.annotate(
                    f"{y:.0f}",
                    (x, y),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(0, 2),
                )
        ax.set_xticks(range(len(backends)), [LABEL[b] for b in backends])
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"Why tickets: {rows:,} rows per key type (lower is better)", fontsize=12)
    fig.text(
        0.01,
        0.01,
        f"batches via Core executemany, ids in creation order; {load_text(env)}",
        fontsize=7.5,
        color="dimgray",
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.94))
    path = RESULTS_DIR / f"{NAME}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=None, help="rows per key type (1,000,000)")
    parser.add_argument("--batch", type=int, default=10_000, help="rows per executemany")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__.split("\n\n")[0], argv, extra=_extra)
    rows = args.rows or (20_000 if args.quick else 1_000_000)
    backends = [b for b in args.backends if b in SERVER_BACKENDS]
    if not backends:
        log("nothing to do: --backends must include postgresql and/or mysql")
        return 2
    env = environment()
    started = time.perf_counter()
    results = {backend: run_backend(backend, rows, args.batch) for backend in backends}
    wall = time.perf_counter() - started
    table = markdown(results, rows)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / f"{NAME}.md").write_text(table)
    from _common import write_json

    json_path = write_json(
        NAME,
        {
            "benchmark": NAME,
            "description": __doc__,
            "environment": env,
            "parameters": {"rows": rows, "batch": args.batch, "backends": backends},
            "wall_seconds": wall,
            "backends": results,
        },
    )
    png = plot(results, rows, env)
    log("")
    log(table)
    log(f"wall time {wall:.0f} s; wrote {json_path}, {RESULTS_DIR / (NAME + '.md')} and {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
