"""Sharding by ticket id with SQLAlchemy's ``ShardedSession``, and moving a user's rows.

Users and their posts live on several shard databases. Their keys come from one ticket source
(a pair of ticket servers, odd and even, behind a ``CachedSource``) in databases of their own, so
a key is unique on every shard. A new user is placed on shard ``id % N`` (the id is on the object
before the shard chooser runs); the placement is written to a directory table (user id → shard)
in another database, and from then on every chooser asks the directory. Then the shards are
rebalanced: a few users move, with their posts, to another shard keeping their keys; they are
found again through the directory, where ``id % N`` would look on the wrong shard.

    python examples/sharding/app.py                      # SQLite files in a temporary directory
    python examples/sharding/app.py \\
        --shards postgresql+psycopg://postgres@127.0.0.1/s0 mysql+pymysql://root@127.0.0.1/s1 \\
                 postgresql+psycopg://postgres@127.0.0.1/s2 \\
        --tickets mysql+pymysql://root@127.0.0.1/odd mysql+pymysql://root@127.0.0.1/even \\
        --directory postgresql+psycopg://postgres@127.0.0.1/directory

The databases must exist. The tables ``users``, ``posts`` (on the shards) and ``directory`` are
dropped and created again; the ticket servers' tables are created on first use and kept.
Writes ``sharding_example.json`` and, with matplotlib installed, ``sharding_example.png`` to
``--out`` (default: ``benchmarks/results/``). Exits with 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.horizontal_shard import ShardedSession
from sqlalchemy.orm import (
    DeclarativeBase,
    Mapped,
    Mapper,
    ORMExecuteState,
    mapped_column,
    relationship,
)
from sqlalchemy.sql import operators, visitors

from sqlalchemy_tickets import CachedSource, TicketId, TicketServers, TicketSource, configure

#: Where the figures go by default, beside the benchmarks' (the docs serve the plots from there).
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


class Base(DeclarativeBase):
    pass


class User(Base):
    __tablename__ = "users"
    id: Mapped[int] = mapped_column(TicketId("users"), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(50))
    posts: Mapped[list[Post]] = relationship(back_populates="user", order_by="Post.id")


class Post(Base):
    __tablename__ = "posts"
    id: Mapped[int] = mapped_column(TicketId("posts"), primary_key=True)
    # A user's posts live on the user's shard, so the foreign key holds within each shard.
    user_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("users.id"), index=True)
    title: Mapped[str] = mapped_column(sa.String(100))
    user: Mapped[User] = relationship(back_populates="posts")


users = cast(sa.Table, User.__table__)
posts = cast(sa.Table, Post.__table__)

directory_metadata = sa.MetaData()
directory_table = sa.Table(
    "directory",
    directory_metadata,
    sa.Column("user_id", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("shard", sa.String(50), nullable=False),
)


class Directory:
    """Where each user's rows are: user id → shard, in a database apart from the shards.

    Every chooser asks it, every time: a cache in one process would go on sending a moved user's
    rows to the old shard while another process moved them.
    """

    def __init__(self, url: str) -> None:
        self.engine = sa.create_engine(url)
        directory_metadata.drop_all(self.engine)
        directory_metadata.create_all(self.engine)
        self._lock = threading.Lock()
        self.lookups = 0

    def shard_of(self, user_id: int) -> str | None:
        with self._lock:
            self.lookups += 1
        with self.engine.connect() as conn:
            shard: str | None = conn.scalar(
                sa.select(directory_table.c.shard).where(directory_table.c.user_id == user_id)
            )
        return shard

    def place(self, user_id: int, shard: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.insert(directory_table).values(user_id=user_id, shard=shard))

    def move(self, user_id: int, shard: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(directory_table)
                .where(directory_table.c.user_id == user_id)
                .values(shard=shard)
            )

    def dispose(self) -> None:
        self.engine.dispose()


class Choosers:
    """The three functions ``ShardedSession`` asks, all answering from the directory."""

    def __init__(self, names: Sequence[str], directory: Directory) -> None:
        self.names = list(names)
        self.directory = directory
        self._lock = threading.Lock()
        #: Statements sent to one shard (the directory named it) and to every shard.
        self.to_one = 0
        self.to_all = 0

    def initial_shard(self, user_id: int) -> str:
        """Where a new user goes: ``id % N``. Only the directory remembers it afterwards."""
        return self.names[user_id % len(self.names)]

    def shard_chooser(self, mapper: Mapper[Any] | None, instance: Any, clause: Any = None) -> str:
        if isinstance(instance, User):
            # The ticket id was given in before_flush: it is already there.
            shard = self.directory.shard_of(instance.id)
            if shard is None:
                shard = self.initial_shard(instance.id)
                # Written before the user's row; should that flush fail, the entry points at
                # nothing, which is harmless: the id is never issued again.
                self.directory.place(instance.id, shard)
            return shard
        if isinstance(instance, Post):
            user_id = instance.user_id if instance.user_id is not None else instance.user.id
            shard = self.directory.shard_of(user_id)
            if shard is None:
                raise LookupError(f"user {user_id} is in no shard: save the user first")
            return shard
        raise LookupError(f"no shard for {mapper} without an instance: use set_shard_id()")

    def identity_chooser(
        self,
        mapper: Mapper[Any],
        primary_key: Sequence[Any],
        *,
        lazy_loaded_from: Any = None,
        **kw: Any,
    ) -> list[str]:
        if lazy_loaded_from is not None:
            return [lazy_loaded_from.identity_token]
        if mapper.class_ is User:
            shard = self.directory.shard_of(primary_key[0])
            return [shard] if shard is not None else []
        return self.names  # a post's own id says nothing of its shard: look everywhere

    def execute_chooser(self, context: ORMExecuteState) -> list[str]:
        """One shard for a statement about one user (``users.id = x``, ``posts.user_id = x``,
        including ``session.get(User, x)``); every shard otherwise."""
        user_ids = set(_user_ids_compared(context))
        if not user_ids:
            with self._lock:
                self.to_all += 1
            return self.names
        found = {self.directory.shard_of(user_id) for user_id in user_ids}
        with self._lock:
            self.to_one += len(found) == 1
        return [name for name in self.names if name in found]


def _user_ids_compared(context: ORMExecuteState) -> Iterable[int]:
    """The values a statement's WHERE clause compares ``users.id`` or ``posts.user_id`` to."""
    where = getattr(context.statement, "whereclause", None)
    if where is None:
        return
    for element in visitors.iterate(where):
        if not isinstance(element, sa.BinaryExpression) or element.operator is not operators.eq:
            continue
        column, value = element.left, element.right
        if isinstance(column, sa.BindParameter):
            column, value = value, column
        if not isinstance(value, sa.BindParameter) or not isinstance(column, sa.ColumnElement):
            continue
        if not (column.shares_lineage(users.c.id) or column.shares_lineage(posts.c.user_id)):
            continue
        # session.get() passes the key as a parameter of the execution, not in the statement.
        found = value.effective_value
        if found is None and isinstance(context.parameters, dict):
            found = context.parameters.get(value.key)
        if isinstance(found, int):
            yield found


