"""What the evaluation CLIs share: the backbone of a checkpoint, the data to use, where results go."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hydra
import torch.distributed as dist
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from torch.utils.data import Dataset, Subset

from vitsinks.config import config_dir, register_configs
from vitsinks.diagnose import load_backbone
from vitsinks.distributed import init_distributed, is_distributed
from vitsinks.models import SinkViT


def data_overridden() -> bool:
    """Whether the command line chose the data (else the checkpoint's training data is used)."""
    try:
        task = HydraConfig.get().overrides.task
    except ValueError:  # not under a Hydra main (called from Python)
        return True
    return any(o.split("=")[0].lstrip("+").startswith("data") for o in task)


def setup(cfg: DictConfig) -> tuple[SinkViT, DictConfig, Path]:
    """(frozen backbone on this rank's device, data config, results folder `<run>/results`) for `cfg.ckpt`."""
    if not cfg.ckpt:
        raise FileNotFoundError("pass the checkpoint to evaluate: ckpt=runs/<name>/checkpoints/last.pt")
    path = Path(cfg.ckpt)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} not found")
    model, ckpt_cfg = load_backbone(path)
    dist_info = init_distributed(cfg.cluster.device)
    model = model.to(dist_info.device).eval().requires_grad_(False)
    data = cfg.data if data_overridden() else ckpt_cfg.data
    return model, data, path.parent.parent / "results"


def limit(ds: Dataset, n: int | None) -> Dataset:
    """The first `n` items of `ds` (all when n is None or larger), keeping its `num_classes`."""
    if not n or n >= len(ds):  # type: ignore[arg-type]
        return ds
    sub = Subset(ds, range(n))
    if hasattr(ds, "num_classes"):
        sub.num_classes = ds.num_classes  # type: ignore[attr-defined]
    return sub


def write_result(path: Path, result: dict[str, Any]) -> None:
    """Write a result JSON atomically, once (rank 0)."""
    if is_distributed() and dist.get_rank() != 0:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def hydra_cli(fn: Callable[[DictConfig], dict[str, Any]]) -> Callable[[], None]:
    """A Hydra entry point around `fn(cfg) -> result`, with one-line errors for bad input."""

    def main(cfg: DictConfig) -> None:
        try:
            fn(cfg)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(1)

    register_configs()
    return hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(main)
