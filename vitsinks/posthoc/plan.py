"""What the probes of a derived run will run and roughly cost, said in one line before they start (`describe`): the
images each probe passes through the backbone x its measured forward time per image x `OVERHEAD` (docs/commands.md).
"""

from __future__ import annotations

import time

import torch
from omegaconf import DictConfig

from vitsinks.data.datasets import with_masks
from vitsinks.data.sinktasks import is_sink_task
from vitsinks.models import SinkViT
from vitsinks.models.seam import Backbone
from vitsinks.probes.dense_protocols import resolve

OVERHEAD = 4.0  # the probes' wall time / their images' forward time, measured on the first run's checkpoint
FASHION_MNIST = (60000, 10000)  # its train / val images


def split_sizes(data: DictConfig, dense: bool = False) -> tuple[int | None, int | None]:
    """(train, val) images of `data` where known without reading it, else None; `dense`: its segmentation version."""
    if data.name == "synthetic" or is_sink_task(str(data.name)) or (dense and data.name == "fashion_mnist"):
        return int(data.train_size), int(data.val_size)
    return FASHION_MNIST if data.name == "fashion_mnist" else (None, None)


def capped(n: int | None, cap: int | None) -> int | None:
    """`n` images limited by `cap` (`eval.max_*_images`; None: no cap)."""
    return cap if n is None else n if cap is None else min(n, int(cap))


def probe_images(cfg: DictConfig) -> dict[str, tuple[str, int | None, int | None]]:
    """Probe -> (its data's name, train images, val images) of the probes `cfg` (a run's config) runs."""
    e = cfg.eval
    out: dict[str, tuple[str, int | None, int | None]] = {}
    if cfg.data.num_classes != 0:  # as `run.pipeline.probes`: data without class labels gets no linear probe
        train, val = (capped(n, c) for n, c in zip(
            split_sizes(cfg.data), (e.max_train_images, e.max_val_images), strict=True))
        out["linear"] = (str(cfg.data.name), train, val)
    dense = str(e.dense_data or cfg.data.name)
    if dense in with_masks():
        sizes = split_sizes(cfg.data, dense=True) if dense == cfg.data.name else (None, None)
        out["dense"] = (dense, capped(sizes[0], e.max_train_images), capped(sizes[1], e.max_val_images))
    return out


@torch.no_grad()
def forward_s_per_image(model: SinkViT | Backbone, batch: int = 64, side: int | None = None) -> float:
    """Seconds per image of a forward pass of `model` on `side` px images (default its own): warm-up, then timed."""
    size = (side, side) if side else model.patch_embed.img_size  # type: ignore[union-attr]
    x = torch.randn(batch, 3, *size, device=next(model.parameters()).device)
    model.forward_features(x)
    start = time.perf_counter()
    model.forward_features(x)
    return (time.perf_counter() - start) / batch


def describe(cfg: DictConfig, model: SinkViT | Backbone, skip: str, side: int | None = None) -> str:
    """One line: the probes `cfg` runs on `model`, their images, a rough time and `skip` (the switch)."""
    if not probe_images(cfg):
        return f"no probes to run: data={cfg.data.name} has no class labels and no masks"
    parts, forwards, known = [], 0.0, True
    side = side or model.patch_embed.img_size[0]  # type: ignore[union-attr]
    for probe, (data, train, val) in probe_images(cfg).items():
        what = f"{probe} ({data}, {'?' if train is None else train} train + {'?' if val is None else val} val images"
        passes = (1.0, 1.0)  # each image through the backbone once (cached features)
        if probe == "dense":
            proto, _ = resolve(cfg.eval, data)
            what += f", {proto.name} protocol, {proto.epochs} epochs"
            area = ((proto.size or side) / side) ** 2  # a larger input: more tokens
            passes = ((proto.epochs if proto.augment else 1) * area,
                      (proto.epochs + 1 if proto.best_over_epochs else 1) * area * proto.probe_seeds)
        else:
            what += f", {cfg.eval.linear_epochs} epochs"
        parts.append(what + ")")
        known = known and train is not None and val is not None
        forwards += (train or 0) * passes[0] + (val or 0) * passes[1]
    seconds = forwards * forward_s_per_image(model, side=side) * OVERHEAD
    rough = (f"roughly {max(1, round(seconds / 60))} min here" if known else
             "time: the whole split of an image folder (eval.max_train_images= / eval.max_val_images= cap it)")
    return f"probes to run: {'; '.join(parts)}: {rough}; {skip} skips them"
