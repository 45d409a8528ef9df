"""Data sets in their real layouts, written small: an ImageFolder tree, ADE20K and Pascal VOC segmentation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

VOC_PALETTE = [0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [0] * (252 * 3 - 12) + [224, 224, 192] * 4


def imagefolder(root: Path, classes: dict[str, tuple[int, int]], size: int = 32) -> Path:
    """An ImageFolder tree: for each class a colour, `n_train` train and `n_val` val images."""
    rng = np.random.default_rng(0)
    for k, (cls, (n_train, n_val)) in enumerate(classes.items()):
        for split, n in (("train", n_train), ("val", n_val)):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = np.clip(rng.normal(60 + 120 * k, 20, (size, size, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(arr).save(root / split / cls / f"{i}.JPEG")
    return root


def ade_folder(root: Path) -> Path:
    """ADE20K's layout under `root` (ADEChallengeData2016: 2 training and 2 validation images, their labels)."""
    base = root / "ADEChallengeData2016"
    for split in ("training", "validation"):
        (base / "images" / split).mkdir(parents=True)
        (base / "annotations" / split).mkdir(parents=True)
        for i in range(2):
            name = f"ADE_{split[:5]}_{i:08d}"
            Image.new("RGB", (24, 16), "blue").save(base / "images" / split / f"{name}.jpg")
            lab = np.zeros((16, 24), np.uint8)
            lab[:, 12:] = 150
            lab[:4] = 3
            Image.fromarray(lab).save(base / "annotations" / split / f"{name}.png")
    return root


def voc_folder(root: Path) -> Path:
    """Pascal VOC 2012's layout under `root` (1 train and 2 val images, their palette PNG labels)."""
    base = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (base / d).mkdir(parents=True)
    for split, names in (("train", ["2007_000032"]), ("val", ["2007_000033", "2007_000039"])):
        (base / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(names) + "\n")
        for n in names:
            Image.new("RGB", (20, 10), "red").save(base / "JPEGImages" / f"{n}.jpg")
            lab = np.zeros((10, 20), np.uint8)
            lab[2:8, 5:15] = 1
            lab[1, :] = 255  # object border
            png = Image.fromarray(lab, mode="P")
            png.putpalette(VOC_PALETTE)
            png.save(base / "SegmentationClass" / f"{n}.png")
    return root
