"""The dense probe's parts: its head (a per-patch linear map on the patch tokens), its training (`fit`), its
evaluations (a sliding window at full label resolution, `evaluate`; resized and cached, `evaluate_cached`) and its
example figure. `vitsinks.run.probing.dense_probe` runs them under a protocol (`eval.dense_protocols`), the command
`python -m vitsinks.eval.dense`. The model is read through the seam (`Backbone`, `features.patch_features`)."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import nn
from torch.utils.data import Dataset
from torchmetrics.classification import MulticlassConfusionMatrix
from tqdm import tqdm

from vitsinks.backbones import adapt
from vitsinks.data import read_item
from vitsinks.data.segmentation import IGNORE, JointCropFlip, resize_label, to_input
from vitsinks.models.seam import Backbone
from vitsinks.probes.dense_protocols import DenseProtocol, best_epoch, scheduler
from vitsinks.probes.features import patch_features
from vitsinks.probes.metrics import iou_from_confusion
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.plotting import save_figure
from vitsinks.utils.progress import hidden

Model = Backbone | nn.Module  # a model through the seam, or one of an adapted family
Batch = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None]
Shown = list[tuple[Image.Image, np.ndarray, np.ndarray]]


class DenseHead(nn.Module):
    """Optional BatchNorm + 1x1 convolution (a Linear layer applied to every patch token) from patch features
    (B, D, h, w) to class logits, upsampled bilinearly to `size` (B, C, *size)."""

    def __init__(self, dim: int, classes: int, batchnorm: bool = True) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(dim) if batchnorm else nn.Identity()
        self.conv = nn.Conv2d(dim, classes, 1)

    def forward(self, feats: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        logits = self.conv(self.bn(feats))  # upsampled 8 images at a time: large batches of 512 px logits stay small
        return torch.cat([F.interpolate(c, size=size, mode="bilinear", align_corners=False) for c in logits.split(8)])


def check_size(model: Model, size: int) -> None:
    """`ConfigError` unless the model can embed size x size images (patch multiple; position embedding resampled by
    timm's dynamic image size when `size` is not the model's own)."""
    bb = adapt(model)
    patch = bb.patch_size[0]
    if size % patch:
        raise ConfigError(f"eval.dense_size={size} is not a multiple of the model's patch size {patch}")
    native = getattr(getattr(bb.model, "patch_embed", None), "img_size", None)  # a timm ViT's (vitsinks' own too)
    if native is not None and size != native[0] and not getattr(bb.model, "dynamic_img_size", False):
        raise ConfigError(f"eval.dense_size={size}: this model only takes {native[0]} px "
                          f"images (built without dynamic image size); leave eval.dense_size unset")


@torch.no_grad()
def slide_logits(model: Model, head: DenseHead, img: Image.Image, size: int, out_hw: tuple[int, int]) -> torch.Tensor:
    """Class logits (C, H, W) at the label resolution: the image is resized so that its short side is `size`,
    windows of size x size slide along the long side (stride 2/3 of a window), their logits are averaged."""
    device = next(model.parameters()).device
    w, h = img.size
    scale = size / min(w, h)
    rw, rh = max(size, round(w * scale)), max(size, round(h * scale))
    x = to_input(img, rw, rh).to(device)
    stride = max(1, size * 2 // 3)
    ys = list(range(0, rh - size + 1, stride)) or [0]
    xs = list(range(0, rw - size + 1, stride)) or [0]
    if ys[-1] != rh - size:
        ys.append(rh - size)
    if xs[-1] != rw - size:
        xs.append(rw - size)
    acc = count = None
    for y0 in ys:
        for x0 in xs:
            crop = x[:, y0 : y0 + size, x0 : x0 + size].unsqueeze(0)
            logits = head(patch_features(model, crop), (size, size))[0]
            if acc is None or count is None:  # set together
                acc = torch.zeros(logits.shape[0], rh, rw, device=device)
                count = torch.zeros(1, rh, rw, device=device)
            acc[:, y0 : y0 + size, x0 : x0 + size] += logits
            count[:, y0 : y0 + size, x0 : x0 + size] += 1
    assert acc is not None and count is not None  # at least one crop
    return F.interpolate((acc / count).unsqueeze(0), size=out_hw, mode="bilinear", align_corners=False)[0]


def _metrics(conf: MulticlassConfusionMatrix, miou_classes: str) -> dict[str, Any]:
    matrix = conf.compute().cpu()
    return {**iou_from_confusion(matrix, miou_classes), "confusion": matrix.tolist()}


@torch.no_grad()
def evaluate(model: Model, head: DenseHead, val_ds: Dataset, classes: int, size: int, on_bad_image: str = "skip",
             miou_classes: str = "present") -> dict[str, Any]:
    """Sliding-window predictions at full label resolution over the whole val split (this rank's share; the
    confusion matrix is synced over ranks by torchmetrics) -> metrics."""
    device = next(model.parameters()).device
    head.to(device).eval()
    conf = MulticlassConfusionMatrix(classes, ignore_index=IGNORE).to(device)
    rank, world = rank_world()
    shown = range(rank, len(val_ds), world)  # type: ignore[arg-type]
    for i in tqdm(shown, desc="dense eval", unit="img", disable=hidden(rank != 0)):
        item = read_item(val_ds, i, on_bad_image)
        if item is None:
            continue
        img, label = item
        pred = slide_logits(model, head, img, size, label.shape).argmax(0)
        conf.update(pred.flatten(), torch.from_numpy(label).long().flatten().to(device))
    return _metrics(conf, miou_classes)


@torch.no_grad()
def evaluate_cached(head: DenseHead, val: dict[str, torch.Tensor], classes: int, batch_size: int,
                    miou_classes: str = "all") -> dict[str, Any]:
    """Metrics of the head on cached val features, at the size of the cached labels (this rank's share)."""
    device = next(head.parameters()).device
    head.eval()
    conf = MulticlassConfusionMatrix(classes, ignore_index=IGNORE).to(device)
    rank, world = rank_world()
    for idx in torch.arange(rank, len(val["label"]), world).split(batch_size):
        logits = head(val["feats"][idx].float().to(device), tuple(val["label"].shape[-2:]))
        conf.update(logits.argmax(1).flatten(), val["label"][idx].to(device).long().flatten())
    return _metrics(conf, miou_classes)


def fit(head: DenseHead, batch: Batch, n: int, proto: DenseProtocol, seed: int,
        evaluate_head: Callable[[DenseHead], dict[str, Any]]) -> dict[str, Any]:
    """Train `head` on `n` items for `proto.epochs` epochs (batches of shuffled indices from a generator seeded with
    `seed`, `batch(indices)` -> (features, labels) or None when none is readable; a batch without a labelled pixel is
    skipped). `evaluate_head` runs before the first epoch and after every epoch when `proto.best_over_epochs`, else
    once at the end; the best evaluation is reported and the head is left holding its weights."""
    device = next(head.parameters()).device
    opt = torch.optim.AdamW(head.parameters(), lr=proto.lr, weight_decay=proto.weight_decay)
    per_epoch = max(1, n // proto.batch_size) if proto.drop_last else math.ceil(n / proto.batch_size)
    sched = scheduler(opt, max(1, proto.epochs * per_epoch), proto)
    gen = torch.Generator().manual_seed(seed)
    curve: list[float] = []
    kept: dict[str, Any] = {}

    def record(epoch: int) -> None:
        m = evaluate_head(head)
        curve.append(m["mIoU"])
        if best_epoch(curve) == len(curve) - 1:
            kept.update(epoch=epoch, metrics=m, state=copy.deepcopy(head.state_dict()))

    if proto.best_over_epochs:
        record(0)
    losses = []
    for epoch in tqdm(range(1, proto.epochs + 1), desc=f"dense probe ({proto.name})", unit="epoch",
                      disable=hidden()):
        head.train()
        total, count = 0.0, 0
        for idx in torch.randperm(n, generator=gen).split(proto.batch_size)[:per_epoch]:
            got = batch(idx)
            if got is None or not bool((got[1] != IGNORE).any()):
                continue
            feats, y = got
            loss = F.cross_entropy(head(feats, tuple(y.shape[-2:])), y.to(device), ignore_index=IGNORE)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if proto.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(head.parameters(), proto.grad_clip)
            opt.step()
            sched.step()
            total, count = total + loss.item() * len(y), count + len(y)
        losses.append(total / max(count, 1))
        if proto.best_over_epochs or epoch == proto.epochs:
            record(epoch)
    head.load_state_dict(kept["state"])
    m = kept["metrics"]
    return {"seed": seed, "mIoU": m["mIoU"], "best_epoch": kept["epoch"], "pixel_acc": m["pixel_acc"],
            "per_class_iou": m["per_class_iou"], "confusion": m["confusion"], "val_mIoU": curve, "train_loss": losses}


def augmented_batches(model: Model, ds: Dataset, proto: DenseProtocol, on_bad_image: str = "skip") -> Batch:
    """Batches of joint random resized crops + flips of `ds` items at `proto.size`, features recomputed."""
    crop = JointCropFlip(proto.size, proto.crop_scale, proto.crop_ratio)  # type: ignore[arg-type]
    device = next(model.parameters()).device

    def batch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        items = [it for i in idx if (it := read_item(ds, int(i), on_bad_image)) is not None]
        if not items:
            return None
        pairs = [crop(img, label) for img, label in items]
        return patch_features(model, torch.stack([p[0] for p in pairs]).to(device)), torch.stack([p[1] for p in pairs])

    return batch


@torch.no_grad()
def predict_examples(model: Model, head: DenseHead, val_ds: Dataset, proto: DenseProtocol, count: int,
                     on_bad_image: str = "skip") -> Shown:
    """(image, labels, prediction) of the first `count` val items, as the protocol evaluates them (full resolution
    with a sliding window, or image and labels resized to size x size)."""
    device = next(model.parameters()).device
    head.eval()
    shown: Shown = []
    size: int = proto.size  # type: ignore[assignment]
    for i in range(min(count, len(val_ds))):  # type: ignore[arg-type]
        item = read_item(val_ds, i, on_bad_image)
        if item is None:
            continue
        img, label = item
        if proto.val == "slide":
            pred = slide_logits(model, head, img, size, label.shape).argmax(0)
        else:
            img = img.resize((size, size), Image.Resampling.BILINEAR)
            label = resize_label(label, size).numpy().astype(np.uint8)
            pred = head(patch_features(model, to_input(img, size)[None].to(device)), (size, size))[0].argmax(0)
        shown.append((img, label, pred.cpu().numpy()))
    return shown


def plot_examples(shown: Shown, classes: int, path: Path, title: str) -> Path:
    """Rows of image | ground truth | prediction (ignore in black)."""
    cmap = plt.get_cmap("tab20", max(classes, 2))
    fig, axes = plt.subplots(len(shown), 3, figsize=(7.5, 2.5 * len(shown)), squeeze=False)

    def colour(lb: np.ndarray) -> np.ndarray:
        rgb = cmap(lb % cmap.N)[..., :3]
        rgb[lb == IGNORE] = 0
        return rgb

    for row, (img, label, pred) in zip(axes, shown, strict=True):
        for ax, im, name in zip(row, (np.asarray(img), colour(label), colour(pred)),
                                ("image", "ground truth", "prediction"), strict=True):
            ax.imshow(im)
            ax.set_title(name, fontsize=8)
            ax.axis("off")
    return save_figure(fig, path, title, title_size=9)


def mean_per_class(per_seed: list[list[float | None]]) -> list[float | None]:
    """Per-class mean over probe seeds of the IoUs that exist (None where a class has none)."""
    out: list[float | None] = []
    for values in zip(*per_seed, strict=True):
        got = [v for v in values if v is not None]
        out.append(sum(got) / len(got) if got else None)
    return out
