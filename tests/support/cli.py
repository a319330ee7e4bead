"""Running the ``sqlalchemy-tickets`` console script as a user runs it: a real process."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = shutil.which("sqlalchemy-tickets", path=os.path.dirname(sys.executable))
#: The environment of every run: no ``TICKETS_URL`` leaking in from the developer's shell.
ENV = {k: v for k, v in os.environ.items() if k != "TICKETS_URL"}


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sqlalchemy-tickets *args``: its exit status and captured output (never raises on a
    non-zero status; the tests assert on it). ``env`` replaces :data:`ENV`."""
    assert SCRIPT is not None, "the sqlalchemy-tickets console script is not installed"
    return subprocess.run(
        [SCRIPT, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
        env=ENV if env is None else env, check=False,
    )
