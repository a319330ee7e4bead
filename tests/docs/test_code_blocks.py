"""Every ```python block of README.md and docs/*.md runs here, so the docs cannot rot.

Rules (also in docs/index.md's "About these pages"):

- Each block runs in a fresh namespace, in a fresh temporary directory as the working
  directory, after ``configure(None)``; caches it opened are closed after it.
- A block preceded by the line ``<!-- no-run -->`` is collected and reported as skipped
  ("deliberately not run"); the prose around it says why.
- A page with the line ``<!-- blocks share a namespace -->`` runs its blocks in order, in one
  namespace and one directory, as one test (so later blocks may use what earlier ones made).
"""

from __future__ import annotations

import itertools
import linecache
import re
import sys
import textwrap
import types
import weakref
from dataclasses import dataclass
from pathlib import Path

import pytest

import sqlalchemy_tickets
from sqlalchemy_tickets.sources import _open
from sqlalchemy_tickets.sources.cache import open_caches

ROOT = Path(__file__).resolve().parents[2]
NO_RUN = "<!-- no-run -->"
SHARED = "<!-- blocks share a namespace -->"
_OPEN = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w+-]*)\s*$")
_PYTHON = {"python", "py", "python3"}
_counter = itertools.count()


@dataclass(frozen=True)
class Block:
    page: str  # path relative to the repository
    line: int  # 1-based line of the opening fence
    code: str
    run: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks_of(path: Path, root: Path = ROOT) -> list[Block]:
    """The Python blocks of one page; raises ValueError on a stray or unclosed marker/fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = path.relative_to(root).as_posix()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if lines[i].strip() == NO_RUN and not (
            i + 1 < len(lines)
            and (nxt := _OPEN.match(lines[i + 1]))
            and nxt["lang"] in _PYTHON
        ):
            raise ValueError(f"{page}:{i + 1}: {NO_RUN} must stand right before a ```python fence")
        if opening is None or not opening["lang"]:
            i += 1
            continue
        indent = opening["indent"]
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != f"{indent}```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{page}:{i + 1}: unclosed ``` fence")
        if opening["lang"] in _PYTHON:
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            run = not (i > 0 and lines[i - 1].strip() == NO_RUN)
            found.append(Block(page, i + 1, code + "\n", run))
        i = end + 1
    return found


def _shared(path: Path) -> bool:
    return SHARED in path.read_text(encoding="utf-8").splitlines()


SINGLE: list[Block] = []
SHARED_PAGES: list[Path] = []
for _path in pages():
    if _shared(_path):
        SHARED_PAGES.append(_path)
        SINGLE.extend(b for b in blocks_of(_path) if not b.run)  # reported as skipped
    else:
        SINGLE.extend(blocks_of(_path))


@pytest.fixture
def docs_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A temporary working directory, the embedded default, and caches closed afterwards.

    The block sees the metrics of its own caches only, as a reader's program would: earlier
    tests' caches (thousands of sequences) would push its series past the OpenTelemetry SDK's
    default limit of 2,000 per instrument, into the overflow series."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(_open, "_open", weakref.WeakSet())
    monkeypatch.setattr(_open, "_retired", {})
    sqlalchemy_tickets.configure(None)
    before = {id(cache) for cache in open_caches()[0]}
    yield tmp_path
    sqlalchemy_tickets.configure(None)
    for cache in open_caches()[0]:
        if id(cache) not in before:
            cache.close()


def _module() -> types.ModuleType:
    """A fresh module for a block (or a shared page), registered in ``sys.modules`` while it
    runs: SQLAlchemy, dataclasses and pydantic look a class's module up there."""
    module = types.ModuleType(f"docs_block_{next(_counter)}")
    sys.modules[module.__name__] = module
    return module


def _run(block: Block, module: types.ModuleType) -> None:
    # dont_inherit: this file's ``from __future__ import annotations`` must not leak into
    # the block, whose annotations are evaluated as written.
    linecache.cache[block.id] = (len(block.code), None, block.code.splitlines(True), block.id)
    exec(compile(block.code, block.id, "exec", dont_inherit=True), module.__dict__)


@pytest.mark.parametrize("block", SINGLE, ids=[b.id for b in SINGLE])
def test_code_block(block: Block, docs_cwd: Path) -> None:
    if not block.run:
        pytest.skip(f"{block.id}: deliberately not run ({NO_RUN})")
    module = _module()
    try:
        _run(block, module)
    finally:
        del sys.modules[module.__name__]


@pytest.mark.parametrize(
    "path", SHARED_PAGES, ids=[p.relative_to(ROOT).as_posix() for p in SHARED_PAGES]
)
def test_code_page(path: Path, docs_cwd: Path) -> None:
    module = _module()
    try:
        for block in blocks_of(path):
            if block.run:
                _run(block, module)
    finally:
        del sys.modules[module.__name__]


def test_the_collector_sees_markers_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n```python\nx = 1\n```\n\n" + NO_RUN + "\n```python\nraise SystemExit\n```\n"
        "```sh\nmake test\n```\n- item\n\n    ```python\n    y = 2\n    ```\n",
        encoding="utf-8",
    )
    found = blocks_of(page, tmp_path)
    assert [(b.line, b.run, b.code) for b in found] == [
        (2, True, "x = 1\n"), (7, False, "raise SystemExit\n"), (15, True, "y = 2\n")
    ]
    page.write_text(NO_RUN + "\n```sh\nls\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match="must stand right before"):
        blocks_of(page, tmp_path)
    page.write_text("```python\nx = 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unclosed"):
        blocks_of(page, tmp_path)
