"""The benchmarks use the library's public API only: no file of ``benchmarks/`` imports a private
module or name, or reads an attribute whose name starts with a single underscore, except on a
module of another distribution (``sys._getframe``, a peer's entry point). A benchmark that
reaches into the library's internals breaks when they move, and measures what no user runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
LOCAL = {p.stem for p in BENCH_DIR.glob("*.py")}  # the benchmarks' own modules (the harness)
LIBRARY = "sqlalchemy_tickets"


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def findings(tree: ast.AST) -> list[str]:
    """``line: what`` for every reach into something private."""
    foreign: set[str] = set()  # names bound to modules of other distributions
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                root = alias.name.split(".")[0]
                if root not in LOCAL and any(map(private, alias.name.split("."))):
                    found.append(f"{node.lineno}: import of the private module {alias.name}")
                if root != LIBRARY:
                    foreign.add(alias.asname or root)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] not in LOCAL and any(map(private, module.split("."))):
                found.append(f"{node.lineno}: import from the private module {module}")
            found += [f"{node.lineno}: import of the private name {a.name} from {module}"
                      for a in node.names if private(a.name)]
    for node in ast.walk(tree):
        base, name = None, None
        if isinstance(node, ast.Attribute):
            base, name = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            base, name = node.args[0], node.args[1].value
        if name is not None and private(name):
            if not (isinstance(base, ast.Name) and base.id in foreign):
                found.append(f"{node.lineno}: reads the private attribute {name}")
    return found


@pytest.mark.parametrize("path", sorted(BENCH_DIR.glob("*.py")), ids=lambda p: p.name)
def test_benchmark_uses_only_the_public_api(path: Path) -> None:
    assert findings(ast.parse(path.read_text(), str(path))) == []


def test_the_check_sees_what_it_must() -> None:
    source = """
import sys
import uuid_utils
import _harness as h
from sqlalchemy_tickets import TicketServer
from sqlalchemy_tickets._naming import ticket_table
from support.rewind import _pg_args
import sqlalchemy_tickets.sources._refill
server = TicketServer("sqlite://")
server._known
server._round_trip(server._take)
getattr(server, "_known")
sys._getframe()
uuid_utils._uuid7_int
h.loop
server.__class__
"""
    lines = [f.split(":")[0] for f in findings(ast.parse(source))]
    assert sorted(map(int, lines)) == [6, 7, 8, 10, 11, 11, 12]
