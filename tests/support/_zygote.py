"""The process :mod:`support.forked` starts: it imports the given modules once, then forks a
child per request, read as a JSON line on its standard input, and answers with the child's pid,
then its exit status. Each child is a real process: its own working directory, environment,
``sys.argv``, standard streams (files the parent reads), exit status and interpreter exit.

Run as ``python _zygote.py module...``; not imported.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import runpy
import sys
from typing import Any, NoReturn


def _child(request: dict[str, Any]) -> NoReturn:
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    os.dup2(os.open(request["out"], flags, 0o600), 1)
    os.dup2(os.open(request["err"], flags, 0o600), 2)
    kind, name = request["kind"], request["name"]
    if kind == "module":  # python -m name: the working directory first on the path
        sys.path[0] = os.getcwd()
        sys.argv = [name, *request["args"]]
        runpy.run_module(name, run_name="__main__", alter_sys=True)
        raise SystemExit(0)
    if kind == "path":  # python path/to/script.py: its directory first on the path
        sys.path[0] = os.path.dirname(os.path.abspath(name))
        sys.argv = [name, *request["args"]]
        runpy.run_path(name, run_name="__main__")
        raise SystemExit(0)
    # A console script: its directory first on the path, its entry point's result the status.
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=name)
    sys.path[0] = os.path.dirname(request["script"])
    sys.argv = [request["script"], *request["args"]]
    raise SystemExit(entry.load()())


def main() -> None:
    preload = sys.argv[1:]
    sys.argv[1:] = []
    # The control channel moves off the standard streams, which the children take over.
    control_in = os.fdopen(os.dup(0), "r")
    control_out = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    for module in preload:
        try:
            importlib.import_module(module)
        except ImportError:
            pass  # the children import it, and fail, as a fresh process would
    for line in control_in:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            control_in.close()
            control_out.close()
            _child(request)  # raises SystemExit: the interpreter exits as any process does
        control_out.write(json.dumps({"pid": pid}) + "\n")
        control_out.flush()
        _, status = os.waitpid(pid, 0)
        control_out.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        control_out.flush()


if __name__ == "__main__":
    main()
