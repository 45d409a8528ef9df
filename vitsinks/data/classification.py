"""What the data sets share: a checked `data.root` and the class count of a built dataset."""

from __future__ import annotations

from pathlib import Path

from torch.utils.data import Dataset, Subset

from vitsinks.data.sinktasks import SinkTask
from vitsinks.data.synthetic_images import SyntheticShapes
from vitsinks.utils.errors import InputNotFound


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


def num_classes(dataset: Dataset) -> int:
    """Number of classes of a built dataset (of its base when it is a subset)."""
    if isinstance(dataset, Subset):
        return num_classes(dataset.dataset)
    if isinstance(dataset, SyntheticShapes):
        return dataset.num_classes
    if isinstance(dataset, SinkTask):
        return 0  # per-patch regression targets, no classes
    return len(dataset.classes)  # type: ignore[attr-defined]
