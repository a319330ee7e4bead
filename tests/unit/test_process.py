"""The fork/exit hub: one registration with the interpreter, a written-down order, failures
contained, thread-safe registration, and a child that never hangs on a lock a parent thread held.

Each case runs in a fresh interpreter: the hooks are process-wide and fire at fork and at exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "sqlalchemy_tickets"

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")


def _python(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=timeout,
    )


def test_one_place_registers_fork_and_exit_hooks() -> None:
    """No module but ``_process`` talks to ``os.register_at_fork`` or ``atexit`` directly."""
    offenders = {
        str(path.relative_to(SRC)): pattern
        for path in SRC.rglob("*.py")
        for pattern in (r"os\.register_at_fork\(", r"\batexit\.register\b", r"^\s*import atexit")
        if path.name != "_process.py" and re.search(pattern, path.read_text(), re.M)
    }
    assert offenders == {}
    hub = (SRC / "_process.py").read_text()
    assert len(re.findall(r"os\.register_at_fork\(", hub)) == 1


@needs_fork
def test_fork_callbacks_run_in_order_on_both_sides() -> None:
    result = _python("""
        import os
        from sqlalchemy_tickets import _process

        log = []
        for name in "ab":
            _process.before_fork(lambda name=name: log.append("before-" + name))
            _process.after_fork_in_parent(lambda name=name: log.append("parent-" + name))
            _process.after_fork_in_child(lambda name=name: log.append("child-" + name))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, " ".join(log).encode())
            os._exit(0)
        os.close(write)
        child = os.read(read, 1000).decode()
        os.waitpid(pid, 0)
        print(child)
        print(" ".join(log))
    """)
    assert result.returncode == 0, result.stderr
    child, parent = result.stdout.splitlines()
    assert child == "before-b before-a child-a child-b"
    assert parent == "before-b before-a parent-a parent-b"


@needs_fork
def test_a_failing_fork_callback_is_logged_and_the_rest_still_run() -> None:
    result = _python("""
        import logging, os
        from sqlalchemy_tickets import _process

        logging.basicConfig(level=logging.ERROR)
        def broken():
            raise RuntimeError("boom in child")
        ran = []
        _process.after_fork_in_child(broken)
        _process.after_fork_in_child(lambda: ran.append(1))
        pid = os.fork()
        if pid == 0:
            os._exit(0 if ran == [1] else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"
    assert "after fork in child hook" in result.stderr and "boom in child" in result.stderr


def test_exit_callbacks_run_once_last_registered_first_despite_failures() -> None:
    result = _python("""
        import logging
        from sqlalchemy_tickets import _process

        logging.basicConfig(level=logging.ERROR)
        def first():
            print("first")
        def broken():
            raise RuntimeError("boom at exit")
        def last():
            print("last")
        _process.at_exit(first)
        _process.at_exit(broken)
        assert _process.at_exit(last) is last
        _process.at_exit(first)  # already registered: still runs once
        print("main done")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["main", "done", "last", "first"]
    assert "at exit hook" in result.stderr and "boom at exit" in result.stderr


def test_registration_from_many_threads_loses_nothing() -> None:
    result = _python("""
        import sys, threading
        from sqlalchemy_tickets import _process

        class Hook:
            # Comparing runs Python code, so threads switch in the middle of a registration.
            def __eq__(self, other):
                return self is other
            __hash__ = object.__hash__
            def __call__(self):
                pass

        sys.setswitchinterval(1e-6)
        THREADS, EACH = 8, 300
        barrier = threading.Barrier(THREADS)
        before = len(_process._callbacks["at_exit"])  # the package's own
        def register():
            barrier.wait()
            for _ in range(EACH):
                _process.at_exit(Hook())
        threads = [threading.Thread(target=register) for _ in range(THREADS)]
        for t in threads: t.start()
        for t in threads: t.join()
        print(len(_process._callbacks["at_exit"]) - before)
    """)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == 8 * 300


@needs_fork
def test_child_can_register_although_a_parent_thread_held_the_lock_at_fork() -> None:
    """A thread of the parent is mid-registration when another thread forks: the child, where
    that thread no longer exists, must still be able to register (a stale lock would hang it)."""
    result = _python("""
        import os, select, signal, threading
        from sqlalchemy_tickets import _process

        held, release = threading.Event(), threading.Event()
        def registering_thread():
            with _process._lock:  # what a registration in progress looks like at fork time
                held.set()
                release.wait()
        thread = threading.Thread(target=registering_thread)
        thread.start()
        held.wait()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _process.at_exit(lambda: None)
            os.write(write, b"registered")
            os._exit(0)
        release.set()
        thread.join()
        answered, _, _ = select.select([read], [], [], 20)
        if not answered:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        print("registered" if answered else "child hung")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "registered"


def test_without_fork_support_everything_imports_and_exit_hooks_still_run() -> None:
    """Windows has no ``os.register_at_fork``: the package imports and closes caches at exit."""
    result = _python("""
        import os, pkgutil, importlib
        del os.fork, os.register_at_fork  # as on Windows (the stdlib checks for fork)
        import sqlalchemy_tickets
        from sqlalchemy_tickets import _process
        for info in pkgutil.walk_packages(sqlalchemy_tickets.__path__, "sqlalchemy_tickets."):
            if not any(part.startswith("_") for part in info.name.split(".")[1:]):
                importlib.import_module(info.name)
        _process.after_fork_in_child(lambda: None)  # kept, never called
        _process.at_exit(lambda: print("exit hook ran"))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "exit hook ran"


def test_a_non_callable_is_refused() -> None:
    from sqlalchemy_tickets import _process

    with pytest.raises(TypeError, match="callable"):
        _process.at_exit(42)  # type: ignore[arg-type]
