"""Runs to export, made without training: a run folder (config.yaml) whose `checkpoints/last.pt` holds a tiny ViT with
weights moved away from their init, and the committed first run's files (eval/first_run/inputs) as a run's results."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from tests.helpers.tiny import tiny_cfg
from vitsinks.configs.schema import to_container
from vitsinks.configs.upgrade import upgrade
from vitsinks.models import model_from_config
from vitsinks.train.checkpoint import save_state
from vitsinks.utils.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]
FIRST_RUN = ROOT / "eval" / "first_run" / "inputs" / "gate+reg-vit_mini-synthetic-s0"
STEP = 7  # the planted checkpoint's step


def write_checkpoint(run: RunDir, cfg: DictConfig, step: int = STEP, seed: int = 0) -> Path:
    """`run`'s `checkpoints/last.pt`: the model of `cfg` with every weight moved (seeded), at `step`."""
    torch.manual_seed(seed)
    model = model_from_config(cfg.model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    save_state({"config": to_container(cfg), "model": model.state_dict(),
                "progress": {"epoch": 1, "batch": 0, "step": step}}, run.last)
    return run.last


def make_run(runs: Path, name: str, *overrides: str) -> RunDir:
    """A tiny run `runs/<name>` (config.yaml and last.pt) of the tiny config with `overrides`."""
    cfg = tiny_cfg(runs, f"name={name}", *overrides)
    run = RunDir(runs / name)
    run.start(cfg)
    write_checkpoint(run, cfg)
    return run


def first_run(runs: Path) -> RunDir:
    """The committed first run's files (config, metrics, results, final diagnosis) as a run under `runs`, with a
    last.pt of its architecture (`vit_mini`, gate+reg) and its own config."""
    run = RunDir(runs / FIRST_RUN.name)
    shutil.copytree(FIRST_RUN, run.path)
    write_checkpoint(run, upgrade(OmegaConf.load(run.config)))
    return run
