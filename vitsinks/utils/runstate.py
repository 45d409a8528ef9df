"""What the files of a run and of a sweep say about their state, read without the code that makes them
(`vitsinks.run.sweep`, the trainer): whether a process holds a run's lock (`lock_held`, `locked_here`) and a
sweep's manifest, `sweep.json` (`write_manifest`, `read_manifest`). The leaderboard reads them too."""

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
    """Whether a process holds the run's lock (`<run>/.lock`, flocked by the process that trains it), probed with a
    shared lock taken and dropped at once (nothing is written); None where it cannot tell (no flock there, no
    permission)."""
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
    """Whether the run's last writer ran on this machine (its `.lock` records `pid N on <host>`), where the lock probe
    can see it: flock may be local to a node (Lustre -o localflock), so a run of another node is never called killed
    from here."""
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