def rows_per_shard(engines: dict[str, sa.Engine]) -> dict[str, int]:
    """Users and posts stored on each shard."""
    counts = {}
    for name, engine in engines.items():
        with engine.connect() as conn:
            counts[name] = sum(
                conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0
                for table in (users, posts)
            )
    return counts


def rows_of_users(engines: dict[str, sa.Engine]) -> dict[str, dict[int, int]]:
    """Per shard: user id → rows of that user (the user and their posts)."""
    found: dict[str, dict[int, int]] = {}
    for name, engine in engines.items():
        with engine.connect() as conn:
            own = {user_id: 1 for user_id in conn.scalars(sa.select(users.c.id))}
            for user_id, count in conn.execute(
                sa.select(posts.c.user_id, sa.func.count()).group_by(posts.c.user_id)
            ):
                own[user_id] += count
        found[name] = own
    return found


def move_user(user_id: int, source: sa.Engine, target: sa.Engine, directory: Directory,
              target_name: str) -> int:
    """Copy a user and their posts to ``target`` with the same keys, switch the directory,
    delete the old rows. Returns the rows moved.

    In production the owner's writes pause (or go to both shards) between the copy and the
    switch; here nothing else writes meanwhile.
    """
    with source.connect() as conn:
        user_rows = [
            dict(r._mapping) for r in conn.execute(users.select().where(users.c.id == user_id))
        ]
        post_rows = [
            dict(r._mapping) for r in conn.execute(posts.select().where(posts.c.user_id == user_id))
        ]
    with target.begin() as conn:
        # The keys are kept: from one ticket source, none can already be on the target shard
        # (a collision would fail this insert on the primary key).
        conn.execute(sa.insert(users), user_rows)
        if post_rows:
            conn.execute(sa.insert(posts), post_rows)
    directory.move(user_id, target_name)
    with source.begin() as conn:
        conn.execute(posts.delete().where(posts.c.user_id == user_id))
        conn.execute(users.delete().where(users.c.id == user_id))
    return len(user_rows) + len(post_rows)


