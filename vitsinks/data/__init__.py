"""Datasets: the procedural `synthetic` default, offline `fashion_mnist`, and ImageFolder `imagenet`."""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset

from vitsinks.config import DataConfig
from vitsinks.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from vitsinks.data.fashion_mnist import FashionMNIST
from vitsinks.data.imagefolder import BadImage, ImageFolderSplit, read_item, train_classes
from vitsinks.data.sinktasks import SinkTask, is_sink_task, sink_task_name
from vitsinks.data.synthetic import SyntheticShapes
from vitsinks.errors import BadValue, InputNotFound

DATASETS = ("synthetic", "fashion_mnist", "imagenet", "sinktask_nop", "sinktask_broadcast", "ade20k", "voc")

__all__ = ["DATASETS", "BadImage", "FashionMNIST", "ImageFolderSplit", "SinkTask", "SyntheticShapes",
           "build_dataset", "check_root", "is_sink_task", "loader_workers", "num_classes", "read_item"]


def check_root(root: str | None, name: str, example: str) -> Path:
    """`data.root` as a folder that exists and is not empty; else `InputNotFound` saying what to put there."""
    if not root:
        raise InputNotFound(f"data={name} needs data.root, e.g. data.root={example}")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise InputNotFound(f"data.root {path} does not exist: point data.root at the {name} folder ({example})")
    if not any(path.iterdir()):
        raise InputNotFound(f"data.root {path} is empty: copy or mount the {name} data there ({example})")
    return path


def build_dataset(cfg: DataConfig, split: str, seed: int = 0) -> Dataset:
    """The `(PIL image, label)` dataset of `split` (train | val) named by `cfg.name` (ADE20K / VOC: the label is
    the label map); fails early on a bad root."""
    if cfg.name == "synthetic":
        # train and val are disjoint streams of the same generator
        length = cfg.train_size if split == "train" else cfg.val_size
        return SyntheticShapes(cfg.image_size, length, cfg.num_classes, seed=seed * 2 + (split != "train"))
    if is_sink_task(cfg.name):
        length = cfg.train_size if split == "train" else cfg.val_size
        return SinkTask(sink_task_name(cfg.name), cfg.image_size, cfg.patch_size, length,
                        seed=seed * 2 + (split != "train"), marked_frac=cfg.marked_frac, marker=cfg.marker)
    if cfg.name == "fashion_mnist":
        root = check_root(cfg.root or FASHION_MNIST_ROOT, "fashion_mnist", FASHION_MNIST_ROOT)
        return FashionMNIST(root, split, size=cfg.image_size)
    if cfg.name == "imagenet":
        root = check_root(cfg.root, "imagenet", "/datasets/imagenet")
        return ImageFolderSplit(root, split, classes=None if split == "train" else train_classes(root))
    if cfg.name in ("ade20k", "voc"):  # the segmentation sets' images (with their label maps) for the analyses
        from vitsinks.eval.segdata import build_seg_dataset  # segdata builds on this module

        return build_seg_dataset(cfg, split, seed)
    raise BadValue(f"unknown data.name {cfg.name!r}; choose one of {DATASETS}")


def num_classes(dataset: Dataset) -> int:
    """Number of classes of a built dataset (of its base when it is a subset)."""
    from torch.utils.data import Subset

    if isinstance(dataset, Subset):
        return num_classes(dataset.dataset)
    if isinstance(dataset, SyntheticShapes):
        return dataset.num_classes
    if isinstance(dataset, SinkTask):
        return 0  # per-patch regression targets, no classes
    return len(dataset.classes)  # type: ignore[attr-defined]


def loader_workers(requested: int | None) -> int:
    """DataLoader workers: `data.num_workers`, or (None) at most 8 and at most the CPUs this process may use - 1."""
    if requested is not None:
        return requested
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(0, min(8, cpus - 1))
