"""Threads drawing ids from a source through a failover, and what they saw: every id, every
error, the longest call, the longest a thread went without ids, and when traffic was back
(``tests/backend/test_patroni.py``, ``benchmarks/bench_failover.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PACE", "THREADS", "TRAFFIC_TIMEOUT", "Callers", "until"]

#: Threads per group of callers (uncached, cached).
THREADS = 3
#: Seconds a thread pauses between two calls: a steady application's rate. Unpaced, six
#: threads would take the two cores from the servers, and cached ones would draw millions of
#: ids to hold and compare.
PACE = 0.002
#: Seconds a phase of traffic may take on a loaded machine.
TRAFFIC_TIMEOUT = 60.0


class Callers:
    """:data:`THREADS` threads drawing blocks of 1, 2, 3... ids from one source until
    :meth:`stop`, and what they saw: every id, every error, the longest call, the longest a
    thread went without ids, and when a call made after :attr:`cut` first succeeded."""

    def __init__(self, name: str, source: Any) -> None:
        self.name = name
        self.source = source
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.ids: list[int] = []
        self.errors: list[BaseException] = []
        self.ok = 0
        self.high = 0
        self.longest_call = 0.0
        self.longest_without = 0.0
        #: Set to a time: :attr:`back_at` is then when a call started after it first succeeded.
        self.cut: float | None = None
        self.back_at: float | None = None
        self.threads = [
            threading.Thread(target=self._draw, args=(k,), name=f"{name}-{k}")
            for k in range(THREADS)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), f"a {self.name} caller hangs"

    def cut_at(self, moment: float) -> None:
        """From ``moment`` (monotonic) on, :attr:`back_at` waits for a call started after it."""
        with self.lock:
            self.cut = moment

    def _draw(self, k: int) -> None:
        mine: list[int] = []
        last_ok = time.monotonic()
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    block = self.source.next_block("photos", 1 + k)
                except Exception as error:  # noqa: BLE001 - kept, and judged by the test
                    with self.lock:
                        self.errors.append(error)
                        self.longest_call = max(self.longest_call, time.monotonic() - started)
                    self.stopping.wait(PACE)
                    continue
                ended = time.monotonic()
                mine.extend(block)
                with self.lock:
                    self.ok += 1
                    self.high = max(self.high, block[-1])
                    self.longest_call = max(self.longest_call, ended - started)
                    self.longest_without = max(self.longest_without, ended - last_ok)
                    if self.back_at is None and self.cut is not None and started > self.cut:
                        self.back_at = ended
                last_ok = ended
                self.stopping.wait(PACE)
        finally:
            with self.lock:
                self.ids.extend(mine)

    def draws(self, blocks: int, timeout: float = TRAFFIC_TIMEOUT) -> None:
        """Block until these callers have drawn ``blocks`` more blocks."""
        with self.lock:
            target = self.ok + blocks
        until(lambda: self.ok >= target, timeout,
               lambda: f"{self.name} callers at {self.ok} blocks of {target}, "
                       f"last errors {self.errors[-3:]!r}")

    def figures(self, since: float) -> str:
        """What the callers saw, for the printed report (``since``: the kill)."""
        kinds = sorted({type(e).__name__ for e in self.errors}) or ["none"]
        back = "-" if self.back_at is None else f"{self.back_at - since:.2f} s"
        return (f"{len(self.ids)} ids; {len(self.errors)} errors ({', '.join(kinds)}); "
                f"longest call {self.longest_call:.2f} s; longest a thread went without ids "
                f"{self.longest_without:.2f} s; first call made after the kill served {back} "
                "after it")


def until(check: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"after {timeout:.0f} s: {what()}"
        time.sleep(0.02)
