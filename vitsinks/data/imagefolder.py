"""ImageNet-1k (or any dataset) in ImageFolder layout: `<root>/<split>/<class>/*.JPEG`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from PIL import Image
from torch.utils.data import Dataset
from torchvision.datasets import ImageFolder
from torchvision.datasets.folder import find_classes

from vitsinks.utils.errors import BadValue, InputNotFound, UserError

log = logging.getLogger(__name__)


class BadImage(UserError):
    """An image file that cannot be decoded."""


def strict_loader(path: str) -> Image.Image:
    """Open and fully decode an image as RGB; a corrupt or unreadable file raises `BadImage` naming it."""
    try:
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:
        raise BadImage(f"cannot decode image {path}: {err}") from err


def read_item(dataset: Dataset, index: int, on_bad_image: str = "skip") -> Any:
    """`dataset[index]`; an unreadable image is None (a warning) under `skip`, or `BadImage` with the fix under
    `error`. Every split goes through here: one bad file never stops a run whose policy is `skip`."""
    try:
        return dataset[index]
    except BadImage as err:
        if on_bad_image == "error":
            raise BadImage(f"{err} (set data.on_bad_image=skip to skip such files)") from err
        log.warning("skipping %s", err)
        return None


def train_classes(root: str | Path) -> list[str]:
    """The class folders of `<root>/train` (torchvision's order), without scanning their images."""
    folder = Path(root) / "train"
    if not folder.is_dir():
        raise InputNotFound(f"no 'train' split at {folder}: the train split's class folders number the labels of "
                            f"every split")
    return find_classes(str(folder))[0]


class ImageFolderSplit(ImageFolder):
    """torchvision's ImageFolder on `<root>/<split>`, with a loader that reports corrupt files clearly.

    `classes`: the class list that numbers the labels (pass the train split's for every other split); a split
    whose class folders differ from it is a `BadValue`, never a silent shift of the labels.
    """

    def __init__(self, root: str | Path, split: str = "train", classes: list[str] | None = None) -> None:
        self.expected_classes = classes
        folder = Path(root) / split
        if not folder.is_dir():
            raise InputNotFound(
                f"no {split!r} split at {folder}: data.root must hold {split}/<class>/<images> "
                f"(ImageNet: train/n01440764/*.JPEG, val/n01440764/*.JPEG)"
            )
        try:
            super().__init__(str(folder), loader=strict_loader, allow_empty=classes is not None)
        except FileNotFoundError as err:
            raise InputNotFound(
                f"{folder} has no class folders with images: expected {folder}/<class>/<image files> ({err})"
            ) from err

    def find_classes(self, directory: str | Path) -> tuple[list[str], dict[str, int]]:
        found, _ = super().find_classes(directory)
        if self.expected_classes is not None and found != list(self.expected_classes):
            missing = sorted(set(self.expected_classes) - set(found))
            extra = sorted(set(found) - set(self.expected_classes))
            raise BadValue(
                f"the class folders of {directory} differ from the train split's ("
                + ", ".join(part for part in (f"missing: {' '.join(missing[:5])}" if missing else "",
                                              f"not in train: {' '.join(extra[:5])}" if extra else "") if part)
                + "): labels are numbered from the train split's classes, so every split needs the same class "
                "folders (an empty folder is fine)")
        classes = list(self.expected_classes) if self.expected_classes is not None else found
        return classes, {c: i for i, c in enumerate(classes)}
