"""Dense (segmentation) probing of a frozen backbone, under a named protocol (`eval.dense_protocol`).

    python -m vitsinks.eval.dense ckpt=runs/<name>/checkpoints/last.pt data=ade20k data.root=/datasets/ade
    python -m vitsinks.eval.dense ckpt=... data=voc data.root=/datasets/voc eval.dense_protocol=kempner
    python -m vitsinks.eval.dense model=dinov2_small data=ade20k data.root=...   # a pretrained model (its import)

Both protocols train a per-patch linear map on the final-norm patch tokens ([CLS] and registers dropped), logits
upsampled bilinearly, cross-entropy with 255 ignored, AdamW; mIoU, per-class IoU and pixel accuracy come from one
confusion matrix over the whole val split (summed over ranks). `dinov2` (default): BatchNorm first, the model's input
size, one evaluation at the end at full label resolution with a sliding window. `kempner` / `kempner_cached`: the
attention-sink reference's probe at 512 x 512, val at 512 x 512 before the first epoch and after each, the best epoch
reported (`dense_protocols.py` holds every setting). Writes `<run>/results/dense_<data>.json` (dinov2) or
`dense_<data>_<protocol>.json`, with the example PNG and the heads beside it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from PIL import Image
from torch import nn
from torch.utils.data import Dataset
from torchmetrics.classification import MulticlassConfusionMatrix
from tqdm import tqdm

from vitsinks.configs.cli import hydra_command
from vitsinks.data import read_item
from vitsinks.data.segmentation import IGNORE, JointCropFlip, build_seg_dataset, num_seg_classes, resize_label, to_input
from vitsinks.eval.common import limit, setup, write_result
from vitsinks.eval.dense_protocols import DenseProtocol, best_epoch, resolve, scheduler
from vitsinks.eval.features import cache_key, extract, patch_features
from vitsinks.eval.metrics import iou_from_confusion, mean_std
from vitsinks.eval.results import DenseResult, dense_kind
from vitsinks.models import SinkViT
from vitsinks.run.imported import with_checkpoint
from vitsinks.utils import files
from vitsinks.utils.distributed import rank_world
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.plotting import save_figure
from vitsinks.utils.progress import hidden

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


def check_size(model: SinkViT, size: int) -> None:
    """`ConfigError` unless the model can embed size x size images (patch multiple; position embedding resampled by
    timm's dynamic image size when `size` is not the model's own)."""
    patch = model.patch_embed.patch_size[0]
    if size % patch:
        raise ConfigError(f"eval.dense_size={size} is not a multiple of the model's patch size {patch}")
    if size != model.patch_embed.img_size[0] and not getattr(model, "dynamic_img_size", False):
        raise ConfigError(f"eval.dense_size={size}: this model only takes {model.patch_embed.img_size[0]} px "
                          f"images (built without dynamic image size); leave eval.dense_size unset")


@torch.no_grad()
def slide_logits(model: SinkViT, head: DenseHead, img: Image.Image, size: int, out_hw: tuple[int, int]) -> torch.Tensor:
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
            if acc is None:
                acc = torch.zeros(logits.shape[0], rh, rw, device=device)
                count = torch.zeros(1, rh, rw, device=device)
            acc[:, y0 : y0 + size, x0 : x0 + size] += logits
            count[:, y0 : y0 + size, x0 : x0 + size] += 1
    return F.interpolate((acc / count).unsqueeze(0), size=out_hw, mode="bilinear", align_corners=False)[0]


def _metrics(conf: MulticlassConfusionMatrix, miou_classes: str) -> dict[str, Any]:
    matrix = conf.compute().cpu()
    return {**iou_from_confusion(matrix, miou_classes), "confusion": matrix.tolist()}


@torch.no_grad()
def evaluate(model: SinkViT, head: DenseHead, val_ds: Dataset, classes: int, size: int, on_bad_image: str = "skip",
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


def augmented_batches(model: SinkViT, ds: Dataset, proto: DenseProtocol, on_bad_image: str = "skip") -> Batch:
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
def predict_examples(model: SinkViT, head: DenseHead, val_ds: Dataset, proto: DenseProtocol, count: int,
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
            img, label = img.resize((size, size), Image.BILINEAR), resize_label(label, size).numpy().astype(np.uint8)
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


def _mean_per_class(per_seed: list[list[float | None]]) -> list[float | None]:
    """Per-class mean over probe seeds of the IoUs that exist (None where a class has none)."""
    out: list[float | None] = []
    for values in zip(*per_seed, strict=True):
        got = [v for v in values if v is not None]
        out.append(sum(got) / len(got) if got else None)
    return out


def run(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """Train and evaluate the dense probe(s) of `eval.dense_protocol`; write the JSON, the heads and the PNG (a
    pretrained model's: in its imported run, `run.imported`)."""
    cfg = with_checkpoint(cfg)
    model, data, run, seed = setup(cfg, data)
    e = cfg.eval
    proto, overrides = resolve(e, str(data.name))
    size: int = proto.size or model.patch_embed.img_size[0]
    proto = replace(proto, size=size)
    check_size(model, size)
    device = next(model.parameters()).device
    train_ds, val_ds = (limit(build_seg_dataset(data, split, seed, proto.voc_background), n, cfg.protocol.seed)
                        for split, n in (("train", e.max_train_images), ("val", e.max_val_images)))
    classes = num_seg_classes(train_ds)

    def featurize(items: list) -> dict[str, torch.Tensor]:
        x = torch.stack([to_input(img, size) for img, _ in items]).to(device)
        labels = torch.stack([resize_label(lb, size) for _, lb in items])  # 0..254 and IGNORE (255): uint8 cached
        return {"feats": patch_features(model, x), "label": labels.to(torch.uint8)}

    def cached(split: str, ds: Dataset) -> dict[str, torch.Tensor]:
        key = cache_key(Path(cfg.ckpt), data, ds, seed, split=split, size=size)
        return extract(ds, featurize, run.eval_cache / f"dense-{key}.pt", e.batch_size,
                       f"dense features ({split})", data.on_bad_image)

    if proto.augment:
        n, batch = len(train_ds), augmented_batches(model, train_ds, proto, data.on_bad_image)  # type: ignore
    else:
        train = cached("train", train_ds)
        n = len(train["label"])  # unreadable images left out

        def batch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return train["feats"][idx].float().to(device), train["label"][idx].long()

    if proto.val == "resize":
        val = cached("val", val_ds)
        val_images = len(val["label"])

        def evaluate_head(head: DenseHead) -> dict[str, Any]:
            return evaluate_cached(head, val, classes, proto.batch_size, proto.miou_classes)
    else:
        val_images = len(val_ds)  # type: ignore[arg-type]

        def evaluate_head(head: DenseHead) -> dict[str, Any]:
            return evaluate(model, head, val_ds, classes, size, data.on_bad_image, proto.miou_classes)

    probes, heads = [], []
    for k in range(proto.probe_seeds):
        torch.manual_seed(seed + k)  # the head's init and the augmentations: the same command, the same mIoU
        heads.append(DenseHead(model.embed_dim, classes, proto.batchnorm).to(device))
        probes.append(fit(heads[-1], batch, n, proto, seed + k, evaluate_head))
    miou, std = mean_std([p["mIoU"] for p in probes])
    details = {"checkpoint": str(cfg.ckpt), "data": data.name, "classes": classes, "seed": seed,
               "protocol_settings": proto.settings(), "overrides": overrides, "mIoU_std": std,
               "pixel_acc": mean_std([p["pixel_acc"] for p in probes])[0],
               "per_class_iou": _mean_per_class([p["per_class_iou"] for p in probes]), "probes": probes,
               "train_images": len(train_ds), "val_images": val_images,  # type: ignore[arg-type]
               "epochs": proto.epochs, "augment": proto.augment}
    typed = DenseResult(miou, proto.name, details)
    result = typed.to_json()
    kind = dense_kind(data.name, proto.name)
    path = run.result(kind)
    write_result(path, typed)
    if rank_world()[0] != 0:
        return result
    files.torch_save({"heads": [h.state_dict() for h in heads], "classes": classes, "protocol": proto.name},
                     run.results / f"{kind}_head.pt")
    shown = predict_examples(model, heads[0], val_ds, proto, e.dense_examples, data.on_bad_image)
    if shown:
        plot_examples(shown, classes, run.results / f"{kind}.png",
                      f"dense probe ({proto.name}) on {data.name}: mIoU {miou * 100:.1f}")
    spread = f" ± {std * 100:.2f} over {len(probes)} probe seeds" if len(probes) > 1 else ""
    best = f", best of val before and after each of {proto.epochs} epochs" if proto.best_over_epochs else ""
    changed = f"; overrides {overrides}" if overrides else ""
    print(f"dense probe ({proto.name}) on {data.name}: mIoU {miou * 100:.2f}{spread}{best}, pixel acc "
          f"{result['pixel_acc'] * 100:.2f}{changed}; {path}")
    return result


main = hydra_command(run)

if __name__ == "__main__":
    main()
