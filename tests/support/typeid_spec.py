"""The TypeID spec's test vectors, vendored in tests/data/typeid (see the README there)."""

from __future__ import annotations

import json
from pathlib import Path

SPEC_DIR = Path(__file__).resolve().parent.parent / "data" / "typeid"


def load_vectors(name: str) -> list[dict[str, str]]:
    """The entries of one of the spec's YAML files.

    They are a flat list of ``- name: …`` blocks of ``key: "double-quoted string"`` lines,
    which is all this reads (no YAML library needed); anything else fails loudly.
    """
    entries: list[dict[str, str]] = []
    for number, line in enumerate((SPEC_DIR / name).read_text(encoding="utf-8").splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("- "):
            entries.append({})
            stripped = stripped[2:]
        key, sep, raw = stripped.partition(": ")
        if not sep or not entries:
            raise AssertionError(f"{name}:{number}: unexpected line {line!r}")
        raw = raw.strip()
        entries[-1][key] = json.loads(raw) if raw.startswith('"') else raw
    assert entries, f"no vectors in {name}"
    return entries


VALID = load_vectors("valid.yml")
INVALID = load_vectors("invalid.yml")
