"""Shared fixtures: tiny configurations that train in seconds on a CPU."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from omegaconf import DictConfig

from vitsinks.configs.schema import load_config

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


def require_fashion_mnist() -> None:
    """Skip without the Debian package dataset-fashion-mnist, except under CI (CI=true), which installs it."""
    from vitsinks.data import FASHION_MNIST_ROOT

    if not Path(FASHION_MNIST_ROOT).is_dir():
        reason = "Debian package dataset-fashion-mnist absent (apt-get install dataset-fashion-mnist)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{reason}; CI must run the Fashion-MNIST tests")
        pytest.skip(reason)


@pytest.fixture
def figures(monkeypatch) -> list:
    """Every matplotlib figure saved during the test, in order, kept open so a test can read the data it draws."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    savefig = Figure.savefig

    def record(self: Figure, *args, **kwargs):
        drawn.append(self)
        return savefig(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", record)
    monkeypatch.setitem(plt.rcParams, "figure.max_open_warning", 0)
    monkeypatch.setattr(plt, "close", lambda *args, **kwargs: None)
    return drawn


def bar_heights(ax) -> list[float]:
    """Heights of an axes' bars, in drawing order."""
    return [p.get_height() for p in ax.patches]
