"""Commands killed mid-write (SIGKILL at a chosen point, planted in the command's own process), and what such a kill
leaves behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def killed(module: str, argv: list[str], at: str) -> subprocess.CompletedProcess:
    """The command `module.cli(argv)` in a fresh interpreter that kills itself (SIGKILL) at `at`: `fsync:<name>` when
    it is about to fsync a temp file of `<name>` (inside an atomic write), else when the function `<module>.<name>`
    is called."""
    where, _, what = at.partition(":")
    plant = f"""
        real = os.fsync
        def fsync(fd):
            if os.path.basename(os.readlink(f"/proc/self/fd/{{fd}}")).startswith(".{what}."):
                os.kill(os.getpid(), signal.SIGKILL)
            real(fd)
        os.fsync = fsync
    """ if where == "fsync" else f"""
        import {where.rsplit('.', 1)[0]} as target
        setattr(target, "{where.rsplit('.', 1)[1]}", lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL))
    """
    script = "import os, signal\n" + textwrap.dedent(plant) + f"import {module} as command\ncommand.cli({argv!r})\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)


def staging(folder: Path) -> list[Path]:
    """The staging folders and temp files of killed writes under `folder`."""
    return sorted(p for p in folder.rglob(".*") if p.name.endswith(".tmp"))
