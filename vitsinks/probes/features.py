"""Frozen-backbone features, extracted once and cached on disk in fp16, sharded over ranks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import Dataset, Subset
from tqdm import tqdm

from vitsinks.backbones import adapt
from vitsinks.configs.schema import to_container
from vitsinks.data import read_item
from vitsinks.models.seam import Backbone
from vitsinks.utils import files
from vitsinks.utils.distributed import gather_objects, rank_world
from vitsinks.utils.errors import BadValue, NonFinite, UserError
from vitsinks.utils.progress import hidden


@torch.no_grad()
def global_features(model: Backbone | nn.Module, images: torch.Tensor, n_last: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the pooled token of each of the last `n_last` blocks after the final norm (B, n_last, D), the mean patch
    token of the last block (B, D)): the DINOv2 linear-probe features, through the seam (`Backbone`: each block's
    real forward, the readout). The pooled token is [CLS], or the mean patch token of a model without one."""
    cls, patch_mean, _ = linear_features(model, images, n_last)
    return cls, patch_mean


@torch.no_grad()
def linear_features(model: Backbone | nn.Module, images: torch.Tensor, n_last: int, patch_grid: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`global_features` and, in one forward, the concatenated patches: the last block's final-norm patch tokens
    ([CLS] and registers dropped) average-pooled to a `patch_grid` x `patch_grid` grid (`grid_pool`), (B,
    patch_grid**2 * D); (B, 0) when `patch_grid` is 0."""
    bb = adapt(model)
    x, first, kept = bb.embed_tokens(images), len(bb.blocks) - n_last, []
    for i in range(len(bb.blocks)):
        x = bb.block(i, x)
        if i >= first:
            kept.append(bb.readout(x))
    p = bb.num_prefix
    cls = torch.stack([t[:, 0] if bb.num_cls else t[:, p:].mean(1) for t in kept], dim=1)
    patches = kept[-1][:, p:]
    grid = (grid_pool(patches, images.shape[-2] // bb.patch_size[0], patch_grid) if patch_grid
            else patches.new_zeros(len(patches), 0))
    return cls, patches.mean(1), grid


def grid_pool(patches: torch.Tensor, rows: int, side: int) -> torch.Tensor:
    """Patch tokens (B, P, D) of a map `rows` patches high, average-pooled to a `side` x `side` grid (adaptive
    bins, as `F.adaptive_avg_pool2d`) and concatenated cell by cell, row-major: (B, side * side * D), of the same
    size at every input resolution."""
    B, P, D = patches.shape
    pooled = F.adaptive_avg_pool2d(patches.transpose(1, 2).reshape(B, D, rows, P // rows), side)
    return pooled.flatten(2).transpose(1, 2).flatten(1)


@torch.no_grad()
def patch_features(model: Backbone | nn.Module, images: torch.Tensor) -> torch.Tensor:
    """Final-norm patch tokens as a map (B, D, h, w) (`Backbone.forward_features`); [CLS] and registers dropped."""
    bb = adapt(model)
    patches = bb.forward_features(images)[:, bb.num_prefix :]
    B, P, D = patches.shape
    h = images.shape[-2] // bb.patch_size[0]
    return patches.transpose(1, 2).reshape(B, D, h, P // h)


def width(model: Backbone | nn.Module) -> int:
    """The width of a model's tokens (its residual stream's, which the final norm keeps)."""
    return int(adapt(model).blocks[-1].attn.proj.weight.shape[0])


def _stat(path: str | Path) -> str:
    return f"{path}:{files.stamp(path)}"


def dataset_fingerprint(ds: Dataset) -> str:
    """What a dataset's items depend on beyond its config: every file's path, size and mtime (ImageFolder samples,
    segmentation pairs, Fashion-MNIST's IDX files), the chosen indices of a subset, its length."""
    h = hashlib.sha1(f"{type(ds).__name__}:{len(ds)}".encode())  # type: ignore[arg-type]
    if isinstance(ds, Subset):
        h.update(dataset_fingerprint(ds.dataset).encode())
        h.update(str(list(ds.indices)).encode())
    for path, label in getattr(ds, "samples", []):  # ImageFolder
        h.update(f"{_stat(path)}:{label}\n".encode())
    for img, label in getattr(ds, "pairs", []):  # segmentation files
        h.update(f"{_stat(img)}|{_stat(label)}\n".encode())
    for path in getattr(ds, "files", []):  # datasets read from a few files
        h.update(f"{_stat(path)}\n".encode())
    if hasattr(ds, "base"):  # wrappers (masks, mosaics) of another dataset
        h.update(dataset_fingerprint(ds.base).encode())
    return h.hexdigest()


def cache_key(model: str | Path, data: DictConfig, dataset: Dataset, seed: int, **extra: object) -> str:
    """A feature cache's key: everything its content depends on (the model: a checkpoint file, or a model's identity
    string, `run.source.ModelSource.identity`; the data config, the dataset's files, the seed, and the caller's
    `extra` settings such as split and image size)."""
    data = data if isinstance(data, DictConfig) else OmegaConf.structured(data)  # a config or its dataclass
    made_of = _stat(Path(model).resolve()) if isinstance(model, Path) else model
    parts = {"checkpoint": made_of, "data": to_container(data), "seed": seed,
             "dataset": dataset_fingerprint(dataset), **{k: str(v) for k, v in sorted(extra.items())}}
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def extract(dataset: Dataset, fn: Callable[[list], dict[str, torch.Tensor]], cache: Path, batch_size: int,
            desc: str, on_bad_image: str = "skip") -> dict[str, torch.Tensor]:
    """Run `fn` over `dataset` in batches (each rank its share), store fp16 features at `cache`, return them all.

    `fn` takes a list of dataset items and returns a dict of tensors with the batch first; unreadable images are
    left out under `on_bad_image=skip` (`index` says which items are in). Non-finite features are an error, never
    cached. A finished cache is reused as is; a partial one (a killed job) is never read: files are written
    atomically.

    In a process group every rank must call it (its collectives): each extracts its share into its own shard file,
    then all read every shard and return the whole set; rank 0 writes the cache. A rank's error is raised on every
    rank (the same type, naming the rank), so that none waits for it; a rank with no item (fewer items than ranks)
    is fine.
    """
    rank, world = rank_world()
    if gather_objects(cache.exists())[0]:  # rank 0's view decides: every rank takes the same path
        try:
            cached = files.read_torch(cache, "")
        except files.BadFile:
            cached = None
        if all(gather_objects(cached is not None)):
            return cached
        if rank == 0:  # a cache is never the only copy: a torn one is computed again
            print(f"note: the feature cache {cache} is torn or not one vitsinks wrote (never unpickled): computing "
                  f"it again", flush=True)
            cache.unlink(missing_ok=True)
    shard = cache.with_name(f"{cache.stem}.rank{rank}of{world}.pt")
    failed: Exception | None = None
    try:
        if not shard.exists():
            files.torch_save(_extract_share(dataset, fn, list(range(rank, len(dataset), world)),  # type: ignore
                                            batch_size, desc, on_bad_image, rank), shard)
    except Exception as err:  # shared below, then raised on every rank
        failed = err
    kind = type(failed) if isinstance(failed, UserError) else RuntimeError  # a class every rank can unpickle
    reports = gather_objects(None if failed is None else (kind, str(failed)))
    if failed is not None:
        raise failed
    for r, report in enumerate(reports):
        if report is not None:
            other, message = report
            raise other(f"rank {r}: {message}")
    shards = [files.read_torch(p, f"delete {p} and rerun") for r in range(world)
              if (p := cache.with_name(f"{cache.stem}.rank{r}of{world}.pt"))]
    shards = [s for s in shards if len(s["index"])]
    if not shards:
        raise BadValue(f"no readable item in the {len(dataset)} items of {desc}")  # type: ignore[arg-type]
    index = torch.cat([s.pop("index") for s in shards])
    order = index.argsort()
    merged = {k: torch.cat([s[k] for s in shards])[order] for k in shards[0]}
    merged["index"] = index[order]
    if rank == 0:
        files.torch_save(merged, cache)
    if world > 1:
        dist.barrier()  # every rank has read every shard
    if rank == 0:
        for r in range(world):
            cache.with_name(f"{cache.stem}.rank{r}of{world}.pt").unlink(missing_ok=True)
    return merged


def _extract_share(dataset: Dataset, fn: Callable[[list], dict[str, torch.Tensor]], idx: list[int], batch_size: int,
                   desc: str, on_bad_image: str, rank: int) -> dict[str, torch.Tensor]:
    """`fn`'s features of the items `idx` of `dataset` (fp16), with `index`, the items kept (none: `index` only)."""
    parts: dict[str, list[torch.Tensor]] = {}
    kept: list[int] = []
    for lo in tqdm(range(0, len(idx), batch_size), desc=desc, unit="batch", disable=hidden(rank != 0)):
        batch = [(i, item) for i in idx[lo : lo + batch_size]
                 if (item := read_item(dataset, i, on_bad_image)) is not None]
        if not batch:
            continue
        kept += [i for i, _ in batch]
        for k, v in fn([item for _, item in batch]).items():
            if v.is_floating_point() and not bool(torch.isfinite(v).all()):
                raise NonFinite(f"the backbone's features are not finite (NaN or inf) on {desc}: the checkpoint's "
                                f"weights or the images are broken; nothing was cached or reported")
            parts.setdefault(k, []).append(v.cpu().half() if v.is_floating_point() else v.cpu())
    return {k: torch.cat(v) for k, v in parts.items()} | {"index": torch.tensor(kept, dtype=torch.long)}
