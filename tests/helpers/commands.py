"""Running the commands as a user does (`python -m vitsinks.<command> ...`), watched for a hang, and reading their
one-line errors."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers import preloaded


def run_command(args: Sequence[str], idle_s: float = 300, **kwargs: Any) -> subprocess.CompletedProcess:
    """Run a command to its end, capturing text stdout/stderr like `subprocess.run(capture_output=True, text=True)`;
    stop it only when it has written nothing for `idle_s` seconds (a hung command), never for being slow on a
    loaded machine: a command that keeps printing progress runs as long as it needs. `python -m` commands run in a
    fork of a preloaded interpreter (tests/helpers/preloaded.py), anything else in a fresh process."""
    args = list(args)
    env = os.environ if kwargs.get("env") is None else kwargs["env"]
    if (len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and set(kwargs) <= {"env", "cwd"}
            and preloaded.fits(env) and not os.environ.get("VITSINKS_TEST_FRESH")):
        return _run_preloaded(args, idle_s, dict(env), str(kwargs.get("cwd") or os.getcwd()))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    last = [time.monotonic()]

    def pump(stream, key: str) -> None:
        for piece in iter(lambda: os.read(stream.fileno(), 65536), b""):  # whatever arrived, \r progress bars too
            chunks[key].append(piece)
            last[0] = time.monotonic()

    threads = [threading.Thread(target=pump, args=(s, k), daemon=True) for s, k in ((proc.stdout, "out"),
                                                                                      (proc.stderr, "err"))]
    for th in threads:
        th.start()
    while proc.poll() is None:
        if time.monotonic() - last[0] > idle_s:
            proc.kill()
            raise subprocess.TimeoutExpired(args, idle_s, b"".join(chunks["out"]), b"".join(chunks["err"]))
        time.sleep(0.2)
    for th in threads:
        th.join()
    out, err = (b"".join(chunks[k]).decode(errors="replace") for k in ("out", "err"))
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _run_preloaded(args: list[str], idle_s: float, env: dict[str, str], cwd: str) -> subprocess.CompletedProcess:
    """`run_command` of `python -m module ...` in a fork of the preloaded interpreter (same watch for a hang)."""
    with tempfile.TemporaryDirectory(prefix="vitsinks-cmd-") as tmp:
        paths = Path(tmp) / "stdout", Path(tmp) / "stderr"
        proc = preloaded.start(args[2], args[3:], env, cwd, *paths)
        last, seen = time.monotonic(), (0, 0)
        while True:
            with preloaded.lock:
                if not proc.is_alive():
                    break
            time.sleep(0.2)
            sizes = tuple(p.stat().st_size if p.exists() else 0 for p in paths)
            if sizes != seen:
                last, seen = time.monotonic(), sizes
            elif time.monotonic() - last > idle_s:
                with preloaded.lock:
                    proc.kill()
                    proc.join()
                out, err = (p.read_bytes() if p.exists() else b"" for p in paths)
                raise subprocess.TimeoutExpired(args, idle_s, out, err)
        out, err = (p.read_bytes().decode(errors="replace") if p.exists() else "" for p in paths)
    return subprocess.CompletedProcess(args, proc.exitcode, out, err)


def run_commands(commands: Sequence[Sequence[str]], idle_s: float = 300,
                 **kwargs: Any) -> list[subprocess.CompletedProcess]:
    """`run_command` of every command at once (their start-up, mostly imports, overlaps on the cores), results in
    the order given."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(commands))) as pool:
        return list(pool.map(lambda c: run_command(c, idle_s=idle_s, **kwargs), commands))


def run_module(module: str, *args: str, idle_s: float = 300, **kwargs: Any) -> subprocess.CompletedProcess:
    """`python -m module args...` through `run_command`."""
    return run_command([sys.executable, "-m", module, *args], idle_s=idle_s, **kwargs)


def launch(*args: str) -> subprocess.CompletedProcess:
    """`python -m vitsinks.launch args...` through `run_command`."""
    return run_command([sys.executable, "-m", "vitsinks.launch", *args])


def one_line_error(out: subprocess.CompletedProcess, code: int = 1) -> str:
    """The error line of a failed command: exactly one `error: ` line, the last one, and no traceback (progress bars
    of the work done before the problem was found may precede it)."""
    assert out.returncode == code, (out.returncode, out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.replace("\r", "\n").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0] and "Traceback" not in out.stderr, out.stderr
    return errors[0]
