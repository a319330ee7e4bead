"""The console script, run as a user runs it: a real process, real databases."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlalchemy_tickets import DatacenterTier, TicketServer, TicketServers
from sqlalchemy_tickets.cli import BLOCK, MAX_COUNT, _duration
from sqlalchemy_tickets.sources.datacenter import TierStatus, describe_datacenter
from support.cli import ENV, SCRIPT, run
from support.proxy import TcpProxy
from support.tables import drop_ticket_tables_one_by_one, ticket_tables


def error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The one line a failure prints (asserting there is exactly one, and no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


def describe(url: str, sequence: str | None, bits: int = 64) -> tuple[int, int, int | None]:
    server = TicketServer(url, create_missing=False)
    try:
        info = server.describe(sequence, bits=bits)
    finally:
        server.close()
    assert info is not None
    return info.increment, info.offset, info.last_id


def test_demo_runs_on_sqlite_in_the_current_directory(tmp_path: Path) -> None:
    first = run("demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "flush                           -> ids [1, 2, 3, 4, 5]" in first.stdout
    assert "second flush, same transaction  -> ids [6, 7, 8]" in first.stdout
    assert "Core executemany of 1000 rows   -> ids 10..1009" in first.stdout
    assert (tmp_path / "tickets-demo.db").exists()
    assert (tmp_path / "tickets-demo.db-tickets").exists()
    second = run("demo", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "ids [1, 2, 3, 4, 5]" not in second.stdout  # the sequence carried on


def test_python_dash_m_is_the_same_command(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sqlalchemy_tickets", "--version"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0 and result.stdout.startswith("sqlalchemy-tickets ")


def test_init_then_next(make_database, backend: str) -> None:
    url = make_database(backend)
    init = run("init", "--url", url, "Photos", "Accounts")
    assert init.returncode == 0, init.stderr
    assert "Photos: ready (increment 1, offset 1)" in init.stdout
    out = run("next", "--url", url, "photos", "--count", "3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "2", "3"]
    assert run("next", "--url", url, "Photos").stdout.split() == ["4"]
    assert run("next", "--url", url, "accounts").stdout.split() == ["1"]


def test_init_with_a_stride(make_database) -> None:
    url = make_database("postgresql")
    assert run("init", "--url", url, "photos", "--increment", "2", "--offset", "2").returncode == 0
    assert run("next", "--url", url, "photos", "--count", "3").stdout.split() == ["2", "4", "6"]


def test_flickr_tables_by_default(make_database) -> None:
    url = make_database("mysql")
    assert run("init", "--url", url).returncode == 0
    assert run("init", "--url", url, "--bits", "32").returncode == 0
    assert run("next", "--url", url, "--count", "2").stdout.split() == ["1", "2"]
    assert run("next", "--url", url, "--bits", "32").stdout.split() == ["1"]


# -- init with several servers ---------------------------------------------------------------------


def test_init_several_servers_gives_each_its_position(make_database, backend: str) -> None:
    a, b = make_database(backend), make_database(backend)
    result = run("init", "--url", a, "--url", b, "Photos", "Accounts")
    assert result.returncode == 0, result.stderr
    assert describe(a, "photos")[:2] == (2, 1)
    assert describe(b, "photos")[:2] == (2, 2)
    assert describe(b, "accounts")[:2] == (2, 2)
    assert "Photos: ready (increment 2, offset 2)" in result.stdout

    # The pair init made is the pair TicketServers wants: each checked against its position.
    pair = TicketServers([a, b])
    try:
        ids = [pair.next_id("Photos") for _ in range(6)]
    finally:
        pair.close()
    assert sorted(ids) == [1, 2, 3, 4, 5, 6]

    # Run again, same list: nothing to change, nothing refused.
    again = run("init", "--url", a, "--url", b, "Photos")
    assert again.returncode == 0, again.stderr
    # next over the pair: still each server on its own residue.
    drawn = run("next", "--url", a, "--url", b, "photos", "--count", "4")
    assert drawn.returncode == 0, drawn.stderr


def test_init_several_servers_overridden_by_flags(make_database) -> None:
    a, b = make_database("postgresql"), make_database("postgresql")
    # Two of three planned servers: increment 3, offsets 1 and 2 ...
    result = run("init", "--url", a, "--url", b, "photos", "--increment", "3")
    assert result.returncode == 0, result.stderr
    assert describe(a, "photos")[:2] == (3, 1) and describe(b, "photos")[:2] == (3, 2)
    # ... or explicit offsets, once per --url.
    c, d = make_database("postgresql"), make_database("postgresql")
    result = run("init", "--url", c, "--url", d, "photos", "--increment", "3",
                 "--offset", "3", "--offset", "1")
    assert result.returncode == 0, result.stderr
    assert describe(c, "photos")[:2] == (3, 3) and describe(d, "photos")[:2] == (3, 1)


def test_init_refuses_an_existing_table_with_another_stride(make_database, backend: str) -> None:
    a, b = make_database(backend), make_database(backend)
    assert run("init", "--url", a, "photos").returncode == 0
    assert run("next", "--url", a, "photos", "--count", "5").returncode == 0
    before = describe(a, "photos")
    assert before == (1, 1, 5)

    refused = run("init", "--url", a, "photos", "--increment", "2", "--offset", "2")
    assert refused.returncode == 1
    line = error_line(refused)
    assert "increment 1, offset 1" in line and "restride" in line
    assert describe(a, "photos") == before

    # With several servers: nothing is created anywhere when one table disagrees.
    refused = run("init", "--url", a, "--url", b, "photos")
    assert refused.returncode == 1 and "restride" in error_line(refused)
    assert describe(a, "photos") == before
    with pytest.raises(Exception, match="no ticket table"):
        describe(b, "photos")

    # Asked for nothing: the existing table is taken as it is.
    kept = run("init", "--url", a, "photos")
    assert kept.returncode == 0 and "(increment 1, offset 1)" in kept.stdout


# -- init with many sequences --------------------------------------------------------------------

MANY = [f"seq{i:03d}" for i in range(200)]


def _names_file(path: Path, names: list[str]) -> Path:
    """``names`` one per line, between comments, blank lines and a repeat in another case."""
    lines = ["# sequences of the app", ""]
    for i, name in enumerate(names):
        lines.append(f"{name}   # the {i}th" if i % 50 == 0 else name)
        if i % 40 == 0:
            lines += ["", "   # an indented comment", name.upper()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_init_many_sequences_from_a_file_and_the_command_line(
    make_database, backend: str, tmp_path: Path
) -> None:
    url = make_database(backend)
    names_file = _names_file(tmp_path / "names.txt", MANY)
    result = run("init", "--url", url, "Photos", "--from-file", str(names_file))
    assert result.returncode == 0, result.stderr
    shown = _shown_url(url)
    # One line per sequence, repeats once, in order: the names on the command line first.
    assert result.stdout.splitlines() == [
        f"{name}: ready (increment 1, offset 1) on {shown}" for name in ["Photos", *MANY]
    ]
    assert len(ticket_tables(url)) == 201
    assert run("next", "--url", url, MANY[-1]).stdout.split() == ["1"]

    again = run("init", "--url", url, "Photos", "--from-file", str(names_file))
    assert again.returncode == 0, again.stderr
    assert again.stdout == result.stdout  # existing tables described, left as they are
    assert run("next", "--url", url, MANY[-1]).stdout.split() == ["2"]
    drop_ticket_tables_one_by_one(url)


def test_init_from_standard_input(make_database, tmp_path: Path) -> None:
    url = make_database("sqlite")
    piped = subprocess.run(
        [SCRIPT, "init", "--url", url, "--from-file", "-"], input="# two\nphotos\n\nusers\n",
        capture_output=True, text=True, timeout=120, env=ENV, check=False,
    )
    assert piped.returncode == 0, piped.stderr
    assert [line.split(":")[0] for line in piped.stdout.splitlines()] == ["photos", "users"]


def _bad_name_files(tmp_path: Path) -> list[tuple[str, str]]:
    """``(path, what the error line says)`` for files ``--from-file`` refuses."""
    bad = tmp_path / "bad.txt"
    bad.write_text("photos\n# fine so far\nbad-name\nusers\n", encoding="utf-8")
    long = tmp_path / "long.txt"
    long.write_text("\n".join(MANY) + "\n" + "x" * 41 + "\n", encoding="utf-8")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing but comments\n\n   \n", encoding="utf-8")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"photos\n\xff\xfe\x00users\n")
    return [
        (str(bad), "line 3: invalid sequence name 'bad-name'"),
        (str(long), "line 201: invalid sequence name"),
        (str(empty), "names no sequence"),
        (str(binary), "cannot read it"),
        (str(tmp_path / "missing.txt"), "cannot read it: No such file or directory"),
        (str(tmp_path), "cannot read it"),  # a directory
    ]


def test_init_from_a_bad_file_exits_2_with_nothing_written(tmp_path: Path) -> None:
    db_file = tmp_path / "tickets.db"
    for path, message in _bad_name_files(tmp_path):
        result = run("init", "--url", f"sqlite:///{db_file}", "photos", "--from-file", path)
        assert result.returncode == 2, (path, result.stderr)
        line = error_line(result)
        assert f"--from-file {path}" in line and message in line, line
        assert result.stdout == ""
        assert not db_file.exists(), path
    piped = subprocess.run(
        [SCRIPT, "init", "--url", f"sqlite:///{db_file}", "--from-file", "-"],
        input="photos\nno good\n", capture_output=True, text=True, timeout=120, env=ENV,
        check=False,
    )
    assert piped.returncode == 2
    assert "--from-file standard input, line 2: invalid sequence name 'no good'" in error_line(
        piped
    )
    assert not db_file.exists()


def test_init_from_a_file_refuses_another_stride_and_changes_nothing(
    make_database, backend: str, tmp_path: Path
) -> None:
    url = make_database(backend)
    assert run("init", "--url", url, "photos").returncode == 0
    assert run("next", "--url", url, "photos", "--count", "5").returncode == 0
    names_file = _names_file(tmp_path / "names.txt", [*MANY[:50], "photos"])
    refused = run("init", "--url", url, "--from-file", str(names_file), "--increment", "2",
                  "--offset", "2")
    assert refused.returncode == 1
    line = error_line(refused)
    assert "photos" in line and "increment 1, offset 1" in line and "restride" in line
    assert describe(url, "photos") == (1, 1, 5)
    assert ticket_tables(url) == {"tickets__photos"}  # none of the others made


def _shown_url(url: str) -> str:
    return sa.engine.make_url(url).render_as_string(hide_password=True)


# -- next ----------------------------------------------------------------------------------------


def test_next_count_above_the_ceiling_draws_nothing(make_database) -> None:
    url = make_database("postgresql")
    assert run("init", "--url", url, "photos").returncode == 0
    assert run("next", "--url", url, "photos", "--count", "3").returncode == 0
    for count in (str(MAX_COUNT + 1), "99999999999", "0", "-1", "abc", "1.5"):
        result = run("next", "--url", url, "photos", "--count", count)
        assert result.returncode == 2, (count, result.stderr)
        assert "Traceback" not in result.stderr
        assert "--count" in result.stderr.splitlines()[-1]
    assert describe(url, "photos") == (1, 1, 3)  # nothing drawn
    full = run("next", "--url", url, "photos", "--count", str(MAX_COUNT))
    assert full.returncode == 0
    ids = full.stdout.split()
    assert len(ids) == MAX_COUNT and ids[0] == "4" and ids[-1] == str(MAX_COUNT + 3)


def test_next_prints_blocks_as_they_arrive(make_database) -> None:
    """While nobody reads its output, ``next`` cannot get more than a block or two ahead: it
    draws a block, prints it, and only then draws the next (the pipe holds less than a block)."""
    url = make_database("postgresql")
    assert run("init", "--url", url, "photos").returncode == 0
    assert SCRIPT is not None
    with subprocess.Popen(
        [SCRIPT, "next", "--url", url, "photos", "--count", str(MAX_COUNT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
    ) as proc:
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline() == "1\n"
            # The first id is out; what has been drawn so far is bounded by the pipe, not the count.
            _, _, last = describe(url, "photos")
            assert last is not None and last <= 3 * BLOCK, last
        finally:
            proc.kill()
    assert describe(url, "photos")[2] <= 3 * BLOCK  # type: ignore[operator]


def test_next_over_a_pair_interleaves_blocks(make_database) -> None:
    a, b = make_database("sqlite"), make_database("sqlite")
    assert run("init", "--url", a, "--url", b, "photos").returncode == 0
    result = run("next", "--url", a, "--url", b, "photos", "--count", str(3 * BLOCK))
    assert result.returncode == 0, result.stderr
    ids = [int(i) for i in result.stdout.split()]
    assert len(ids) == len(set(ids)) == 3 * BLOCK
    assert {i % 2 for i in ids} == {0, 1}  # both servers served blocks


# -- status --------------------------------------------------------------------------------------


def test_status_shares_never_exceed_100_percent(make_database) -> None:
    url = make_database("postgresql")
    TicketServer(url).create("photos", start=2**40)  # a 64-bit sequence far past 2**31
    assert run("next", "--url", url, "photos").returncode == 0
    result = run("status", "--url", url, "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["used_32"] == 1.0 and 0 < row["used_64"] < 1
    human = run("status", "--url", url)
    assert "100.0000%" in human.stdout and "51200" not in human.stdout


def test_status_never_creates_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "no-such.db"
    for command in (["status"], ["next", "photos"], ["status", "--json"]):
        result = run(*command, "--url", f"sqlite:///{missing}")
        assert result.returncode == 1
        line = error_line(result)
        assert "no SQLite database" in line and str(missing) in line
        assert not missing.exists()
    sync = run("sync", "--url", f"sqlite:///{missing}", "--from", f"sqlite:///{missing}",
               "--table", "photos", "photos")
    assert sync.returncode == 1 and not missing.exists()


def test_status_on_a_database_without_ticket_tables_says_so(make_database, backend: str) -> None:
    url = make_database(backend)
    if backend == "sqlite":  # a file that exists, with an application table only
        import sqlalchemy as sa

        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
        engine.dispose()
    result = run("status", "--url", url)
    assert result.returncode == 1
    assert "no ticket tables" in error_line(result)
    assert result.stdout == ""
    # One server with tables, one without: the table, and a note for the empty one.
    other = make_database(backend)
    assert run("init", "--url", other, "photos").returncode == 0
    both = run("status", "--url", other, "--url", url)
    assert both.returncode == 0 and "photos" in both.stdout
    assert "no ticket tables" in both.stderr


# -- sync ----------------------------------------------------------------------------------------


def test_sync_names_its_sequence_explicitly(make_database) -> None:
    import sqlalchemy as sa

    url = make_database("mysql")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE photos (id INTEGER PRIMARY KEY, title VARCHAR(20))")
        conn.exec_driver_sql("INSERT INTO photos VALUES (41, 'b')")
    engine.dispose()
    assert run("init", "--url", url).returncode == 0  # Flickr's Tickets64
    assert run("next", "--url", url).stdout.split() == ["1"]

    bare = run("sync", "--url", url, "--from", url, "--table", "photos")
    assert bare.returncode == 2 and "name the one sequence" in bare.stderr
    assert "--flickr" in bare.stderr
    both = run("sync", "--url", url, "--from", url, "--table", "photos", "photos", "--flickr")
    assert both.returncode == 2
    assert describe(url, None)[2] == 1  # Tickets64 did not move

    flickr = run("sync", "--url", url, "--from", url, "--table", "photos", "--flickr")
    assert flickr.returncode == 0, flickr.stderr
    assert run("next", "--url", url).stdout.split() == ["42"]


def test_sync_refuses_a_non_integer_column_in_one_line(make_database, backend: str) -> None:
    import sqlalchemy as sa

    url = make_database(backend)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE photos (id INTEGER PRIMARY KEY, title VARCHAR(20))")
        conn.exec_driver_sql("INSERT INTO photos VALUES (41, 'b')")
    engine.dispose()
    assert run("init", "--url", url, "photos").returncode == 0
    result = run("sync", "--url", url, "--from", url, "--table", "photos", "--column", "title",
                 "photos")
    assert result.returncode == 1
    line = error_line(result)
    assert "photos.title" in line and "not an integer column" in line
    no_column = run("sync", "--url", url, "--from", url, "--table", "photos", "--column",
                    "nope", "photos")
    assert no_column.returncode == 1 and "no column nope" in error_line(no_column)
    assert run("next", "--url", url, "photos").stdout.split() == ["1"]  # not moved


# -- errors: one line, the right exit code ---------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("next", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/x"), "failed to connect"),
        (("next", "--url", "mysql+pymysql://root@127.0.0.1:1/x", "photos"), "failed to connect"),
        (("status", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/x"), "failed"),
        (("init", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/x", "photos"), "failed"),
        (("restride", "--url", "mysql+pymysql://root@127.0.0.1:1/x"), "failed"),
    ],
)
def test_runtime_failures_are_one_line_exit_1(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.returncode == 1
    assert message in error_line(result)


def test_unknown_sequence_is_an_error_and_creates_nothing(make_database) -> None:
    url = make_database("postgresql")
    result = run("next", "--url", url, "ghost")
    assert result.returncode == 1 and "no ticket table tickets__ghost" in error_line(result)
    again = run("next", "--url", url, "ghost")
    assert again.returncode == 1  # still absent: the failed call created nothing


def _bad_argument_cases(db: str) -> list[tuple[str, ...]]:
    """Every subcommand's arguments, each wrong in one way. ``db`` is a SQLite URL whose file
    does not exist: if anything were read or written, the file would appear."""
    url = ("--url", db)
    return [
        (),
        ("nosuch",),
        ("demo", "--bogus"),
        # init
        ("init", *url, "photos", "--increment", "2", "--offset", "3"),
        ("init", *url, "photos", "--increment", "0"),
        ("init", *url, "photos", "--increment", "65536"),
        ("init", *url, "photos", "--offset", "0"),
        ("init", *url, "photos", "--start", "0"),
        ("init", *url, "photos", "--start", "x"),
        ("init", *url, "--bits", "16"),
        ("init", *url, "bad-name"),
        ("init", *url, "x" * 41),
        ("init", "--url", "not a url", "photos"),
        ("init", "--url", "nosuch://host/db", "photos"),
        ("init", "--url", "postgresql+nodriver://h/db", "photos"),
        ("init", *url, "--url", db + "2", "photos", "--increment", "1"),
        ("init", *url, "--url", db + "2", "photos", "--offset", "1"),
        ("init", *url, "--url", db + "2", "photos", "--offset", "1", "--offset", "1"),
        ("init", "photos"),
        # next
        ("next", *url, "photos", "--count", "0"),
        ("next", *url, "photos", "--count", "-5"),
        ("next", *url, "photos", "--count", str(MAX_COUNT + 1)),
        ("next", *url, "photos", "--count", "many"),
        ("next", *url, "bad-name"),
        ("next", *url, "--bits", "8"),
        ("next", *url, "a", "b"),
        ("next", "--url", "not a url"),
        ("next",),
        # status
        ("status", *url, "--sample", "-1"),
        ("status", *url, "--sample", "soon"),
        ("status", *url, "--sample", "86400"),
        ("status", "--url", "::"),
        ("status",),
        ("status", *url, "--upstream", "not a url"),
        ("status", *url, "--upstream", "nosuch://host/db"),
        ("status", *url, "--upstream"),
        ("status", *url, "--min-runway", "-1"),
        ("status", *url, "--min-runway", "long"),
        ("status", *url, "--tier-prefix", "bad-name"),
        ("status", *url, "--tier-prefix", "tickets__photos"),
        # init of a datacenter tier
        ("init", *url, "--datacenter-tier", "--tier-prefix", "bad-name"),
        ("init", *url, "--datacenter-tier", "--tier-prefix", "x" * 80),
        ("init", *url, "--datacenter-tier", "--tier-prefix", "dc; drop table y"),
        ("init", *url, "--datacenter-tier", "--tier-prefix"),
        ("init", "--datacenter-tier"),
        # sync
        ("sync", *url, "--from", db, "--table", "photos"),
        ("sync", *url, "--from", db, "--table", "photos", "photos", "--flickr"),
        ("sync", *url, "--from", db, "--table", "x; drop table y", "photos"),
        ("sync", *url, "--from", db, "--table", "photos", "--column", "1d", "photos"),
        ("sync", *url, "--from", "not a url", "--table", "photos", "photos"),
        ("sync", *url, "--table", "photos", "photos"),
        ("sync", *url, "--from", db, "photos"),
        ("sync", *url, "--from", db, "--table", "photos", "bad-name"),
        # restride
        ("restride", *url, "bad-name"),
        ("restride", "--url", "not a url"),
        ("restride",),
    ]


def test_bad_arguments_exit_2_before_anything_is_read_or_written(tmp_path: Path) -> None:
    db_file = tmp_path / "tickets.db"
    db = f"sqlite:///{db_file}"
    cases = _bad_argument_cases(db)
    # Independent processes: run a few at once (each spends most of its time importing).
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda args: run(*args, cwd=tmp_path), cases))
    for args, result in zip(cases, results, strict=True):
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr, args
        assert "error:" in result.stderr.splitlines()[-1], (args, result.stderr)
        assert not db_file.exists() and not Path(str(db_file) + "2").exists(), args
        assert result.stdout == "", args


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("[other]\nurls = sqlite:///x.db\n", "has no [tickets] section"),
        ("[tickets]\n", "has no urls"),
        ("[tickets]\nurls = not-a-url\n", "invalid database URL"),
        ("not an ini file", "cannot read it"),
    ],
)
def test_a_bad_config_file_exits_2_naming_the_file(
    tmp_path: Path, content: str | None, message: str
) -> None:
    config = tmp_path / "tickets.ini"
    if content is not None:
        config.write_text(content)
    for command in ("status", "next", "init", "restride"):
        result = run(command, "--config", str(config), cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        line = error_line(result)
        assert str(config) in line and message in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == (["tickets.ini"] if content else [])


def test_urls_from_the_environment_are_checked_too(tmp_path: Path) -> None:
    result = run("status", env={**ENV, "TICKETS_URL": "not-a-url"}, cwd=tmp_path)
    assert result.returncode == 2 and "TICKETS_URL" in error_line(result)


def test_url_and_config_together_is_a_bad_argument(
    tmp_path: Path, make_database: Callable[[str], str]
) -> None:
    url = make_database("sqlite")
    (tmp_path / "t.ini").write_text(f"[tickets]\nurls = {url}\n")
    result = run("status", "--url", url, "--config", str(tmp_path / "t.ini"))
    assert result.returncode == 2 and "not both" in error_line(result)


# -- datacenter tiers ----------------------------------------------------------------------------


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_init_creates_a_datacenter_tier(make_database, backend: str) -> None:
    url = make_database(backend)
    result = run("init", "--url", url, "--datacenter-tier")
    assert result.returncode == 0, result.stderr
    assert "tickets_dc__stock, tickets_dc__state ready" in result.stdout
    # Nothing else but where the tier records its identity and marks.
    assert table_names(url) == {"tickets_dc__stock", "tickets_dc__state", "tickets_stamps"}
    again = run("init", "--url", url, "--datacenter-tier", "--tier-prefix", "tickets_eu",
                "photos")
    assert again.returncode == 0, again.stderr
    assert table_names(url) == {
        "tickets_dc__stock", "tickets_dc__state", "tickets_eu__stock", "tickets_eu__state",
        "tickets__photos", "tickets_stamps",
    }
    # The tables are the tier's: one that may not create anything issues ids from them.
    upstream = TicketServer(make_database(backend))
    tier = DatacenterTier(url, upstream, table_prefix="tickets_eu", create_missing=False,
                          min_block=10, timeout=10.0)
    try:
        assert tier.next_block("photos", 2) == range(1, 3)
    finally:
        tier.close()
        upstream.close()
    # Idempotent, beside a tier in use: the stock is untouched.
    (before,) = describe_datacenter(url, table_prefix="tickets_eu")
    assert run("init", "--url", url, "--datacenter-tier", "--tier-prefix",
               "tickets_eu").returncode == 0
    (after,) = describe_datacenter(url, table_prefix="tickets_eu")
    assert (after.stock, after.issued) == (before.stock, before.issued)


def _busy_tier(url: str, upstream_url: str) -> None:
    """A tier that issued ids at a measured rate, holds a range given back, and is at rest
    (closed: no refill runs), with a live refill claim of another process."""
    upstream = TicketServer(upstream_url)
    tier = DatacenterTier(url, upstream, min_block=500, timeout=10.0)
    try:
        tier.next_block("photos", 20)  # the tier makes its tables
        deadline = time.monotonic() + 30
        while describe_datacenter(url)[0].rate == 0:  # the rate is sampled once a second
            assert time.monotonic() < deadline, "no rate measured"
            tier.next_block("photos", 20)
            time.sleep(0.05)
        given = tier.next_block("photos", 5)
        assert tier.give_back("photos", given) == 5
    finally:
        tier.close()
        upstream.close()
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE tickets_dc__state SET claim_owner = 'dc-host:4242:ab12', "
                                 "claim_until = 4102444800000"))  # 2100-01-01
    finally:
        engine.dispose()


STABLE = ["sequence", "bits", "stock", "given_back_in_stock", "ranges", "issued", "given_back",
          "refills", "refilled", "rate", "runway", "claim_owner", "exhausted"]


def test_status_shows_the_tier_as_describe_datacenter_reads_it(
    make_database, backend: str
) -> None:
    url, upstream = make_database(backend), make_database(backend)
    _busy_tier(url, upstream)
    (expected,) = describe_datacenter(url)
    assert expected.stock > 0 and expected.given_back_in_stock == 5 and expected.rate > 0
    assert expected.runway == pytest.approx(expected.stock / expected.rate)

    result = run("status", "--url", url, "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["kind"] == "tier" and row["table_prefix"] == "tickets_dc"
    assert url.split("@")[-1].split("///")[-1] in row["database"]
    assert {k: row[k] for k in STABLE} == {k: getattr(expected, k) for k in STABLE}
    assert set(row) == {"kind", "database", "table_prefix", *TierStatus.__dataclass_fields__}
    # Ages and the claim's expiry are read on the database's clock, later.
    assert expected.last_refill_age <= row["last_refill_age"] < expected.last_refill_age + 60
    assert 0 < row["claim_expires_in"] <= expected.claim_expires_in

    text = run("status", "--url", url)
    assert text.returncode == 0, text.stderr
    (line,) = [line for line in text.stdout.splitlines() if "photos/64" in line]
    for figure in (f"{expected.stock:,}", f"{expected.rate:,.1f}", _duration(expected.runway),
                   "dc-host:4242:ab12", f"{expected.issued:,}"):
        assert f" {figure} " in f" {line} ", (figure, line)
    assert "runway" in text.stdout.splitlines()[0]

    # A runway shorter than asked for: a warning and exit 3, the figures still printed.
    short = run("status", "--url", url, "--min-runway", str(2 * expected.runway))
    assert short.returncode == 3 and "photos/64" in short.stdout
    assert "runway" in error_line(short) and "--min-runway" in error_line(short)
    assert run("status", "--url", url, "--min-runway", str(expected.runway / 2)).returncode == 0


def test_status_reports_upstream_servers_up_and_down(make_database, tmp_path: Path) -> None:
    dc = make_database("sqlite")
    assert run("init", "--url", dc, "--datacenter-tier").returncode == 0
    up = make_database("postgresql")
    assert run("init", "--url", up, "photos").returncode == 0
    behind = make_database("mysql")
    assert run("init", "--url", behind, "photos").returncode == 0
    target = sa.engine.make_url(behind)
    closed = "postgresql+psycopg://postgres@127.0.0.1:1/tickets"  # nothing listens on port 1
    missing = tmp_path / "no-such-upstream.db"
    with TcpProxy(target.host or "127.0.0.1", target.port or 3306) as proxy:
        proxied = proxy.url(behind)
        args = ["status", "--url", dc, "--upstream", up, "--upstream", proxied]

        healthy = run(*args, "--json")
        assert healthy.returncode == 0, healthy.stderr
        rows = [r for r in json.loads(healthy.stdout) if r["kind"] == "upstream"]
        assert [r["up"] for r in rows] == [True, True]
        assert all(r["sequences"] == ["photos"] and 0 < r["latency"] <= r["connect"] < 10
                   for r in rows)

        for fault in (proxy.refuse, proxy.hang):
            fault()
            started = time.monotonic()
            result = run(*args, "--upstream", closed, "--upstream", f"sqlite:///{missing}",
                         "--json")
            assert time.monotonic() - started < 60  # a hung server is bounded by its timeout
            assert result.returncode == 3, (fault, result.stderr)
            rows = [r for r in json.loads(result.stdout) if r["kind"] == "upstream"]
            assert [r["up"] for r in rows] == [True, False, False, False]
            assert all(r["latency"] is None and r["error"] for r in rows[1:])
            warned = [line for line in result.stderr.splitlines() if line.strip()]
            assert len(warned) == 3 and all(w.startswith("warning: upstream ") for w in warned)
            assert "Traceback" not in result.stderr
            assert not missing.exists()  # looking created nothing

            text = run(*args)
            assert text.returncode == 3
            states = [line.split()[1] for line in text.stdout.splitlines()
                      if line.startswith(("postgresql", "mysql"))]
            assert states == ["up", "DOWN"], text.stdout
            proxy.forward()

        assert run(*args).returncode == 0  # back up


def test_status_of_a_database_with_only_a_tier_is_not_an_error(make_database) -> None:
    url = make_database("postgresql")
    assert run("init", "--url", url, "--datacenter-tier").returncode == 0
    result = run("status", "--url", url)
    assert result.returncode == 0, result.stderr
    assert "no sequence has drawn from it yet" in result.stdout
    assert result.stderr == ""
    assert json.loads(run("status", "--url", url, "--json").stdout) == []
    # Another prefix names no tier there: nothing at all, exit 1.
    other = run("status", "--url", url, "--tier-prefix", "tickets_eu")
    assert other.returncode == 1 and "no ticket tables" in error_line(other)
    assert table_names(url) == {  # nothing created
        "tickets_dc__stock", "tickets_dc__state", "tickets_stamps"
    }
