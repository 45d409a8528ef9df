"""`python -m <command>` for the tests without paying the imports each time: a fork of an interpreter that has
imported torch, timm and every vitsinks command once.

A test's command costs ~7 s of imports (torch, torchvision, timm) on two cores, and the suite runs about a hundred
of them. Here each command runs in a child process forked from a preloaded server (`multiprocessing`'s
forkserver: a fresh interpreter that imports the modules of `preload()` and runs nothing, so no thread pool is
forked), with the caller's environment, working directory and argv, stdout and stderr in files, and `runpy`
executing the module as `__main__` exactly as `python -m` does (the working directory first on the import path);
its exit status is the process's, after its threads are joined and its atexit handlers run. What differs from a
fresh interpreter: the preloaded modules are already imported, the import path keeps the server's entries after the
working directory, and the hash seed is the server's (Python's and numpy's global generators are reseeded from
entropy). `run_command` (tests/helpers/commands.py) takes this path for `[sys.executable, "-m", module, ...]`;
anything else, an environment that changes a variable read at import time (`IMPORT_TIME`) and
`VITSINKS_TEST_FRESH=1` get a fresh interpreter, and the SLURM jobs always start their own.
"""

from __future__ import annotations

import atexit
import importlib.util
import multiprocessing
import os
import random
import runpy
import sys
import threading
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

lock = threading.Lock()  # starting and polling children: multiprocessing's bookkeeping is not thread-safe
_context: multiprocessing.context.ForkServerContext | None = None
_server_env: dict[str, str] | None = None
# variables read at import time (the interpreter's, OpenMP's, torch's, timm's, huggingface_hub's: HF_ENDPOINT,
# HF_HOME, ...): fixed when the server starts
IMPORT_TIME = ("PYTHON", "OMP_", "MKL_", "KMP_", "TORCH", "TIMM_", "HF_")


def _import_time(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME)}


def fits(env: Mapping[str, str]) -> bool:
    """A command with environment `env` can run in the server: its import-time variables are the server's."""
    return _import_time(env) == _import_time(os.environ if _server_env is None else _server_env)


def preload() -> list[str]:
    """The modules the server imports: torch, timm and every command of the package (`python -m vitsinks`)."""
    from vitsinks.__main__ import PACKAGE, commands

    names = ["torch", "torchvision", "timm", "tests.helpers.preloaded"]
    for name in commands():
        names.append(name)
        if (PACKAGE.parent / Path(*name.split(".")) / "__main__.py").is_file():
            names.append(name + ".__main__")  # its main guard keeps it from running
    return names


def _serve(module: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, out: str, err: str) -> None:
    """The child: run `module` as `python -m` would, then exit with its status."""
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # python -m puts the working directory first on the import path
    sys.argv = [module, *argv]
    multiprocessing.set_start_method(None, force=True)  # the platform's default for its own children, not ours
    random.seed()
    np.random.seed()  # a fresh interpreter's global generators start from entropy (torch's from its fixed seed)
    spec = importlib.util.find_spec(module)
    package = spec is not None and spec.submodule_search_locations is not None
    sys.modules.pop(module + ".__main__" if package else module, None)  # run afresh as __main__, as python -m does
    code: int = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 - an uncaught exception is a traceback and status 1, as in python -m
        traceback.print_exc()
        code = 1
    try:  # what the interpreter does at exit (multiprocessing's children skip it): join threads, then atexit
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def start(module: str, argv: Sequence[str], env: Mapping[str, str], cwd: str, out: Path,
          err: Path) -> multiprocessing.process.BaseProcess:
    """Start `python -m module argv...` in a fork of the preloaded server (started on first use)."""
    global _context, _server_env
    with lock:
        if _context is None:
            _context = multiprocessing.get_context("forkserver")
            _server_env = dict(os.environ)
            _context.set_forkserver_preload(preload())
        proc = _context.Process(target=_serve, args=(module, list(argv), dict(env), cwd, str(out), str(err)))
        proc.start()
    return proc
