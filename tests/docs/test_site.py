"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing page
in the nav, or an API reference that no longer resolves fails the test suite."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# The docs toolchain is not part of the package: pymdown-extensions >= 13 needs Python >= 3.11.5,
# and what resolves on 3.10 breaks Material's highlighting. The newest-versions run builds the site.
@pytest.mark.skipif(
    sys.version_info < (3, 11, 5), reason="the docs toolchain needs Python >= 3.11.5"
)
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict",
         "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # Material's notice, not ours
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (site / "index.html").is_file()
    assert (site / "reference" / "index.html").is_file()
    # Plots come from benchmarks/results through the hook.
    assert (site / "results" / "bench_index_size.png").is_file()


def test_readme_links_lead_somewhere() -> None:
    """README.md is not part of the site, so mkdocs does not check its links: this does."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [t.split("#")[0] for t in targets if "://" not in t and not t.startswith("#")]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to missing files: {missing}"
