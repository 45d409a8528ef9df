"""The data sets vitsinks ships, registered in `DATASETS`: `synthetic`, `fashion_mnist`, `imagenet`, the sink tasks,
and the segmentation sets `ade20k` and `voc`."""

from __future__ import annotations

from typing import ClassVar

from torch.utils.data import Dataset

from vitsinks.configs.schema import DataConfig
from vitsinks.data.classification import check_root
from vitsinks.data.datasets import DATASETS, DataSet
from vitsinks.data.fashion_mnist import DEFAULT_ROOT as FASHION_MNIST_ROOT
from vitsinks.data.fashion_mnist import FashionMNIST
from vitsinks.data.imagefolder import ImageFolderSplit, train_classes
from vitsinks.data.segmentation import BackgroundIgnored, FashionMNISTMosaic, SyntheticMasks, ade20k, voc
from vitsinks.data.sinktasks import SinkTask, sink_task_name
from vitsinks.data.synthetic_images import SyntheticShapes


def _length(cfg: DataConfig, split: str) -> int:
    return cfg.train_size if split == "train" else cfg.val_size


def _stream(seed: int, split: str) -> int:
    """The generator seed of a generated split: train and val are disjoint streams."""
    return seed * 2 + (split != "train")


@DATASETS.register
class Synthetic(DataSet):
    """Procedural shapes (`vitsinks.data.synthetic_images`); its masks: `num_classes + 1` classes, 0 = background."""

    name = "synthetic"
    masks = True

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> SyntheticShapes:
        return SyntheticShapes(cfg.image_size, _length(cfg, split), cfg.num_classes, seed=_stream(seed, split))

    @classmethod
    def segmentation(cls, cfg: DataConfig, split: str, seed: int, voc_background: bool = True) -> Dataset:
        return SyntheticMasks(cls.images(cfg, split, seed))


@DATASETS.register
class FashionMNISTSet(DataSet):
    """Fashion-MNIST from its IDX files; its masks are mosaics of its items (`FashionMNISTMosaic`)."""

    name = "fashion_mnist"
    label = "Fashion-MNIST mosaics"
    masks = True

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> Dataset:
        root = check_root(cfg.root or FASHION_MNIST_ROOT, "fashion_mnist", FASHION_MNIST_ROOT)
        return FashionMNIST(root, split, size=cfg.image_size)

    @classmethod
    def segmentation(cls, cfg: DataConfig, split: str, seed: int, voc_background: bool = True) -> Dataset:
        return FashionMNISTMosaic(cls.images(cfg, split, seed), cfg.image_size, _length(cfg, split),
                                  _stream(seed, split))


@DATASETS.register
class ImageNet(DataSet):
    """An ImageFolder tree (`train/`, `val/`); val keeps the classes of train."""

    name = "imagenet"

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> Dataset:
        root = check_root(cfg.root, "imagenet", "/datasets/imagenet")
        return ImageFolderSplit(root, split, classes=None if split == "train" else train_classes(root),
                                cache=cfg.file_list_cache)


class _SinkTaskSet(DataSet):
    """A sink task (`vitsinks.data.sinktasks`): per-patch regression targets, no classes."""

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> Dataset:
        return SinkTask(sink_task_name(cls.name), cfg.image_size, cfg.patch_size, _length(cfg, split),
                        seed=_stream(seed, split), marked_frac=cfg.marked_frac, marker=cfg.marker)


@DATASETS.register
class SinkTaskNop(_SinkTaskSet):
    name = "sinktask_nop"


@DATASETS.register
class SinkTaskBroadcast(_SinkTaskSet):
    name = "sinktask_broadcast"


class _LabelMaps(DataSet):
    """A segmentation set: its images come with their label maps (also for the analyses)."""

    masks = True
    example: ClassVar[str]  # where its root usually is

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> Dataset:
        return cls.segmentation(cfg, split, seed)

    @classmethod
    def segmentation(cls, cfg: DataConfig, split: str, seed: int, voc_background: bool = True) -> Dataset:
        check_root(cfg.root, cls.name, cls.example)
        return cls.files(cfg, split, voc_background)

    @classmethod
    def files(cls, cfg: DataConfig, split: str, voc_background: bool) -> Dataset:
        """The split read from `data.root` (checked)."""
        raise NotImplementedError


@DATASETS.register
class ADE20K(_LabelMaps):
    name, label, example = "ade20k", "ADE20K", "/datasets/ade20k"

    @classmethod
    def files(cls, cfg: DataConfig, split: str, voc_background: bool) -> Dataset:
        return ade20k(cfg.root, split, cfg.num_classes)  # type: ignore[arg-type]


@DATASETS.register
class VOC(_LabelMaps):
    name, label, example = "voc", "VOC", "/datasets/voc"

    @classmethod
    def files(cls, cfg: DataConfig, split: str, voc_background: bool) -> Dataset:
        ds = voc(cfg.root, split, cfg.num_classes, cfg.voc_aug)  # type: ignore[arg-type]
        return ds if voc_background else BackgroundIgnored(ds)
