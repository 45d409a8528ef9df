"""The images a notebook passes: a tensor, a dataset, or batches (a `DataLoader`), as one (n, 3, H, W) tensor."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Union

import torch
from torch.utils.data import Dataset

from vitsinks.configs.ranges import check_setting
from vitsinks.configs.schema import DiagnosticsConfig
from vitsinks.utils.errors import BadValue

ImageSource = Union[torch.Tensor, Dataset, Iterable[Any]]  # noqa: UP007  (a runtime alias: the docs name it)


def _image_of(item: Any, what: str) -> torch.Tensor:
    """The image of a dataset item or the images of a batch: the item itself, or the first of a tuple / list
    ((image, label), as torchvision's datasets give), or `pixel_values` of a dict (transformers' processors)."""
    if isinstance(item, dict) and "pixel_values" in item:
        item = item["pixel_values"]
    elif isinstance(item, tuple | list) and item:
        item = item[0]
    if not isinstance(item, torch.Tensor):
        raise BadValue(f"{what} is a {type(item).__name__}, not an image tensor: give the dataset a transform "
                       f"that returns tensors normalised for the model (e.g. timm's create_transform)")
    return item


def as_images(images: ImageSource, n_images: int | None = None) -> torch.Tensor:
    """`images` as one float tensor (n, 3, H, W): a tensor as is; a `Dataset` (items: an image, (image, label) or
    {"pixel_values": ...}) by its first `n_images` items; any other iterable (a `DataLoader`) by its batches until
    `n_images` images. `n_images` None: all of them."""
    check_setting(DiagnosticsConfig, "n_images", n_images)
    if isinstance(images, torch.Tensor):
        x = images[:n_images]
    elif isinstance(images, Dataset) and hasattr(images, "__len__"):
        n = len(images) if n_images is None else min(n_images, len(images))
        got = [_image_of(images[i], f"item {i} of the dataset") for i in range(n)]
        x = torch.stack(got) if got else torch.empty(0)  # an empty dataset: refused below, as an empty loader is
    elif isinstance(images, Iterable):
        got, total = [], 0
        for batch in images:
            b = _image_of(batch, "a batch")
            got.append(b if b.dim() == 4 else b.unsqueeze(0))
            total += len(got[-1])
            if n_images is not None and total >= n_images:
                break
        x = torch.cat(got)[:n_images] if got else torch.empty(0)
    else:
        raise BadValue(f"images is a {type(images).__name__}: give a tensor (n, 3, H, W), a dataset or a DataLoader")
    if x.dim() != 4 or len(x) == 0:
        raise BadValue(f"images must be a non-empty batch (n, 3, H, W), got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise BadValue(f"images are {x.dtype}, not normalised floats: pass them through the model's transform "
                       f"(pretrained.load(...).images, or its library's preprocessing)")
    if not bool(torch.isfinite(x).all()):
        raise BadValue("images hold NaN or inf values: they are no input a diagnosis can describe")
    return x.float()


__all__ = ["ImageSource", "as_images"]
