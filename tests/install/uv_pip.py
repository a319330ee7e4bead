"""``python tests/install/uv_pip.py ARGS...``: ``uv pip ARGS...`` with the package indexes pip uses.

uv does not read pip's configuration. Run with a venv's ``python`` that has pip and uv installed;
reads ``pip config list`` (configuration files and ``PIP_*`` environment variables) and adds
``--index-url`` (pip's, or PyPI), every ``--extra-index-url``, every ``--find-links``, and
``--index-strategy unsafe-best-match``: pip picks the best version across all its indexes, while
uv's default stops at the first index that has the package, which would hide older releases (the
lowest-versions run needs them) behind a partial mirror. pip's ``cert`` becomes ``SSL_CERT_FILE``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

#: Configuration scopes from weakest to strongest, as pip applies them.
_SCOPES = ("global", "user", "site", ":env:")


def pip_settings() -> dict[str, str]:
    """pip's effective ``index-url``, ``extra-index-url``, ``find-links`` and ``cert``."""
    listing = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True, text=True, check=True,
    ).stdout
    found: dict[tuple[int, str], str] = {}
    for line in listing.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or "." not in key:
            continue
        scope, _, option = key.rpartition(".")
        if scope not in _SCOPES:
            continue
        found[(_SCOPES.index(scope), option)] = ast.literal_eval(raw)
    settings: dict[str, str] = {}
    for (_, option), value in sorted(found.items()):
        settings[option] = value  # a stronger scope, read later, wins
    return settings


def main(argv: list[str]) -> int:
    settings = pip_settings()
    args = ["--index-url", settings.get("index-url", "https://pypi.org/simple")]
    for url in settings.get("extra-index-url", "").split():
        args += ["--extra-index-url", url]
    for location in settings.get("find-links", "").split():
        args += ["--find-links", location]
    args += ["--index-strategy", "unsafe-best-match"]
    env = dict(os.environ)
    if "cert" in settings:
        env.setdefault("SSL_CERT_FILE", settings["cert"])
    return subprocess.run([sys.executable, "-m", "uv", "pip", *argv, *args], env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
