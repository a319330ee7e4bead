"""The lowest versions the package declares, as pip/uv constraints, and a check that they are the
ones installed.

``python tests/install/lowest.py python`` prints the lowest Python ``requires-python`` allows.

``python tests/install/lowest.py constraints`` reads ``pyproject.toml`` and prints one
``name==version`` line for every requirement of ``[project].dependencies`` and of every extra but
``dev`` (the test tools are not part of what users install). Each must have a ``>=`` lower bound:
a dependency without one would claim to work with versions nobody tested.

``python tests/install/lowest.py check FILE`` (run with the interpreter of the lowest-versions
venv) compares what is installed there with the constraints in ``FILE`` and fails on a mismatch,
so the lowest run cannot quietly test something else.

Only the standard library is used: the check runs in a venv that may have no ``packaging``.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
# name, optional [extras], then the specifiers (an environment marker is not expected here).
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*?)\s*$")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _load_pyproject() -> dict[str, object]:
    try:
        import tomllib as toml
    except ModuleNotFoundError:  # Python 3.10: the same parser as tomli (pytest needs it there)
        try:
            import tomli as toml
        except ModuleNotFoundError:
            from pip._vendor import tomli as toml
    with PYPROJECT.open("rb") as file:
        data: dict[str, object] = toml.load(file)
    return data


def lowest_constraints() -> dict[str, str]:
    """``{normalized name: lowest version}`` over dependencies and user-facing extras."""
    project = _load_pyproject()["project"]
    assert isinstance(project, dict)
    requirements: list[str] = list(project.get("dependencies", []))
    for extra, extra_requirements in project.get("optional-dependencies", {}).items():
        if extra != "dev":
            requirements.extend(extra_requirements)
    lowest: dict[str, str] = {}
    for requirement in requirements:
        match = _REQUIREMENT.match(requirement)
        if match is None or ";" in requirement:
            raise SystemExit(f"pyproject.toml: cannot read the requirement {requirement!r}")
        name, specifiers = _normalize(match.group(1)), match.group(2)
        bounds = re.findall(r">=\s*([0-9][0-9A-Za-z.]*)", specifiers)
        if len(bounds) != 1:
            raise SystemExit(
                f"pyproject.toml: {requirement!r} needs exactly one '>=' lower bound, the "
                "version the lowest-versions run tests"
            )
        if lowest.setdefault(name, bounds[0]) != bounds[0]:
            raise SystemExit(
                f"pyproject.toml: {name} is declared with two lower bounds, "
                f"{lowest[name]} and {bounds[0]}; use one"
            )
    return lowest


def _release(version: str) -> tuple[int, ...]:
    parts = [int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3]]
    return tuple(parts + [0] * (3 - len(parts)))


def check(constraints_file: Path) -> int:
    """Print the declared and installed versions; 1 if any installed one differs."""
    wrong = 0
    for line in constraints_file.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, _, wanted = line.partition("==")
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = "missing"
        ok = installed != "missing" and _release(installed) == _release(wanted)
        wrong += not ok
        print(f"  {name:<20} declared >= {wanted:<10} installed {installed}"
              f"{'' if ok else '   <-- not the lowest'}")
    print(f"  {'python':<20} {'':<22} installed {sys.version.split()[0]}")
    return 1 if wrong else 0


def lowest_python() -> str:
    """The lowest Python ``requires-python`` allows, e.g. ``3.10``."""
    project = _load_pyproject()["project"]
    assert isinstance(project, dict)
    bounds = re.findall(r">=\s*(3\.\d+)", project.get("requires-python", ""))
    if len(bounds) != 1:
        raise SystemExit("pyproject.toml: requires-python needs one '>=3.N' lower bound")
    return bounds[0]


def main(argv: list[str]) -> int:
    if argv == ["python"]:
        print(lowest_python())
        return 0
    if argv[:1] == ["constraints"] and len(argv) == 1:
        for name, version in sorted(lowest_constraints().items()):
            print(f"{name}=={version}")
        return 0
    if argv[:1] == ["check"] and len(argv) == 2:
        return check(Path(argv[1]))
    print("usage: lowest.py python | constraints | check CONSTRAINTS_FILE", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
