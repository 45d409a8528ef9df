"""Optimizer and learning-rate schedule of a training run: AdamW with decoupled weight decay on matrices only (or,
`train.decay_all_params`, on every parameter as the reference does), linear warmup then cosine."""

from __future__ import annotations

import math
from typing import Any

import torch
from omegaconf import DictConfig


class WarmupCosine:
    """LR multiplier: linear warmup to 1 (step s: (s + 1) / warmup, or s / warmup with `from_zero`), then cosine
    down to `min_ratio`."""

    def __init__(self, warmup: int, total: int, min_ratio: float, from_zero: bool = False) -> None:
        self.warmup, self.total, self.min_ratio, self.from_zero = warmup, max(total, 1), min_ratio, from_zero

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + (0 if self.from_zero else 1)) / self.warmup
        t = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1 - self.min_ratio) * 0.5 * (1 + math.cos(math.pi * t))


def param_groups(model: torch.nn.Module, lr: float, wd: float, probe_lr: float,
                 probe_prefixes: tuple[str, ...] = (), decay_all: bool = False,
                 probe_wd: float = 0.0) -> list[dict[str, Any]]:
    """Weight decay on matrices only (on every parameter with `decay_all`), an online probe (`probe_prefixes`)
    apart with its own lr and `probe_wd`; frozen parameters left out."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    probe: list[torch.nn.Parameter] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if probe_prefixes and name.startswith(probe_prefixes):
            probe.append(p)
            continue
        skip = p.ndim < 2 or name.removeprefix("backbone.") in ("cls_token", "reg_token", "pos_embed")
        (no_decay if skip else decay).append(p)
    groups = [{"params": decay, "lr": lr, "weight_decay": wd},
              {"params": no_decay, "lr": lr, "weight_decay": wd if decay_all else 0.0}]
    return groups + ([{"params": probe, "lr": probe_lr, "weight_decay": probe_wd}] if probe else [])


def fused_adamw(device: torch.device) -> bool:
    """Whether AdamW runs fused on `device`: on CUDA only."""
    return device.type == "cuda"


def build_optimizer(model: torch.nn.Module, cfg: DictConfig, steps_per_epoch: int, total_steps: int,
                    probe_prefixes: tuple[str, ...] = (), device: torch.device | None = None,
                    ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `param_groups` (fused on CUDA) and its per-step `WarmupCosine` schedule."""
    t = cfg.train
    if device is None:
        device = next(model.parameters()).device
    groups = param_groups(model, t.lr, t.weight_decay, cfg.objective.probe_lr, probe_prefixes,
                          decay_all=t.decay_all_params, probe_wd=cfg.objective.probe_weight_decay)
    optimizer = torch.optim.AdamW(groups, fused=True) if fused_adamw(device) else torch.optim.AdamW(groups)
    warmup = round(t.warmup_epochs * steps_per_epoch)
    schedule = WarmupCosine(warmup, total_steps, t.min_lr_ratio, from_zero=t.warmup_from_zero)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


# How an AdamW group runs on this machine, not what it learned: a checkpoint written with another implementation
# (a CPU run resumed on a GPU, or the reverse) keeps this optimizer's choice.
IMPLEMENTATION_KEYS = ("fused", "foreach", "capturable")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """`optimizer.load_state_dict(state)` keeping `optimizer`'s own implementation flags (`IMPLEMENTATION_KEYS`)."""
    saved = state["param_groups"]
    if len(saved) == len(optimizer.param_groups):  # else torch's own error names the mismatch
        saved = [{**group, **{k: own[k] for k in IMPLEMENTATION_KEYS if k in own}}
                 for group, own in zip(saved, optimizer.param_groups, strict=True)]
    optimizer.load_state_dict({**state, "param_groups": saved})
