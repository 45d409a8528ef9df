"""Metric logging: one JSON line per log step in `metrics.jsonl`, mirrored to wandb (online/offline/disabled)."""

from __future__ import annotations

import hashlib
import json
import netrc
import os
from pathlib import Path
from typing import Any, Literal, cast

from vitsinks.configs.schema import WandbConfig
from vitsinks.utils import files
from vitsinks.utils.metrics_log import RERUN
from vitsinks.utils.rundir import RunDir

WandbMode = Literal["online", "offline", "disabled"]  # what `wandb_mode` gives (WANDB_MODE: wandb checks it)


def wandb_mode(cfg: WandbConfig) -> str:
    """Resolve `auto`: online only when an API key is configured (env or ~/.netrc), else offline."""
    if cfg.mode != "auto":
        return str(cfg.mode)
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        if netrc.netrc().authenticators("api.wandb.ai"):
            return "online"
    except (FileNotFoundError, netrc.NetrcParseError):
        pass
    return "offline"


class Tracker:
    """Appends metrics to `<run>/metrics.jsonl` and logs them to wandb; a no-op on ranks other than 0."""

    def __init__(self, run_dir: Path, cfg: WandbConfig, name: str, config: dict[str, Any], active: bool = True,
                 resume_step: int = 0) -> None:
        self.active = active
        self.path = RunDir(run_dir).metrics
        self.run = None
        if not active:
            return
        if resume_step == 0 or not self.path.exists():
            files.write_text(self.path, "")
        else:  # drop lines logged after the checkpoint we resume from (they will be logged again) and a torn last one
            kept = [m for m in files.read_jsonl(self.path, RERUN) if m.get("step", 0) <= resume_step]
            files.write_text(self.path, "".join(json.dumps(m) + "\n" for m in kept))
        mode = wandb_mode(cfg)
        if mode != "disabled":
            import wandb

            self.run = wandb.init(project=cfg.project, entity=cfg.entity, name=name, id=_wandb_id(name, run_dir),
                                  dir=str(run_dir), mode=cast(WandbMode, mode), config=config, resume="allow",
                                  settings=wandb.Settings(console="off", silent=True))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def logged_at(self, step: int) -> list[dict[str, Any]]:
        """The lines logged at `step` (read back from metrics.jsonl; none on a rank that does not log)."""
        if not self.active or not self.path.exists():
            return []
        return [m for m in files.read_jsonl(self.path, RERUN) if m.get("step") == step]

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def _wandb_id(name: str, run_dir: Path) -> str:
    """A stable wandb id per run directory, so a resumed run continues the same wandb run."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:48] + "-" + digest

