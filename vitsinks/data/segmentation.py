"""Segmentation datasets for the dense probes (items `(PIL RGB image, uint8 label map)`, 255 = ignore) and the pixel
side of the probes: whole-image resizes and the joint random resized crop + flip of an image and its labels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from lightly.transforms.utils import IMAGENET_NORMALIZE
from PIL import Image
from torch.utils.data import Dataset
from torchvision import tv_tensors
from torchvision.transforms import v2

from vitsinks.configs.schema import DataConfig
from vitsinks.data.datasets import DATASETS
from vitsinks.data.imagefolder import BadImage, strict_loader
from vitsinks.data.synthetic_images import SyntheticShapes
from vitsinks.utils.errors import BadValue

if TYPE_CHECKING:  # annotations only
    from omegaconf import DictConfig

IGNORE = 255
ADE_SPLITS = {"train": "training", "val": "validation"}


class SegmentationError(BadValue):
    """A segmentation dataset on disk does not match its layout."""


def reduce_zero_label(label: np.ndarray) -> np.ndarray:
    """ADE20K: 0 (other) -> 255 (ignore), k -> k - 1."""
    out = label.astype(np.int16) - 1
    out[label == 0] = IGNORE
    return out.astype(np.uint8)


class SegFiles(Dataset):
    """Image / label file pairs, with the checks every layout shares."""

    def __init__(self, pairs: list[tuple[Path, Path]], num_classes: int, reduce_zero: bool = False) -> None:
        self.pairs, self.num_classes, self.reduce_zero = pairs, num_classes, reduce_zero

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> tuple[Image.Image, np.ndarray]:
        img_path, label_path = self.pairs[i]
        img = strict_loader(str(img_path))
        try:
            label = np.array(Image.open(label_path))  # palette PNGs give the class indices directly
        except (OSError, ValueError, SyntaxError) as err:
            raise BadImage(f"cannot decode label map {label_path}: {err}") from err
        if label.ndim != 2:
            raise SegmentationError(f"{label_path} is not a single-channel label map (shape {label.shape})")
        if label.shape != (img.height, img.width):
            raise SegmentationError(f"size mismatch: image {img_path} is {img.width}x{img.height} but its label "
                                    f"{label_path} is {label.shape[1]}x{label.shape[0]}")
        raw = label
        if self.reduce_zero:
            label = reduce_zero_label(label)
        bad = (label != IGNORE) & (label >= self.num_classes)
        if bad.any():
            value = int(raw[bad].max())  # the value in the file, not after ADE20K's reduction
            raise SegmentationError(f"class-count mismatch: {label_path} holds label value {value} but the dataset "
                                    f"is configured with {self.num_classes} classes (data.num_classes"
                                    + (", values 1..num_classes after ADE20K's 0 = ignore)" if self.reduce_zero
                                       else ")"))
        return img, label


def ade20k(root: str | Path, split: str, num_classes: int = 150) -> SegFiles:
    """`ADEChallengeData2016/{images,annotations}/{training,validation}` under `root` (or `root` itself)."""
    base = Path(root)
    if (base / "ADEChallengeData2016").is_dir():
        base = base / "ADEChallengeData2016"
    img_dir, ann_dir = base / "images" / ADE_SPLITS[split], base / "annotations" / ADE_SPLITS[split]
    for d in (img_dir, ann_dir):
        if not d.is_dir():
            raise SegmentationError(f"ADE20K folder {d} is missing: data.root must hold "
                                    f"ADEChallengeData2016/{{images,annotations}}/{{training,validation}}")
    pairs = []
    for img in sorted(img_dir.glob("*.jpg")):
        ann = ann_dir / f"{img.stem}.png"
        if not ann.is_file():
            raise SegmentationError(f"ADE20K annotation {ann} for image {img} is missing")
        pairs.append((img, ann))
    if not pairs:
        raise SegmentationError(f"no ADE20K images (*.jpg) in {img_dir}")
    return SegFiles(pairs, num_classes, reduce_zero=True)


def voc(root: str | Path, split: str, num_classes: int = 21, aug: bool = False) -> SegFiles:
    """`VOCdevkit/VOC2012` under `root` (or `root` itself); split lists in ImageSets/Segmentation."""
    base = next((Path(root) / s for s in ("VOCdevkit/VOC2012", "VOC2012") if (Path(root) / s).is_dir()), Path(root))
    use_aug = aug and split == "train"
    list_file = base / "ImageSets" / "Segmentation" / (f"{split}_aug.txt" if use_aug else f"{split}.txt")
    label_dir = base / ("SegmentationClassAug" if use_aug else "SegmentationClass")
    if use_aug and (missing := [p.name for p in (label_dir, list_file) if not p.exists()]):
        raise SegmentationError(f"data.voc_aug=true needs the augmented set (SBD), but {base} has no "
                                f"{' and no '.join(missing)}: add SegmentationClassAug/ and "
                                f"ImageSets/Segmentation/train_aug.txt there, or drop data.voc_aug")
    if not list_file.is_file():
        raise SegmentationError(f"VOC split file {list_file} is missing: data.root must hold "
                                f"VOCdevkit/VOC2012/ImageSets/Segmentation/{{train,val}}.txt")
    names = [n.strip() for n in list_file.read_text().splitlines() if n.strip()]
    pairs = []
    for n in names:
        img, label = base / "JPEGImages" / f"{n}.jpg", label_dir / f"{n}.png"
        for p in (img, label):
            if not p.is_file():
                raise SegmentationError(f"{p} is listed in {list_file.name} but missing")
        pairs.append((img, label))
    return SegFiles(pairs, num_classes)


class SyntheticMasks(Dataset):
    """The synthetic shapes with their per-pixel masks: `num_classes + 1` classes, 0 = background."""

    def __init__(self, base: SyntheticShapes) -> None:
        self.base = base
        self.num_classes = base.num_classes + 1

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> tuple[Image.Image, np.ndarray]:
        img, mask, _ = self.base.sample(i)
        return Image.fromarray(img), mask


class FashionMNISTMosaic(Dataset):
    """Fashion-MNIST mosaics: 2-4 items on a `size` x `size` canvas, each one's pixels (grey level > 30) labelled with
    its class + 1; a pure function of (seed, i)."""

    def __init__(self, base: Dataset, size: int, length: int, seed: int = 0) -> None:
        self.base, self.size, self.length, self.seed = base, size, length, seed
        self.num_classes = 11

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[Image.Image, np.ndarray]:
        rng = np.random.default_rng([self.seed, i])
        canvas = np.zeros((self.size, self.size), np.uint8)
        label = np.zeros((self.size, self.size), np.uint8)
        for _ in range(rng.integers(2, 5)):
            j = int(rng.integers(len(self.base)))  # type: ignore[arg-type]
            item = self.base.images[j]  # type: ignore[attr-defined]
            s = int(rng.integers(self.size // 3, self.size // 2 + 1))
            item = np.array(Image.fromarray(item).resize((s, s), Image.Resampling.BILINEAR))
            y, x = rng.integers(0, self.size - s + 1, size=2)
            on = item > 30
            canvas[y : y + s, x : x + s][on] = item[on]
            label[y : y + s, x : x + s][on] = int(self.base.labels[j]) + 1  # type: ignore[attr-defined]
        return Image.fromarray(canvas).convert("RGB"), label


def ignore_background(label: np.ndarray) -> np.ndarray:
    """VOC without its background class: 0 -> 255 (ignore), k -> k - 1, 255 stays."""
    out = label.astype(np.int16) - 1
    out[(label == 0) | (label == IGNORE)] = IGNORE
    return out.astype(np.uint8)


class BackgroundIgnored(Dataset):
    """A segmentation dataset whose class 0 (background) is ignored: one class fewer, the others shifted down."""

    def __init__(self, base: Dataset) -> None:
        self.base = base
        self.num_classes = base.num_classes - 1  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> tuple[Image.Image, np.ndarray]:
        img, label = self.base[i]
        return img, ignore_background(label)


def normalize(x: torch.Tensor) -> torch.Tensor:
    """(3, H, W) floats in [0, 1] -> ImageNet-normalised."""
    return v2.functional.normalize(x, list(IMAGENET_NORMALIZE["mean"]), list(IMAGENET_NORMALIZE["std"]))


def to_input(img: Image.Image, width: int, height: int | None = None) -> torch.Tensor:
    """Normalised (3, height, width) tensor of the whole of `img` resized bilinearly (no crop)."""
    resized = img.resize((width, height or width), Image.Resampling.BILINEAR)
    return normalize(v2.functional.to_image(resized).float().div(255))


def resize_label(label: np.ndarray, size: int) -> torch.Tensor:
    """The label map resized to size x size with nearest neighbours (no new values: 255 stays ignore), as int64."""
    return torch.from_numpy(np.array(Image.fromarray(label).resize((size, size), Image.Resampling.NEAREST))).long()


class JointCropFlip:
    """One random resized crop and a flip (p 1/2), alike for an image (bilinear) and its labels (nearest)."""

    def __init__(self, size: int, scale: tuple[float, float], ratio: tuple[float, float]) -> None:
        self.tf = v2.Compose([v2.RandomResizedCrop(size, scale=scale, ratio=ratio, antialias=True),
                              v2.RandomHorizontalFlip()])

    def __call__(self, img: Image.Image, label: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """(normalised image (3, size, size), labels (size, size) int64)."""
        x, y = self.tf(tv_tensors.Image(v2.functional.pil_to_tensor(img)),
                       tv_tensors.Mask(torch.from_numpy(label)[None]))
        return normalize(x.float() / 255), y[0].long()


def build_seg_dataset(cfg: DataConfig | DictConfig, split: str, seed: int = 0,
                      voc_background: bool = True) -> Dataset:
    """The segmentation dataset named by `cfg.name` (`DataSet.segmentation`)."""
    return DATASETS.get(str(cfg.name)).segmentation(cast(DataConfig, cfg), split, seed, voc_background)


def num_seg_classes(ds: Dataset) -> int:
    return ds.num_classes  # type: ignore[attr-defined]
