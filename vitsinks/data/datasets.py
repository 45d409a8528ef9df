"""The data sets by name (`data.name`): the `DataSet` interface and its registry, `DATASETS` (the shipped ones in
`vitsinks.data.builtin`; a new one: docs/extending.md)."""

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
        """The `(PIL image, label)` items of `split` (train | val); the label is a class index, a sink task's targets,
        or a segmentation set's label map. Fails early on a bad root; `seed`: the run's."""
        raise NotImplementedError

    @classmethod
    def segmentation(cls, cfg: DataConfig, split: str, seed: int, voc_background: bool = True) -> Dataset:
        """The `(PIL image, uint8 label map)` items of `split` for the dense probe (`masks` sets only; 255 = ignore);
        with `voc_background=False` a background class is ignored."""
        raise BadValue(f"data={cls.name} has no segmentation masks: use {', '.join(with_masks())} for the dense probe")


DATASETS: Registry[type[DataSet]] = Registry(
    "data set", "a `DataSet` registered with `@DATASETS.register` in a module of `plugins=`, with its "
    "configs/data/<name>.yaml (docs/extending.md)", fields=("data.name", "eval.dense_data"))


def with_masks() -> list[str]:
    """The registered data sets the dense probe takes (those with segmentation masks), in registration order."""
    return [n for n, d in DATASETS.items() if d.masks]


def build_dataset(cfg: DataConfig | DictConfig, split: str, seed: int = 0) -> Dataset:
    """The `(PIL image, label)` dataset of `split` (train | val) named by `cfg.name` (`DataSet.images`)."""
    return DATASETS.get(str(cfg.name)).images(cast(DataConfig, cfg), split, seed)  # a `data` DictConfig reads as one

