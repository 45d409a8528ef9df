"""A source for the post-hoc (train-free) edits: a tiny checkpoint with a planted register neuron; the command line
of a quick derivation and the status a derived run writes."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.helpers.register_neuron import plant_register_neuron
from tests.helpers.tiny import tiny_cfg
from vitsinks.configs.schema import to_container
from vitsinks.models import model_from_config
from vitsinks.run.derive import fit_images
from vitsinks.train.checkpoint import save_state
from vitsinks.utils.rundir import RunDir


def source_checkpoint(runs: Path, *overrides: str, planted: bool = True, extra: dict | None = None) -> Path:
    """`runs/src/checkpoints/last.pt`: a tiny 3-block model (nothing trained), with the planted register neuron
    calibrated on the TRAIN images the edit is fitted on."""
    cfg = tiny_cfg(runs, "name=src", "model.depth=3", *overrides)
    torch.manual_seed(0)
    model = model_from_config(cfg.model)
    if planted:
        plant_register_neuron(model, fit_images(model, cfg.data, cfg.seed, 8, cfg.selection))
    path = RunDir(runs / "src").last
    path.parent.mkdir(parents=True, exist_ok=True)
    save_state({"config": to_container(cfg), "model": model.state_dict(), **(extra or {})}, path)
    return path


def mean_massive_args(runs: Path, path: Path, *extra: str) -> list[str]:
    """The command line of a quick mean_massive derivation of `path` under `runs` (no plots, no page), then `extra`."""
    return [f"ckpt={path}", "method=mean_massive", "fit_images=4", f"runs_dir={runs}", "diagnostics.n_images=4",
            "diagnostics.plots=false", "diagnostics.report=false", *extra]


def run_status(run: Path) -> dict:
    """The run's status.json."""
    return json.loads((run / "status.json").read_text())
