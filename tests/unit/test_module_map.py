"""The shape of the package, checked mechanically (``docs/development.md`` has the module map):
no source file over 800 lines, no import cycle (not even under ``TYPE_CHECKING``), and no module
but the command line importing the package's top level (which imports the rest lazily)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "src" / "sqlalchemy_tickets"
PACKAGE = "sqlalchemy_tickets"
#: The modules allowed to import ``sqlalchemy_tickets`` itself: the command line (a package) and
#: ``python -m``, the entry points, loaded last.
MAY_IMPORT_TOP = ("sqlalchemy_tickets.cli", "sqlalchemy_tickets.__main__")
MOST_LINES = 800


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The package's modules ``module`` imports, at any depth of its code."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                found.add(candidate if candidate in MODULES else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_800_lines(module: str) -> None:
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MOST_LINES, f"{module} has {lines} lines"


def test_no_import_cycle() -> None:
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        seen[module] = 1
        for imported in sorted(GRAPH[module]):
            if seen.get(imported) == 1:
                cycle = path[path.index(imported):] + [imported]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if imported not in seen:
                visit(imported, [*path, imported])
        seen[module] = 2

    for module in sorted(GRAPH):
        if module not in seen:
            visit(module, [module])


def test_only_the_command_line_imports_the_top_level() -> None:
    importing = sorted(m for m, imported in GRAPH.items()
                       if PACKAGE in imported and not m.startswith(MAY_IMPORT_TOP))
    assert importing == []


def test_the_check_sees_the_package() -> None:
    # The checks above would pass on an empty map: make sure they looked.
    assert len(MODULES) > 50 and "sqlalchemy_tickets.sources.server" in GRAPH
    assert "sqlalchemy_tickets.sources._ticket_db" in GRAPH["sqlalchemy_tickets.sources.server"]
