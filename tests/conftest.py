"""Shared fixtures: tiny configurations that train in seconds on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig

from vitsinks.config import load_config

TINY = [
    "model.depth=2", "model.img_size=32", "model.embed_dim=48", "model.num_heads=3",
    "views.global_size=32", "views.local_size=16", "views.n_local=2",
    "objective.proj_hidden=64", "objective.proj_out=32", "objective.slices=128",
    "data.image_size=32", "data.train_size=64", "data.val_size=32", "data.num_classes=4",
    "train.batch_size=16", "train.epochs=2", "train.log_every=1", "train.ckpt_every=3", "wandb.mode=disabled",
    "diagnostics.enabled=false",
]


def tiny_cfg(runs: Path, *overrides: str) -> DictConfig:
    """A tiny run configuration under `runs`; later overrides win."""
    return load_config([*TINY, f"runs_dir={runs}", *overrides])


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"
