"""The data sets by name (`data.name`): the `DataSet` interface and its registry, `DATASETS`.

A data set says how to build a split of itself from the `data` config: `images` (items `(PIL image, label)`: a class
index, a sink task's targets, or for a set with label maps only (ADE20K, VOC) its label map) and, when the dense
probe takes it (`masks`), `segmentation` (items `(PIL image, uint8 label map)`, 255 = ignore). The shipped ones are
in `vitsinks.data.builtin`; a new one is a `DataSet` registered with `@DATASETS.register` in a module of
`plugins=` plus its `configs/data/<name>.yaml` (docs/extending.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from torch.utils.data import Dataset

from vitsinks.configs.schema import DataConfig
from vitsinks.utils.errors import BadValue
from vitsinks.utils.registry import Registry

if TYPE_CHECKING:  # annotations only
    from omegaconf import DictConfig


class DataSet:
    """One data set `data.name` selects (see the module docstring)."""

    name: ClassVar[str]
    label: ClassVar[str] = ""  # its name in tables (the dense probe's columns); empty: its name
    masks: ClassVar[bool] = False  # has segmentation label maps: the dense probe takes it (`segmentation`)

    @classmethod
    def images(cls, cfg: DataConfig, split: str, seed: int) -> Dataset:
        """The items of `split` (train | val) for training, the linear probe and the analyses; fails early on a bad
        root. `seed`: the run's (a generated set draws train and val as disjoint streams of it)."""
        raise NotImplementedError

    @classmethod
    def segmentation(cls, cfg: DataConfig, split: str, seed: int, voc_background: bool = True) -> Dataset:
        """The `(PIL image, label map)` items of `split` for the dense probe (`masks` sets only); with
        `voc_background=False` a background class is ignored (255)."""
        raise BadValue(f"data={cls.name} has no segmentation masks: use {', '.join(with_masks())} for the dense probe")


DATASETS: Registry[type[DataSet]] = Registry(
    "data set", "a `DataSet` registered with `@DATASETS.register` in a module of `plugins=`, with its "
    "configs/data/<name>.yaml (docs/extending.md)", fields=("data.name", "eval.dense_data"))


def with_masks() -> list[str]:
    """The registered data sets the dense probe takes (those with segmentation masks), in registration order."""
    return [n for n, d in DATASETS.items() if d.masks]


def build_dataset(cfg: DataConfig | DictConfig, split: str, seed: int = 0) -> Dataset:
    """The `(PIL image, label)` dataset of `split` (train | val) named by `cfg.name` (ADE20K / VOC: the label is
    the label map); fails early on a bad root."""
    return DATASETS.get(str(cfg.name)).images(cast(DataConfig, cfg), split, seed)  # a `data` DictConfig reads as one

