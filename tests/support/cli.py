"""Running the ``sqlalchemy-tickets`` console script as a user runs it: a real process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = shutil.which("sqlalchemy-tickets", path=os.path.dirname(sys.executable))


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``sqlalchemy-tickets *args``: its exit status and captured output (never raises on a
    non-zero status; the tests assert on it)."""
    assert SCRIPT is not None, "the sqlalchemy-tickets console script is not installed"
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )
