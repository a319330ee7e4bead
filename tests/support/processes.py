"""Real worker processes for tests that need several interpreters at once (each with its own
caches, tiers, threads and connections, as the processes of a datacenter are).

:func:`run_processes` starts one worker process per argument tuple, collects what each
returns, and fails the test with the child's own traceback when one raises, or with its exit
code when one dies without a word, instead of leaving the parent waiting. Workers that must
start together take a barrier made with :data:`WORKERS` (``WORKERS.Barrier(n)``) among their
arguments.
"""

from __future__ import annotations

import multiprocessing
import time
import traceback
from collections.abc import Callable, Sequence
from queue import Empty
from typing import Any

__all__ = ["WORKERS", "run_processes"]

#: Worker processes forked from a server process that imported SQLAlchemy, the drivers and the
#: library once (multiprocessing's forkserver), never from the test process: nothing of it
#: (threads, sockets, caches) is inherited, and a worker starts in milliseconds instead of the
#: 1.5 s of CPU a spawned interpreter spends importing. Like spawned ones, they get their
#: target and arguments pickled, and the server's environment (set before the first worker).
WORKERS = multiprocessing.get_context("forkserver")
WORKERS.set_forkserver_preload([
    "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.mysql",
    "sqlalchemy.dialects.sqlite", "psycopg", "pymysql", "sqlalchemy_tickets",
])


def _report(target: Callable[..., Any], args: tuple[Any, ...], index: int, queue: Any) -> None:
    """In the child: ``target(*args)``, its result or its traceback put on ``queue``."""
    try:
        result = target(*args)
    except BaseException:
        queue.put((index, False, traceback.format_exc()))
        raise
    queue.put((index, True, result))


def run_processes(
    target: Callable[..., Any], arguments: Sequence[tuple[Any, ...]], *, timeout: float = 240
) -> list[Any]:
    """Run ``target(*args)`` in a spawned process per ``args``; their results, in the order of
    ``arguments``. ``target`` must be importable by name (a module-level function) and return
    something picklable.

    Raises ``AssertionError`` with the child's traceback if one raises, with its exit code if
    one dies without a result, or if they are not all done within ``timeout`` seconds (the
    children are killed then)."""
    queue = WORKERS.Queue()
    children = [
        WORKERS.Process(target=_report, args=(target, tuple(args), i, queue), daemon=True)
        for i, args in enumerate(arguments)
    ]
    for child in children:
        child.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < len(children):
            try:
                index, ok, value = queue.get(timeout=0.5)
            except Empty:
                dead = [
                    (i, child.exitcode)
                    for i, child in enumerate(children)
                    if child.exitcode is not None and i not in results
                ]
                # A child that put its result may exit before the parent reads it: look again
                # before calling it dead.
                if dead and queue.empty():
                    raise AssertionError(
                        f"worker process(es) died without a result (index, exit code): {dead}"
                    ) from None
                assert time.monotonic() < deadline, (
                    f"the worker processes did not finish within {timeout:g} s "
                    f"({len(results)} of {len(children)} done)"
                )
                continue
            if not ok:
                raise AssertionError(f"worker process {index} failed:\n{value}")
            results[index] = value
        return [results[i] for i in range(len(children))]
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join(10)
