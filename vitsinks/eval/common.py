"""What the evaluation CLIs share: the backbone of a checkpoint, the data to use, where results go."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig
from torch.utils.data import Dataset, Subset

from vitsinks.configs.cli import cli_keys, data_overrides, pick_data, pick_seed
from vitsinks.data.selection import permutation
from vitsinks.models import SinkViT
from vitsinks.train.checkpoint import load_backbone
from vitsinks.utils import files
from vitsinks.utils.distributed import init_distributed, rank_world
from vitsinks.utils.errors import InputNotFound
from vitsinks.utils.results import Result
from vitsinks.utils.rundir import RunDir, analyses_dir


def setup(cfg: DictConfig, data: DictConfig | None = None) -> tuple[SinkViT, DictConfig, RunDir, int]:
    """(frozen backbone on this rank's device, data config, the checkpoint's run directory, the probes' seed) for
    `cfg.ckpt`; a loose checkpoint file's run directory is quantize's, `<runs_dir>/quant/<file name>`. The data is
    `data` if given, else as `cli.pick_data` decides (the checkpoint's training data unless the command line chose
    other data); the seed as `cli.pick_seed` does (the checkpoint's training seed unless the command line gave one)."""
    if not cfg.ckpt:
        raise InputNotFound("pass the model to evaluate: ckpt=runs/<name>/checkpoints/last.pt or "
                            "model.pretrained=<timm name or file>")
    path = Path(cfg.ckpt)
    model, ckpt_cfg = load_backbone(path)
    dist_info = init_distributed(cfg.cluster.device)
    model = model.to(dist_info.device).eval().requires_grad_(False)
    if data is None:
        data = pick_data(cfg.data, ckpt_cfg.data, data_overrides())
    seed = pick_seed(cfg.seed, ckpt_cfg.get("seed", cfg.seed), cli_keys())
    return model, data, RunDir(analyses_dir(path, "quant", cfg.runs_dir)), seed


def limit(ds: Dataset, n: int | None, seed: int = 0) -> Dataset:
    """`n` items of `ds`, the first n of a permutation seeded `seed` (`vitsinks.data.selection`: never the first n
    files of a class-sorted split), all when n is None or larger; keeps its `num_classes`."""
    if not n or n >= len(ds):  # type: ignore[arg-type]
        return ds
    sub = Subset(ds, permutation(len(ds), seed)[:n])  # type: ignore[arg-type]
    if hasattr(ds, "num_classes"):
        sub.num_classes = ds.num_classes  # type: ignore[attr-defined]
    return sub


def write_result(path: Path, result: Result) -> None:
    """Write a typed result's JSON atomically, once (rank 0)."""
    if rank_world()[0] == 0:
        files.write_json(path, result.to_json())
