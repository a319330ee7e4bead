"""Running the ``sqlalchemy-tickets`` console script as a user runs it: a real process (forked
from a process that imported the library once: :mod:`support.forked`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from support import forked

SCRIPT = shutil.which("sqlalchemy-tickets", path=os.path.dirname(sys.executable))
#: The environment of every run: no ``TICKETS_URL`` leaking in from the developer's shell.
ENV = {k: v for k, v in os.environ.items() if k != "TICKETS_URL"}


def run(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``sqlalchemy-tickets *args``: its exit status and captured output (never raises on a
    non-zero status; the tests assert on it). ``env`` replaces :data:`ENV`."""
    return forked.run_script("sqlalchemy-tickets", *args, cwd=cwd,
                             env=ENV if env is None else env)
