"""The image-level datasets (synthetic shapes, sink tasks, Fashion-MNIST, ImageFolder ImageNet) and their roots."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset, Subset

from vitsinks.configs.schema import DataConfig
from vitsinks.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from vitsinks.data.fashion_mnist import FashionMNIST
from vitsinks.data.imagefolder import ImageFolderSplit, train_classes
from vitsinks.data.sinktasks import SinkTask, is_sink_task, sink_task_name
from vitsinks.data.synthetic import SyntheticShapes
from vitsinks.utils.errors import BadValue, InputNotFound

CLASSIFICATION = ("synthetic", "fashion_mnist", "imagenet", "sinktask_nop", "sinktask_broadcast")


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


def build_classification(cfg: DataConfig, split: str, seed: int = 0) -> Dataset:
    """The `(PIL image, label)` dataset of `split` (train | val) named by `cfg.name`; fails early on a bad root."""
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
        return ImageFolderSplit(root, split, classes=None if split == "train" else train_classes(root),
                                cache=cfg.file_list_cache)
    raise BadValue(f"data.name={cfg.name} is not an image-level dataset; choose one of {CLASSIFICATION}")


def num_classes(dataset: Dataset) -> int:
    """Number of classes of a built dataset (of its base when it is a subset)."""
    if isinstance(dataset, Subset):
        return num_classes(dataset.dataset)
    if isinstance(dataset, SyntheticShapes):
        return dataset.num_classes
    if isinstance(dataset, SinkTask):
        return 0  # per-patch regression targets, no classes
    return len(dataset.classes)  # type: ignore[attr-defined]
