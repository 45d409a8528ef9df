"""Dense (segmentation) probing of a frozen backbone.

    python -m vitsinks.eval.dense ckpt=runs/<name>/checkpoints/last.pt data=ade20k data.root=/datasets/ade
    python -m vitsinks.eval.dense ckpt=... data=voc data.root=/datasets/voc [data.voc_aug=true]

Head: BatchNorm + 1x1 conv on the final-norm patch tokens ([CLS] and registers dropped), logits upsampled
bilinearly to the label size; AdamW. Training on cached unaugmented features (default) or with random resized
crop + flip and features recomputed (`eval.dense_augment=true`). Evaluation at full label resolution, with a
sliding window when an image is larger than the model input; mIoU, per-class IoU and pixel accuracy from one
confusion matrix summed over all ranks. Writes `<run>/results/dense_<data>.json` and `dense_<data>.png`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

from vitsinks.cli import hydra_command
from vitsinks.plotting import save_figure

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from lightly.transforms.utils import IMAGENET_NORMALIZE  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from PIL import Image  # noqa: E402
from torch import nn  # noqa: E402
from torchmetrics.classification import MulticlassConfusionMatrix  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2  # noqa: E402
from tqdm import tqdm  # noqa: E402

from vitsinks import files  # noqa: E402
from vitsinks.data import read_item  # noqa: E402
from vitsinks.distributed import rank_world  # noqa: E402
from vitsinks.eval.common import limit, setup, write_result  # noqa: E402
from vitsinks.eval.features import cache_key, extract, patch_features  # noqa: E402
from vitsinks.eval.metrics import iou_from_confusion  # noqa: E402
from vitsinks.eval.segdata import IGNORE, build_seg_dataset, num_seg_classes  # noqa: E402
from vitsinks.models import SinkViT  # noqa: E402


class DenseHead(nn.Module):
    """BatchNorm + 1x1 convolution from patch features (B, D, h, w) to class logits (B, C, h, w)."""

    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(dim)
        self.conv = nn.Conv2d(dim, classes, 1)

    def forward(self, feats: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        return F.interpolate(self.conv(self.bn(feats)), size=size, mode="bilinear", align_corners=False)


def _to_input(img: Image.Image, width: int, height: int | None = None) -> torch.Tensor:
    """Normalised (3, height, width) tensor of `img` resized (the whole image, as its label: no crop)."""
    x = v2.functional.to_image(img.resize((width, height or width), Image.BILINEAR)).float().div(255)
    return v2.functional.normalize(x, list(IMAGENET_NORMALIZE["mean"]), list(IMAGENET_NORMALIZE["std"]))


def _label(label: np.ndarray, size: int) -> torch.Tensor:
    return torch.from_numpy(np.array(Image.fromarray(label).resize((size, size), Image.NEAREST))).long()


@torch.no_grad()
def slide_logits(model: SinkViT, head: DenseHead, img: Image.Image, size: int, out_hw: tuple[int, int]) -> torch.Tensor:
    """Class logits (C, H, W) at the label resolution: the image is resized so that its short side is `size`,
    windows of size x size slide along the long side (stride 2/3 of a window), their logits are averaged."""
    device = next(model.parameters()).device
    w, h = img.size
    scale = size / min(w, h)
    rw, rh = max(size, round(w * scale)), max(size, round(h * scale))
    x = _to_input(img, rw, rh).to(device)
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


def train_head(model: SinkViT, head: DenseHead, train_ds: torch.utils.data.Dataset, cfg: DictConfig, size: int,
               cache: Path, on_bad_image: str = "skip") -> list[float]:
    """Fit the head (its batches drawn from a generator seeded with `cfg.seed`); returns the loss per epoch."""
    e = cfg.eval
    device = next(model.parameters()).device
    head.to(device).train()
    opt = torch.optim.AdamW(head.parameters(), lr=e.dense_lr, weight_decay=e.dense_weight_decay)
    n = len(train_ds)  # type: ignore[arg-type]
    if not e.dense_augment:
        def featurize(items: list) -> dict[str, torch.Tensor]:
            x = torch.stack([_to_input(img, size) for img, _ in items]).to(device)
            return {"feats": patch_features(model, x), "label": torch.stack([_label(lb, size) for _, lb in items])}

        cached = extract(train_ds, featurize, cache, e.batch_size, "dense features (train)", on_bad_image)
        n = len(cached["label"])  # unreadable images left out
    steps_per_epoch = math.ceil(n / e.dense_batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, e.dense_epochs * steps_per_epoch))
    gen = torch.Generator().manual_seed(cfg.seed)
    augment = v2.Compose([v2.RandomResizedCrop(size, scale=(0.25, 1.0), antialias=True), v2.RandomHorizontalFlip()])
    losses = []
    for _ in tqdm(range(e.dense_epochs), desc="dense probe", unit="epoch"):
        total = 0.0
        for idx in torch.randperm(n, generator=gen).split(e.dense_batch_size):
            if e.dense_augment:
                items = [it for i in idx if (it := read_item(train_ds, int(i), on_bad_image)) is not None]
                if not items:
                    continue
                pairs = [augment(tv_tensors.Image(v2.functional.pil_to_tensor(img)),
                                 tv_tensors.Mask(torch.from_numpy(lb)[None])) for img, lb in items]
                x = torch.stack([v2.functional.normalize(p[0].float() / 255, list(IMAGENET_NORMALIZE["mean"]),
                                                         list(IMAGENET_NORMALIZE["std"])) for p in pairs]).to(device)
                feats, y = patch_features(model, x), torch.stack([p[1][0] for p in pairs]).long()
            else:
                feats, y = cached["feats"][idx].float().to(device), cached["label"][idx]
            loss = F.cross_entropy(head(feats, y.shape[-2:]), y.to(device), ignore_index=IGNORE)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item() * len(idx)
        losses.append(total / n)
    return losses


@torch.no_grad()
def evaluate(model: SinkViT, head: DenseHead, val_ds: torch.utils.data.Dataset, classes: int, size: int,
             examples: int = 0, on_bad_image: str = "skip") -> tuple[dict[str, Any],
                                                                 list[tuple[Image.Image, np.ndarray, np.ndarray]]]:
    """Confusion matrix over the whole val split (synced over ranks by torchmetrics) -> metrics, examples."""
    device = next(model.parameters()).device
    head.to(device).eval()
    conf = MulticlassConfusionMatrix(classes, ignore_index=IGNORE).to(device)
    shown = []
    rank, world = rank_world()
    for i in tqdm(range(rank, len(val_ds), world), desc="dense eval", unit="img", disable=rank != 0):  # type: ignore
        item = read_item(val_ds, i, on_bad_image)
        if item is None:
            continue
        img, label = item
        pred = slide_logits(model, head, img, size, label.shape).argmax(0)
        conf.update(pred.flatten(), torch.from_numpy(label).long().flatten().to(device))
        if len(shown) < examples:
            shown.append((img, label, pred.cpu().numpy()))
    matrix = conf.compute().cpu()
    return {**iou_from_confusion(matrix), "confusion": matrix.tolist()}, shown


def plot_examples(shown: list[tuple[Image.Image, np.ndarray, np.ndarray]], classes: int, path: Path,
                  title: str) -> Path:
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


def run(cfg: DictConfig, data: DictConfig | None = None) -> dict[str, Any]:
    """Train and evaluate the dense probe; write the JSON and the example PNG."""
    model, data, results_dir = setup(cfg, data)
    e = cfg.eval
    train_ds = limit(build_seg_dataset(data, "train", cfg.seed), e.max_train_images)
    val_ds = limit(build_seg_dataset(data, "val", cfg.seed), e.max_val_images)
    classes = num_seg_classes(train_ds)
    size = model.patch_embed.img_size[0]
    torch.manual_seed(cfg.seed)  # the head's initialisation and the augmentations: the same command, the same mIoU
    head = DenseHead(model.embed_dim, classes)
    key = cache_key(Path(cfg.ckpt), data, train_ds, cfg.seed, size=size)
    losses = train_head(model, head, train_ds, cfg, size, results_dir.parent / "eval_cache" / f"dense-{key}.pt",
                        data.on_bad_image)
    metrics, shown = evaluate(model, head, val_ds, classes, size, e.dense_examples, data.on_bad_image)
    result = {"checkpoint": str(cfg.ckpt), "data": data.name, "classes": classes, **metrics,
              "train_images": len(train_ds), "val_images": len(val_ds), "epochs": e.dense_epochs,  # type: ignore
              "augment": e.dense_augment, "train_loss": losses}
    write_result(results_dir / f"dense_{data.name}.json", result)
    if rank_world()[0] != 0:
        return result
    files.torch_save({"head": head.state_dict(), "classes": classes}, results_dir / f"dense_{data.name}_head.pt")
    if shown:
        plot_examples(shown, classes, results_dir / f"dense_{data.name}.png",
                      f"dense probe on {data.name}: mIoU {metrics['mIoU'] * 100:.1f}")
    print(f"dense probe on {data.name}: mIoU {metrics['mIoU'] * 100:.2f}, pixel acc {metrics['pixel_acc'] * 100:.2f}; "
          f"{results_dir / f'dense_{data.name}.json'}")
    return result


main = hydra_command(run)

if __name__ == "__main__":
    main()
