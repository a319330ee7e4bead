"""The console script, run as a user runs it: a real process, real databases."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.cli import run


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


@pytest.mark.parametrize("backend", ["sqlite", "postgresql", "mysql"])
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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("next", "--url", "postgresql+psycopg://postgres@127.0.0.1:1/x"), "failed: connection"),
        (("next", "--url", "mysql+pymysql://root@127.0.0.1:1/x", "photos"), "failed"),
        (("next", "--url", "nosuch://x"), "no ticket backend"),
        (("next", "--url", "not a url"), "invalid database URL"),
        (("init", "--url", "sqlite://", "bad-name"), "invalid sequence name"),
    ],
)
def test_errors_are_one_line_without_traceback(args: tuple[str, ...], message: str) -> None:
    result = run(*args)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_unknown_sequence_is_an_error_and_creates_nothing(make_database) -> None:
    url = make_database("postgresql")
    result = run("next", "--url", url, "ghost")
    assert result.returncode == 1 and "no ticket table tickets__ghost" in result.stderr
    again = run("next", "--url", url, "ghost")
    assert again.returncode == 1  # still absent: the failed call created nothing


def test_bad_arguments_exit_2() -> None:
    assert run("next").returncode == 2
    assert run("next", "--url", "sqlite://", "--count", "0").returncode == 2
    assert run("init", "--url", "sqlite://", "--bits", "16").returncode == 2
