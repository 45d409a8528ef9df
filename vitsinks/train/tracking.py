"""Metric logging: one JSON line per log step in `metrics.jsonl`, mirrored to wandb (online/offline/disabled)."""

from __future__ import annotations

import hashlib
import json
import netrc
import os
from pathlib import Path
from typing import Any

from vitsinks.configs.schema import WandbConfig
from vitsinks.utils import files


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
        self.path = run_dir / "metrics.jsonl"
        self.run = None
        if not active:
            return
        if resume_step == 0 or not self.path.exists():
            files.write_text(self.path, "")
        else:  # drop lines logged after the checkpoint we resume from: they will be logged again
            lines = [ln for ln in self.path.read_text().splitlines() if ln and json.loads(ln)["step"] <= resume_step]
            files.write_text(self.path, "".join(ln + "\n" for ln in lines))
        mode = wandb_mode(cfg)
        if mode != "disabled":
            import wandb

            self.run = wandb.init(project=cfg.project, entity=cfg.entity, name=name, id=_wandb_id(name, run_dir),
                                  dir=str(run_dir), mode=mode, config=config, resume="allow",
                                  settings=wandb.Settings(console="off", silent=True))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        if not self.active:
            return
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **metrics}) + "\n")
        if self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def _wandb_id(name: str, run_dir: Path) -> str:
    """A stable wandb id per run directory, so a resumed run continues the same wandb run."""
    digest = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)[:48] + "-" + digest


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All metric lines of a run."""
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
