"""Frozen-backbone features, extracted once and cached on disk in fp16, sharded over ranks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset
from tqdm import tqdm

from vitsinks.checkpoint import atomic_save
from vitsinks.distributed import is_distributed
from vitsinks.models import SinkViT


@torch.no_grad()
def global_features(model: SinkViT, images: torch.Tensor, n_last: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([CLS] of the last `n_last` blocks after the final norm (B, n_last, D), mean patch token of the last block
    (B, D)): the DINOv2 linear-probe features, through timm's `forward_intermediates`."""
    out = model.forward_intermediates(images, indices=n_last, return_prefix_tokens=True, norm=True,
                                      output_fmt="NLC", intermediates_only=True)
    cls = torch.stack([prefix[:, 0] for _, prefix in out], dim=1)
    return cls, out[-1][0].mean(1)


@torch.no_grad()
def patch_features(model: SinkViT, images: torch.Tensor) -> torch.Tensor:
    """Final-norm patch tokens as a map (B, D, h, w); [CLS] and registers dropped."""
    tokens = model.forward_features(images)
    patches = tokens[:, model.num_prefix_tokens :]
    B, P, D = patches.shape
    h = images.shape[-2] // model.patch_embed.patch_size[0]
    return patches.transpose(1, 2).reshape(B, D, h, P // h)


def cache_key(*parts: object) -> str:
    return hashlib.sha1("|".join(map(str, parts)).encode()).hexdigest()[:12]


def extract(dataset: Dataset, fn: Callable[[list], dict[str, torch.Tensor]], cache: Path, batch_size: int,
            desc: str) -> dict[str, torch.Tensor]:
    """Run `fn` over `dataset` in batches (each rank its share), store fp16 features at `cache`, return them all.

    `fn` takes a list of dataset items and returns a dict of tensors with the batch first. A finished cache is
    reused as is; a partial one (a killed job) is never read: files are written atomically.
    """
    if cache.exists():
        return torch.load(cache, map_location="cpu")
    rank, world = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
    shard = cache.with_name(f"{cache.stem}.rank{rank}of{world}.pt")
    if not shard.exists():
        idx = list(range(rank, len(dataset), world))  # type: ignore[arg-type]
        loader = DataLoader(Subset(dataset, idx), batch_size=batch_size, collate_fn=list, num_workers=0)
        parts: dict[str, list[torch.Tensor]] = {}
        for items in tqdm(loader, desc=desc, unit="batch", disable=rank != 0):
            for k, v in fn(items).items():
                parts.setdefault(k, []).append(v.cpu().half() if v.is_floating_point() else v.cpu())
        atomic_save({k: torch.cat(v) for k, v in parts.items()} | {"index": torch.tensor(idx)}, shard)
    if world > 1:
        dist.barrier()
    shards = [torch.load(cache.with_name(f"{cache.stem}.rank{r}of{world}.pt")) for r in range(world)]
    order = torch.cat([s.pop("index") for s in shards]).argsort()
    merged = {k: torch.cat([s[k] for s in shards])[order] for k in shards[0]}
    if rank == 0:
        atomic_save(merged, cache)
    if world > 1:
        dist.barrier()
    for r in range(world):
        if rank == 0:
            cache.with_name(f"{cache.stem}.rank{r}of{world}.pt").unlink(missing_ok=True)
    return merged
