"""ImageNet-1k (or any dataset) in ImageFolder layout: `<root>/<split>/<class>/*.JPEG`."""

from __future__ import annotations

from pathlib import Path

from PIL import Image
from torchvision.datasets import ImageFolder


class BadImage(Exception):
    """An image file that cannot be decoded."""


def strict_loader(path: str) -> Image.Image:
    """Open and fully decode an image as RGB; a corrupt or unreadable file raises `BadImage` naming it."""
    try:
        with open(path, "rb") as f:
            img = Image.open(f)
            return img.convert("RGB")
    except (OSError, ValueError, SyntaxError) as err:
        raise BadImage(f"cannot decode image {path}: {err}") from err


class ImageFolderSplit(ImageFolder):
    """torchvision's ImageFolder on `<root>/<split>`, with a loader that reports corrupt files clearly."""

    def __init__(self, root: str | Path, split: str = "train") -> None:
        folder = Path(root) / split
        if not folder.is_dir():
            raise FileNotFoundError(
                f"no {split!r} split at {folder}: data.root must hold {split}/<class>/<images> "
                f"(ImageNet: train/n01440764/*.JPEG, val/n01440764/*.JPEG)"
            )
        try:
            super().__init__(str(folder), loader=strict_loader)
        except FileNotFoundError as err:
            raise FileNotFoundError(
                f"{folder} has no class folders with images: expected {folder}/<class>/<image files> ({err})"
            ) from err
