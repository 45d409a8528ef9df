"""The linear probe's grid of heads (DINOv2 protocol by default, `eval.probes`): one linear head per learning rate,
number of last blocks and pooling, trained side by side on cached features. `vitsinks.run.probing.linear_probe`
extracts the features and runs it, the command `python -m vitsinks.eval.linear`."""

from __future__ import annotations

import math
from itertools import product
from typing import Any, TypedDict, cast

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from vitsinks.probes.linear_protocols import DEFAULT_LINEAR, DINOV2_POOLS, LINEAR_PROTOCOLS, PATCHES, LinearProtocol
from vitsinks.utils.errors import BadValue
from vitsinks.utils.progress import hidden


def probe_input(cls: torch.Tensor, patch_mean: torch.Tensor, n_last: int, pool: str,
                patches: torch.Tensor | None = None) -> torch.Tensor:
    """The feature vector of one grid cell: [CLS] of the last `n_last` blocks, optionally + avg-pooled patches
    (`cls+avgpool`) or + the concatenated patches (`cls+patches`: `patches`, `features.grid_pool`)."""
    x = cls[:, -n_last:].flatten(1)
    if pool == PATCHES:
        if patches is None:
            raise BadValue(f"the {PATCHES} pool reads the concatenated patches: extract them (features.linear_features "
                           f"with a patch_grid) before training its heads")
        return torch.cat([x, patches], dim=1)
    return torch.cat([x, patch_mean], dim=1) if pool == "cls+avgpool" else x


def input_width(dim: int, n_last: int, pool: str, patch_width: int = 0) -> int:
    """The width of `probe_input` for tokens of width `dim` (`patch_width`: that of the concatenated patches)."""
    return dim * n_last + {"cls+avgpool": dim, PATCHES: patch_width}.get(pool, 0)


class Cell(TypedDict):
    """One head's settings: learning rate, the number of last blocks read, pooling."""

    lr: float
    n_last: int
    pool: str


class LinearGrid(nn.Module):
    """One linear head per (learning rate, blocks, pooling), trained side by side on the same batches."""

    def __init__(self, dim: int, classes: int, lrs: list[float], blocks: list[int],
                 pools: tuple[str, ...] = DINOV2_POOLS, patch_width: int = 0) -> None:
        super().__init__()
        self.cells: list[Cell] = [{"lr": lr, "n_last": n, "pool": p} for lr, n, p in product(lrs, blocks, pools)]
        heads = [nn.Linear(input_width(dim, c["n_last"], c["pool"], patch_width), classes) for c in self.cells]
        self.heads = nn.ModuleList(heads)
        for h in heads:
            nn.init.normal_(h.weight, std=0.01)
            nn.init.zeros_(h.bias)

    def forward(self, cls: torch.Tensor, patch_mean: torch.Tensor,
                patches: torch.Tensor | None = None) -> list[torch.Tensor]:
        return [h(probe_input(cls, patch_mean, c["n_last"], c["pool"], patches))
                for h, c in zip(self.heads, self.cells, strict=True)]


def train_grid(train: dict[str, torch.Tensor], val: dict[str, torch.Tensor], classes: int, lrs: list[float],
               blocks: list[int], epochs: int, batch_size: int, seed: int = 0,
               protocol: LinearProtocol = LINEAR_PROTOCOLS[DEFAULT_LINEAR]) -> list[dict[str, Any]]:
    """Train the grid on cached features under `protocol` (`probes.linear_protocols`; its `cls+patches` pool reads
    the features' `patches`); return every cell with its val top-1 / top-5 (best first)."""
    torch.manual_seed(seed)
    dim = train["cls"].shape[-1]
    patched = "patches" in train and PATCHES in protocol.pools
    grid = LinearGrid(dim, classes, lrs, blocks, protocol.pools, train["patches"].shape[-1] if patched else 0)
    opt = torch.optim.SGD([{"params": h.parameters(), "lr": c["lr"]} for h, c in zip(grid.heads, grid.cells,
                                                                                      strict=True)],
                          momentum=protocol.momentum, weight_decay=protocol.weight_decay)
    n = len(train["label"])
    steps = epochs * math.ceil(n / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    gen = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(epochs), desc="linear probe grid", unit="epoch", disable=hidden()):
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            cls, pm, y = train["cls"][idx].float(), train["patch_mean"][idx].float(), train["label"][idx]
            patches = train["patches"][idx].float() if patched else None
            loss = cast(torch.Tensor, sum(F.cross_entropy(logits, y)  # a grid has cells
                                          for logits in grid(cls, pm, patches)))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        outs = grid(val["cls"].float(), val["patch_mean"].float(), val["patches"].float() if patched else None)
    k = min(5, classes)
    results = []
    for cell, logits in zip(grid.cells, outs, strict=True):
        top = logits.topk(k, dim=1).indices
        hit = top == val["label"][:, None]
        results.append({**cell, "top1": float(hit[:, 0].float().mean() * 100),
                        f"top{k}": float(hit.any(1).float().mean() * 100)})
    return sorted(results, key=lambda r: -r["top1"])
