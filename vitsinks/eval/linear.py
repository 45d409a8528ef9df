"""Linear probing of a frozen backbone (DINOv2 protocol).

    python -m vitsinks.eval.linear ckpt=runs/<name>/checkpoints/last.pt data=imagenet data.root=/datasets/imagenet
    python -m vitsinks.eval.linear model=dinov2_small data=imagenet data.root=...   # a pretrained model (its import)

Features ([CLS] of the last 1 or 4 blocks, optionally with the average-pooled patch tokens) are extracted once and
cached in fp16; a grid of learning rates x {last 1, last 4 blocks} x {[CLS], [CLS] + avgpool} linear heads is
trained together in one pass over them (SGD, momentum 0.9, cosine); the best head by val top-1 is reported with
its top-5 in `<run>/results/linear.json`.
"""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from tqdm import tqdm

from vitsinks.configs.cli import hydra_command
from vitsinks.data import build_dataset, num_classes
from vitsinks.diagnostics import protocol_transform
from vitsinks.eval.common import limit, setup, write_result
from vitsinks.eval.features import cache_key, extract, global_features
from vitsinks.eval.results import LinearResult
from vitsinks.run.imported import with_checkpoint
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.progress import hidden

POOLS = ("cls", "cls+avgpool")


def probe_input(cls: torch.Tensor, patch_mean: torch.Tensor, n_last: int, pool: str) -> torch.Tensor:
    """The feature vector of one grid cell: [CLS] of the last `n_last` blocks, optionally + avg-pooled patches."""
    x = cls[:, -n_last:].flatten(1)
    return torch.cat([x, patch_mean], dim=1) if pool == "cls+avgpool" else x


class LinearGrid(nn.Module):
    """One linear head per (learning rate, blocks, pooling), trained side by side on the same batches."""

    def __init__(self, dim: int, classes: int, lrs: list[float], blocks: list[int]) -> None:
        super().__init__()
        self.cells = [{"lr": lr, "n_last": n, "pool": p} for lr, n, p in product(lrs, blocks, POOLS)]
        self.heads = nn.ModuleList(
            nn.Linear(dim * c["n_last"] + (dim if c["pool"] == "cls+avgpool" else 0), classes) for c in self.cells)
        for h in self.heads:
            nn.init.normal_(h.weight, std=0.01)
            nn.init.zeros_(h.bias)

    def forward(self, cls: torch.Tensor, patch_mean: torch.Tensor) -> list[torch.Tensor]:
        return [h(probe_input(cls, patch_mean, c["n_last"], c["pool"])) for h, c in zip(self.heads, self.cells,
                                                                                         strict=True)]


def train_grid(train: dict[str, torch.Tensor], val: dict[str, torch.Tensor], classes: int, lrs: list[float],
               blocks: list[int], epochs: int, batch_size: int, seed: int = 0) -> list[dict[str, Any]]:
    """Train the grid on cached features; return every cell with its val top-1 / top-5 (best first)."""
    torch.manual_seed(seed)
    dim = train["cls"].shape[-1]
    grid = LinearGrid(dim, classes, lrs, blocks)
    opt = torch.optim.SGD([{"params": h.parameters(), "lr": c["lr"]} for h, c in zip(grid.heads, grid.cells,
                                                                                      strict=True)],
                          momentum=0.9, weight_decay=0.0)
    n = len(train["label"])
    steps = epochs * math.ceil(n / batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1))
    gen = torch.Generator().manual_seed(seed)
    for _ in tqdm(range(epochs), desc="linear probe grid", unit="epoch", disable=hidden()):
        for idx in torch.randperm(n, generator=gen).split(batch_size):
            cls, pm, y = train["cls"][idx].float(), train["patch_mean"][idx].float(), train["label"][idx]
            loss = sum(F.cross_entropy(logits, y) for logits in grid(cls, pm))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
    with torch.no_grad():
        outs = grid(val["cls"].float(), val["patch_mean"].float())
    k = min(5, classes)
    results = []
    for cell, logits in zip(grid.cells, outs, strict=True):
        top = logits.topk(k, dim=1).indices
        hit = top == val["label"][:, None]
        results.append({**cell, "top1": float(hit[:, 0].float().mean() * 100),
                        f"top{k}": float(hit.any(1).float().mean() * 100)})
    return sorted(results, key=lambda r: -r["top1"])


def run(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """Extract (or reuse) features, train the grid, write `results/linear.json` (a pretrained model's: in its
    imported run, `run.imported`)."""
    cfg = with_checkpoint(cfg)
    model, data, run, seed = setup(cfg, data)
    size, device, e = model.patch_embed.img_size[0], next(model.parameters()).device, cfg.eval
    tf = protocol_transform(size, cfg.protocol)
    blocks = sorted({min(b, len(model.blocks)) for b in e.linear_last_blocks})  # "last 4" of a 2-block model: 2
    n_max = max(blocks)

    def features(items: list) -> dict[str, torch.Tensor]:
        x = torch.stack([tf(img) for img, _ in items]).to(device)
        cls, pm = global_features(model, x, n_max)
        return {"cls": cls, "patch_mean": pm, "label": torch.tensor([y for _, y in items])}

    datasets = {split: limit(build_dataset(data, split, seed), n, cfg.protocol.seed)  # both checked before any work
                for split, n in (("train", e.max_train_images), ("val", e.max_val_images))}
    classes = num_classes(datasets["train"])
    splits = {}
    for split, ds in datasets.items():
        key = cache_key(Path(cfg.ckpt), data, ds, seed, split=split, size=size, n_max=n_max,
                        preprocess=f"{cfg.protocol.crop_pct}:{cfg.protocol.interpolation}")
        splits[split] = extract(ds, features, run.eval_cache / f"lin-{key}.pt", e.batch_size,
                                f"features ({split})", data.on_bad_image)
    cells = train_grid(splits["train"], splits["val"], classes, list(e.linear_lrs), blocks,
                       e.linear_epochs, e.linear_batch_size, seed)
    result = LinearResult(checkpoint=str(cfg.ckpt), data=data.name, classes=classes,
                          train_images=len(splits["train"]["label"]), val_images=len(splits["val"]["label"]),
                          seed=seed, best=cells[0], grid=cells)
    path = run.result(LinearResult.kind)
    write_result(path, result)
    best = cells[0]
    if rank_world()[0] == 0:
        print(f"linear probe on {data.name}: top-1 {best['top1']:.2f} (lr {best['lr']}, last {best['n_last']} blocks, "
              f"{best['pool']}); {path}")
    return result.to_json()


main = hydra_command(run)

if __name__ == "__main__":
    main()