def plan_moves(per_user: dict[str, dict[int, int]], limit: int) -> list[tuple[int, str, str]]:
    """Greedy rebalancing: move a user from the fullest shard to the emptiest while it narrows
    the gap (at least one move, so the example always shows one)."""
    load = {name: sum(own.values()) for name, own in per_user.items()}
    where = {user_id: name for name, own in per_user.items() for user_id in own}
    size = {user_id: rows for own in per_user.values() for user_id, rows in own.items()}
    moves: list[tuple[int, str, str]] = []
    while len(moves) < limit:
        full = max(load, key=lambda name: load[name])
        empty = min(load, key=lambda name: load[name])
        gap = load[full] - load[empty]
        candidates = [u for u, name in where.items() if name == full]
        if full == empty or not candidates:
            break
        # The user whose rows come closest to halving the gap.
        best = min(candidates, key=lambda u: abs(gap - 2 * size[u]))
        if moves and abs(gap - 2 * size[best]) >= gap:
            break
        moves.append((best, full, empty))
        load[full] -= size[best]
        load[empty] += size[best]
        where[best] = empty
    return moves


def server_of(ticket_id: int, servers: int) -> int:
    """Which of ``servers`` ticket servers issued ``ticket_id`` (1-based: ≡ i mod servers)."""
    return (ticket_id - 1) % servers + 1


