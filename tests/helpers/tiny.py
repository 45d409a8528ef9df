"""The one tiny ViT of the tests (2 blocks, 3 heads, 32 px in 8 px patches: 16 patches + [CLS]): `TINY` is a tiny
run of it (config overrides), `tiny_vit` the model itself, `tiny_cfg` a tiny run's configuration, `images` inputs of
its size; `trained` a checkpoint of one training step and `eval_cfg` the probes' settings over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from vitsinks.configs.schema import load_config
from vitsinks.models import SinkViT, build_vit

TINY_VIT = {"img_size": 32, "patch_size": 8, "embed_dim": 48, "depth": 2, "num_heads": 3}
TINY = [
    "model=vit_cpu", *(f"model.{k}={v}" for k, v in TINY_VIT.items()),
    "views.global_size=32", "views.local_size=16", "views.n_local=2",
    "objective.proj_hidden=64", "objective.proj_out=32", "objective.slices=128",
    "data.image_size=32", "data.train_size=64", "data.val_size=32", "data.num_classes=4", "data.num_workers=0",
    "train.batch_size=16", "train.epochs=2", "train.log_every=1", "train.ckpt_every=3", "wandb.mode=disabled",
    "diagnostics.enabled=false", "eval.after_train=false",
]


def tiny_vit(**overrides: Any) -> SinkViT:
    """`build_vit("vit_cpu", **TINY_VIT)` with `overrides` (any `build_vit` keyword)."""
    return build_vit("vit_cpu", **{**TINY_VIT, **overrides})


def near_identity(blocks: list[Any]) -> None:
    """Make each block (almost) the identity: its attention update ~1e-6 and its MLP update 0, in place."""
    with torch.no_grad():
        for blk in blocks:
            blk.attn.proj.weight.mul_(1e-6)  # the attention update ~1e-6: the residual stream carries x on
            blk.attn.proj.bias.zero_()
            blk.mlp.fc2.weight.zero_()
            blk.mlp.fc2.bias.zero_()


def tiny_cfg(runs: Path, *overrides: str) -> DictConfig:
    """A tiny run configuration under `runs`; later overrides win."""
    return load_config([*TINY, f"runs_dir={runs}", *overrides])


def images(n: int = 8, seed: int = 0) -> torch.Tensor:
    """`n` seeded standard-normal images at the tiny ViT's size (n, 3, 32, 32)."""
    return torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


def trained(runs: Path, name: str = "ev2", *overrides: str) -> Path:
    """The last checkpoint of the tiny run `runs/<name>` trained one step (with `overrides`)."""
    from vitsinks.train.trainer import Trainer

    Trainer(tiny_cfg(runs, f"name={name}", "train.max_steps=1", *overrides)).fit()
    return runs / name / "checkpoints" / "last.pt"


def eval_cfg(runs: Path, ckpt: Path, *overrides: str) -> DictConfig:
    """A tiny run configuration that probes `ckpt` in seconds (few images, one or two epochs, one learning rate)."""
    return tiny_cfg(runs, f"ckpt={ckpt}", "eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1",
                    "eval.dense_epochs=2", "eval.linear_lrs=[0.01]", *overrides)
