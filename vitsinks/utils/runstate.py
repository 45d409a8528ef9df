"""The state of runs and sweeps read from their files: whether a process holds a run's lock (`lock_held`,
`locked_here`) and a sweep's manifest, `sweep.json` (`write_manifest`, `read_manifest`)."""

from __future__ import annotations

import fcntl
import socket
import time
from pathlib import Path
from typing import Any

from vitsinks.utils import files
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.rundir import RunDir


def lock_held(run: RunDir) -> bool | None:
    """Whether a process holds the run's lock (`<run>/.lock`), probed with a shared lock taken and dropped at once;
    None where it cannot tell (no flock there, no permission)."""
    try:
        with run.lock_file.open("rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False
    except FileNotFoundError:
        return False  # never locked: no process trains it
    except OSError:
        return None


def locked_here(run: RunDir) -> bool:
    """Whether the run's last writer ran on this machine (its `.lock` records `pid N on <host>`): flock may be local
    to a node (Lustre -o localflock), so only here can the lock probe tell a killed run."""
    try:
        said = run.lock_file.read_text().strip()
    except OSError:
        return True  # never locked: nothing can hold it anywhere
    return not said or said.endswith(f" on {socket.gethostname()}")


def write_manifest(path: Path, entries: list[dict[str, Any]], **meta: Any) -> None:
    files.write_json(path, {"updated": time.strftime("%Y-%m-%d %H:%M:%S"), **meta, "runs": entries})


def read_manifest(sweep: str | Path) -> dict[str, Any]:
    path = Path(sweep)
    path = path / "sweep.json" if path.is_dir() else path
    if not path.is_file():
        raise InputNotFound(f"no sweep manifest at {path}: pass the folder printed when the sweep was launched")
    return files.read_json(path, "relaunch the sweep (python -m vitsinks.launch -m ...)")
