"""MkDocs hook: serve the plots of ``benchmarks/results/`` at ``results/`` in the site.

The benchmarks write their PNGs there; pages link ``results/<name>.png``. Serving them from where
they are written keeps one copy, and ``mkdocs build --strict`` still checks every link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    """Add every ``benchmarks/results/*.png`` to the site as ``results/<name>.png``."""
    root = Path(config["config_file_path"]).parent / "benchmarks"
    for png in sorted((root / "results").glob("*.png")):
        files.append(
            File(
                f"results/{png.name}",
                str(root),
                config["site_dir"],
                config["use_directory_urls"],
            )
        )
    return files
