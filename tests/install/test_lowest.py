"""The lowest-versions run tests what pyproject.toml declares, and notices when it does not."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

SCRIPT = Path(__file__).with_name("lowest.py")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def test_every_user_facing_dependency_has_one_tested_lower_bound() -> None:
    result = _run("constraints")
    assert result.returncode == 0, result.stderr
    pins = dict(line.split("==") for line in result.stdout.split())
    # The runtime dependencies and the drivers/extras users install; not the test tools.
    assert {"sqlalchemy", "alembic", "psycopg", "pymysql"} <= pins.keys()
    assert "pytest" not in pins and "mypy" not in pins
    assert pins["sqlalchemy"].startswith("2.0.")


def test_lowest_python_comes_from_requires_python() -> None:
    result = _run("python")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("3.")


def test_check_fails_when_the_installed_version_is_not_the_declared_one(tmp_path: Path) -> None:
    pytest_version = metadata.version("pytest")
    exact = tmp_path / "exact.txt"
    exact.write_text(f"pytest=={pytest_version}\n")
    assert _run("check", str(exact)).returncode == 0
    other = tmp_path / "other.txt"
    other.write_text("pytest==1.0\n")
    result = _run("check", str(other))
    assert result.returncode == 1 and "not the lowest" in result.stdout
    missing = tmp_path / "missing.txt"
    missing.write_text("no-such-distribution==1.0\n")
    assert _run("check", str(missing)).returncode == 1