def plot(before: dict[str, int], after: dict[str, int], labels: dict[str, str], moved: int,
         path: Path) -> bool:
    """Rows per shard before and after the moves; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    names = list(before)
    width = 0.38
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = range(len(names))
    ax.bar([x - width / 2 for x in xs], [before[n] for n in names], width, label="before")
    ax.bar([x + width / 2 for x in xs], [after[n] for n in names], width,
           label=f"after moving {moved} user{'s' if moved != 1 else ''}")
    ax.set_xticks(list(xs), [f"{n}\n{labels[n]}" for n in names])
    ax.set_ylabel("rows (users + posts)")
    ax.set_title("Rows per shard: placed by id % N, rebalanced through the directory")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


@dataclass
class Move:
    user_id: int
    source: str
    target: str
    rows: int


class CheckFailed(Exception):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    shard_urls: list[str] = args.shards or [
        f"sqlite:///{workdir / f'shard{n}.db'}" for n in range(args.shard_count)
    ]
    ticket_urls: list[str] = args.tickets or [
        f"sqlite:///{workdir / name}.db" for name in ("tickets_odd", "tickets_even")
    ]
    directory_url: str = args.directory or f"sqlite:///{workdir / 'directory.db'}"
    names = [f"shard{n}" for n in range(len(shard_urls))]
    engines = {name: sa.create_engine(url) for name, url in zip(names, shard_urls, strict=True)}
    labels = {name: engine.dialect.name for name, engine in engines.items()}
    for engine in engines.values():
        Base.metadata.drop_all(engine)
        Base.metadata.create_all(engine)
    directory = Directory(directory_url)
    # One source for every shard: server i of k issues ids ≡ i (mod k), Flickr's odd/even.
    # Uncached, each flush takes its block from the next server in turn, so every server's
    # ids show up; CachedSource(servers), the usual choice, takes larger blocks, less often.
    servers = TicketServers(ticket_urls)
    source: TicketSource = CachedSource(servers) if args.cached else servers
    configure(source)
    choosers = Choosers(names, directory)
    stride = len(ticket_urls)
    try:
        return _scenario(args, engines, labels, directory, choosers, servers, stride)
    finally:
        configure(None)
        if isinstance(source, CachedSource):
            source.close()
        servers.close()
        directory.dispose()
        for engine in engines.values():
            engine.dispose()


def _scenario(args: argparse.Namespace, engines: dict[str, sa.Engine], labels: dict[str, str],
              directory: Directory, choosers: Choosers, servers: TicketServers,
              stride: int) -> dict[str, Any]:
    names = list(engines)
    n = len(names)

    def session() -> ShardedSession:
        return ShardedSession(
            shards=engines,
            shard_chooser=choosers.shard_chooser,
            identity_chooser=choosers.identity_chooser,
            execute_chooser=choosers.execute_chooser,
        )

    print(f"{n} shards ({', '.join(f'{k}: {v}' for k, v in labels.items())}), "
          f"{stride} ticket server(s), directory on {directory.engine.dialect.name}")
    common = math.gcd(n, stride)
    for server in range(1, stride + 1):
        fed = sorted({choosers.names[(server + stride * j) % n] for j in range(n)})
        print(f"  placement id % {n}: ticket server {server} (ids ≡ {server % stride} "
              f"mod {stride}) feeds {', '.join(fed)}")
    if common > 1:
        print(f"WARNING: {n} shards and a stride of {stride} share the factor {common}: each "
              f"shard gets new users from one ticket server only; losing that server stops "
              f"new users on its shards")

    # Users sign up a few at a time: the chooser places each by its ticket id, then posts
    # follow their user.
    rng = random.Random(args.seed)
    user_ids: list[int] = []
    for first in range(0, args.users, 3):
        with session() as s:
            people = [User(name=f"user{k}") for k in range(first, min(first + 3, args.users))]
            s.add_all(people)
            s.commit()
            user_ids += [u.id for u in people]
    placed_by_server: dict[int, set[str]] = {}
    for user_id in user_ids:
        placed_by_server.setdefault(server_of(user_id, stride), set()).add(
            choosers.initial_shard(user_id)
        )
    writes = {user_id: min(args.max_posts, int(rng.paretovariate(1.1))) for user_id in user_ids}
    with session() as s:
        for user_id, count in writes.items():
            s.add_all(Post(user_id=user_id, title=f"post {k} of {user_id}") for k in range(count))
        s.commit()
    before = rows_per_shard(engines)
    print("rows per shard before:", before)

    # Rebalance: move whole users (their row and their posts) with their keys.
    moves = plan_moves(rows_of_users(engines), args.moves)
    moved: list[Move] = []
    for user_id, old, new in moves:
        rows = move_user(user_id, engines[old], engines[new], directory, new)
        moved.append(Move(user_id, old, new, rows))
        print(f"moved user {user_id} ({rows} rows) from {old} to {new}, same keys")
    after_move = rows_per_shard(engines)
    check(sum(after_move.values()) == sum(before.values()), "rows lost or doubled by the moves")

    # Found again through the directory; id % N would look on the old shard.
    lookups_before = directory.lookups
    to_one_before, to_all_before = choosers.to_one, choosers.to_all
    missed_by_id_rule = 0
    more_posts = 3
    for move in moved:
        user_id, new = move.user_id, move.target
        with session() as s:
            user = s.get(User, user_id)
            check(user is not None, f"user {user_id} not found after the move")
            assert user is not None
            token = sa.inspect(user).identity_token
            check(token == new, f"user {user_id} loaded from {token}, not {new}")
            check(len(user.posts) == move.rows - 1, f"posts of user {user_id} not found")
            listed = s.scalars(sa.select(Post).where(Post.user_id == user_id)).all()
            check(len(listed) == move.rows - 1, f"query for user {user_id}'s posts missed")
            check({sa.inspect(p).identity_token for p in listed} <= {new}, "posts on old shard")
            # New writes for a moved user go to the new shard too.
            s.add_all(Post(user_id=user_id, title=f"after the move {k}") for k in range(more_posts))
            s.commit()
        with engines[new].connect() as conn:
            stored = conn.scalar(sa.select(sa.func.count()).where(posts.c.user_id == user_id))
        check(stored == move.rows - 1 + more_posts, f"new posts of {user_id} not on {new}")
        rule = choosers.initial_shard(user_id)
        if rule != new:
            with engines[rule].connect() as conn:
                if conn.scalar(sa.select(users.c.id).where(users.c.id == user_id)) is None:
                    missed_by_id_rule += 1
    lookups = directory.lookups - lookups_before
    to_one = choosers.to_one - to_one_before
    check(lookups > 0, "the directory was not consulted")
    check(to_one >= 2 * len(moved) and choosers.to_all == to_all_before,
          "a statement about one user went to every shard")
    print(f"found {len(moved)} moved user(s) and their posts through the directory "
          f"({lookups} lookups, {to_one} statements each sent to the one shard it names); "
          f"id % {n} would have missed {missed_by_id_rule}")

    # No key is on two shards, and no key repeats within a table.
    keys: dict[str, Counter[int]] = {"users": Counter(), "posts": Counter()}
    for engine in engines.values():
        with engine.connect() as conn:
            keys["users"].update(conn.scalars(sa.select(users.c.id)))
            keys["posts"].update(conn.scalars(sa.select(posts.c.id)))
    duplicates = sum(c - 1 for counter in keys.values() for c in counter.values() if c > 1)
    check(duplicates == 0, f"{duplicates} keys on more than one shard")
    total = sum(keys["users"].values()) + sum(keys["posts"].values())
    check(total == sum(before.values()) + more_posts * len(moved), "rows lost")
    after = rows_per_shard(engines)
    print("rows per shard after:", after)
    print(f"{total} rows, {len(keys['users']) + len(keys['posts'])} distinct keys: "
          f"no key collision")
    round_trips = sum(server.stats()["round_trips"] for server in servers.servers)
    return {
        "shards": {name: labels[name] for name in names},
        "ticket_servers": stride,
        "placement": f"id % {n}",
        "shared_factor": common,
        "server_feeds_shards": {str(k): sorted(v) for k, v in sorted(placed_by_server.items())},
        "users": len(user_ids),
        "rows_before": before,
        "rows_after_moves": after_move,
        "rows_after": after,
        "moved": [asdict(move) for move in moved],
        "found_after_move": True,
        "directory_lookups": directory.lookups,
        "directory_lookups_after_move": lookups,
        "statements_to_one_shard_after_move": to_one,
        "missed_by_id_mod_n": missed_by_id_rule,
        "duplicate_keys": duplicates,
        "rows": total,
        "ticket_round_trips": round_trips,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", nargs="+", metavar="URL",
                        help="shard databases (default: 3 SQLite files in a temporary directory)")
    parser.add_argument("--tickets", nargs="+", metavar="URL",
                        help="ticket server databases, server i issuing ids ≡ i mod their "
                             "number (default: 2 SQLite files, odd and even)")
    parser.add_argument("--shard-count", type=int, default=3,
                        help="SQLite shards to make when --shards is not given")
    parser.add_argument("--directory", metavar="URL", help="the directory's database")
    parser.add_argument("--cached", action="store_true",
                        help="draw ids through CachedSource(TicketServers(...))")
    parser.add_argument("--users", type=int, default=30)
    parser.add_argument("--max-posts", type=int, default=40, help="posts of the busiest user")
    parser.add_argument("--moves", type=int, default=4, help="users moved at most")
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where sharding_example.json and .png go (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.shards is None and args.shard_count < 1:
        parser.error("--shard-count must be at least 1")
    with tempfile.TemporaryDirectory(prefix="tickets-sharding-") as tmp:
        try:
            result = run(args, Path(tmp))
        except CheckFailed as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sharding_example.json").write_text(json.dumps(result, indent=2) + "\n")
    png = args.out / "sharding_example.png"
    if plot(result["rows_before"], result["rows_after_moves"], result["shards"],
            len(result["moved"]), png):
        print(f"wrote {png}")
    else:
        print("matplotlib is not installed: no plot")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
