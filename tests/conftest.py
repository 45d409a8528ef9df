"""Shared fixtures: tiny configurations that train in seconds on a CPU."""

from __future__ import annotations

import os
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


SLURM_BIN = Path(os.environ.get("VITSINKS_SLURM_DIR", "/tmp/vitsinks-slurm")) / "bin"
if SLURM_BIN.is_dir() and str(SLURM_BIN) not in os.environ.get("PATH", ""):
    os.environ["PATH"] = f"{SLURM_BIN}{os.pathsep}{os.environ.get('PATH', '')}"  # the local cluster's sacct


def require_slurm() -> None:
    """Skip without a responding SLURM, except under CI (CI=true), where a skip would hide a broken cluster."""
    import shutil
    import subprocess

    ok = shutil.which("sbatch") is not None and subprocess.run(["sinfo", "-h"], capture_output=True).returncode == 0
    if not ok:
        reason = "no responding SLURM (start one: bash slurm/local-cluster.sh start)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the SLURM tests")
        pytest.skip(reason)
