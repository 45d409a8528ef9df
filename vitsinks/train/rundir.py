"""A run's directory: one writer at a time, its resolved config, status.json, checkpoints and resuming.

    <runs_dir>/<name>/config.yaml      the resolved config of the latest launch
                      status.json      running | finished | interrupted | failed, with the step (read by sweeps)
                      metrics.jsonl    (vitsinks.train.tracking)
                      checkpoints/     last.pt and step_XXXXXXX.pt, written atomically, never with NaN weights
                      .lock            held while a process trains the run
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO, Any

from omegaconf import DictConfig, OmegaConf

from vitsinks.train import checkpoint as ckpt
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue


class RunDir:
    """The files of one run. Only the main rank writes; `lock()` refuses a second process on the same run."""

    def __init__(self, path: Path, is_main: bool = True) -> None:
        self.path, self.is_main = Path(path), is_main
        self.ckpt_dir = self.path / "checkpoints"
        self._lock: IO | None = None

    @property
    def last(self) -> Path:
        return self.ckpt_dir / "last.pt"

    def lock(self) -> None:
        """Take the run's lock (until `unlock` or the process ends); another live writer is a `BadValue`."""
        if not self.is_main or self._lock is not None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        f = (self.path / ".lock").open("a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise BadValue(f"run directory {self.path} is being written by {holder}: wait for it to finish, or give "
                           f"this run another name (name=...)") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        self._lock = f

    def unlock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None

    def start(self, cfg: DictConfig) -> None:
        """Before training: remove the temp files of killed writes, write the resolved config."""
        if not self.is_main:
            return
        for leftover in files.remove_leftovers(self.ckpt_dir) + files.remove_leftovers(self.path):
            print(f"removed {leftover} (left by a write that was killed)", flush=True)
        files.write_text(self.path / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))

    def write_status(self, status: str, **info: Any) -> None:
        """`status.json`, atomically (sweeps read it while the run writes it)."""
        if self.is_main and self.path.is_dir():
            files.write_json(self.path / "status.json", {"status": status, **info})

    def save(self, state: dict[str, Any], step: int, periodic: bool) -> None:
        """`last.pt`, and `step_XXXXXXX.pt` when `periodic`; refuses non-finite weights (`NonFinite`)."""
        ckpt.save_state(state, self.last)
        if periodic:
            ckpt.save_state(state, self.ckpt_dir / f"step_{step:07d}.pt")

    def latest(self) -> str:
        """The newest checkpoint on disk, for messages: its path, or that there is none yet."""
        found = ckpt.resume_candidates(self.ckpt_dir)
        return f"{found[0]} is the last good checkpoint" if found else \
            f"no checkpoint was written yet (a relaunch starts {self.path.name} from step 0)"

    def resume_state(self) -> tuple[Path, dict[str, Any]] | None:
        """(path, state) of the newest usable checkpoint (see `checkpoint.load_for_resume`), saying what it passed
        over."""
        found = ckpt.load_for_resume(self.ckpt_dir)
        if found is None:
            return None
        path, state, notes = found
        if self.is_main:
            for note in notes:
                print(f"warning: passed over {note}", flush=True)
            print(f"resuming from {path} at step {state['progress']['step']}", flush=True)
        return path, state
