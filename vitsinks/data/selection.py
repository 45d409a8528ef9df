"""Which images of a split an analysis reads, in which order, and how they are preprocessed.

Every command that uses n images of a split takes them from one order: a seeded permutation of the split in its own
(sorted) order, `permutation(len(split), selection.seed)`, so that position k is the same image on every machine;
or an image list (`selection.image_list`); never the split's first n files (ImageFolder's are sorted by class).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightly.transforms.utils import IMAGENET_NORMALIZE
from torch.utils.data import Dataset
from torchvision import transforms as T

from vitsinks.configs.schema import SelectionConfig
from vitsinks.data.imagefolder import read_item
from vitsinks.utils.errors import BadValue, InputNotFound

LISTS_DIR = Path(__file__).resolve().parent / "lists"  # image lists shipped with vitsinks
DEFAULT_CROP_PCT = 224 / 256  # shorter side resized to size / crop_pct (256 for 224), then a centre crop


def permutation(n: int, seed: int) -> list[int]:
    """`torch.randperm(n)` drawn from a generator seeded `seed`, as a list."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(int(seed))).tolist()


def item_names(dataset: Dataset) -> list[str] | None:
    """The image file name of every item of a file-backed dataset (ImageFolder, ADE20K / VOC), else None."""
    if hasattr(dataset, "samples"):  # torchvision ImageFolder
        return [Path(p).name for p, _ in dataset.samples]
    if hasattr(dataset, "pairs"):  # vitsinks.data.segmentation.SegFiles
        return [Path(p).name for p, _ in dataset.pairs]
    return None


def read_list(image_list: str) -> list[str]:
    """The file names of an image list, a file or the name of a list shipped in `vitsinks/data/lists/` (one per line;
    blank lines and `#` comments ignored)."""
    path = next((p for p in (Path(image_list).expanduser(), LISTS_DIR / image_list) if p.is_file()), None)
    if path is None:
        have = ", ".join(sorted(p.name for p in LISTS_DIR.glob("*.txt")))
        raise InputNotFound(f"selection.image_list={image_list}: no such file (and no shipped list of that name; "
                            f"shipped: {have})")
    return [s for line in path.read_text().splitlines() if (s := line.strip()) and not s.startswith("#")]


def split_order(dataset: Dataset, selection: SelectionConfig) -> list[int]:
    """Indices of `dataset` in the order an analysis reads them (see the module docstring)."""
    n = len(dataset)  # type: ignore[arg-type]
    if selection.image_list:
        names = item_names(dataset)
        if names is None:
            raise BadValue(f"selection.image_list={selection.image_list} names image files, but this dataset has none "
                           f"(a generated dataset): drop selection.image_list or use an on-disk dataset")
        where = {name: i for i, name in enumerate(names)}
        wanted = read_list(selection.image_list)
        if missing := [w for w in wanted if w not in where]:
            raise InputNotFound(f"{len(missing)} of the {len(wanted)} images of selection.image_list="
                                f"{selection.image_list} are not in the split (first: {missing[0]}): point data.root "
                                f"at the dataset the list was made for")
        return [where[w] for w in wanted]
    if selection.order == "first":
        return list(range(n))
    return permutation(n, selection.seed)


def select_items(dataset: Dataset, counts: Sequence[int], selection: SelectionConfig, on_bad_image: str = "skip",
                 up_to: bool = False) -> list[tuple[list[Any], list[int]]]:
    """Consecutive, disjoint groups of readable items in the analysis order (`counts=[4096, 4096]`: the first 4,096
    readable images and the next 4,096), as (items, their indices in the split) per group. More than the order holds
    is an error; with `up_to`, one group of at most `counts[0]` is returned instead."""
    order = split_order(dataset, selection)
    readable = ((item, i) for i in order if (item := read_item(dataset, i, on_bad_image)) is not None)
    if up_to:
        group = list(islice(readable, counts[0]))
        if not group:
            raise BadValue(f"no readable image among the {len(order)} of the split: check data.root")
        return [([it for it, _ in group], [i for _, i in group])]
    need = sum(counts)
    if need > len(order):
        raise BadValue(f"{' + '.join(map(str, counts))} images were asked for but the split "
                       + (f"list {selection.image_list} " if selection.image_list else "")
                       + f"has {len(order)}: lower the number of images or use a larger split")
    groups: list[tuple[list[Any], list[int]]] = []
    for want in counts:  # consecutive ranges of one stream of readable images: disjoint by construction
        group = list(islice(readable, want))
        if len(group) < want:
            raise BadValue(f"only {sum(len(g[0]) for g in groups) + len(group)} readable images where {need} were "
                           f"asked for: lower the number of images (unreadable ones are skipped)")
        groups.append(([it for it, _ in group], [i for _, i in group]))
    return groups


def analysis_crop(size: int, crop_pct: float = DEFAULT_CROP_PCT, interpolation: str = "bicubic") -> T.Compose:
    """The geometric part of `analysis_transform` (a PIL image in, a PIL image out; also what plots show)."""
    mode = T.InterpolationMode(interpolation)
    return T.Compose([T.Resize(round(size / crop_pct), interpolation=mode), T.CenterCrop(size)])


def analysis_transform(size: int, crop_pct: float = DEFAULT_CROP_PCT,
                       interpolation: str = "bicubic") -> T.Compose:
    """The view of probes and analyses: resize to `round(size / crop_pct)`, centre crop `size`, ImageNet mean / std."""
    return T.Compose([analysis_crop(size, crop_pct, interpolation), T.ToTensor(),
                      T.Normalize(IMAGENET_NORMALIZE["mean"], IMAGENET_NORMALIZE["std"])])


def stretched(images: torch.Tensor) -> np.ndarray:
    """Model inputs (n, 3, H, W) as uint8 RGB (n, H, W, 3) for plots, each image min-max stretched to its range."""
    x = images.detach().float().cpu()
    lo, hi = x.amin(dim=(1, 2, 3), keepdim=True), x.amax(dim=(1, 2, 3), keepdim=True)
    return ((x - lo) / (hi - lo).clamp_min(1e-12) * 255).round().byte().permute(0, 2, 3, 1).numpy()


def images_of(items: list[tuple], size: int,
              selection: SelectionConfig | None = None) -> tuple[torch.Tensor, np.ndarray]:
    """Dataset items' images as a normalised batch (n, 3, size, size), preprocessed as `selection` says, and as uint8
    RGB for plots; tensors (the sink tasks) are taken as they are, shown min-max scaled."""
    first = [item[0] for item in items]
    if isinstance(first[0], torch.Tensor):  # tensor datasets (the sink tasks) are model inputs already
        x = torch.stack(first)
        return x, stretched(x)
    crop, *rest = selection_transform(size, selection).transforms  # crop once: the model's view is what plots show
    cropped = [crop(im.convert("RGB")) for im in first]
    return torch.stack([T.Compose(rest)(im) for im in cropped]), np.stack([np.asarray(im) for im in cropped])


def selection_transform(size: int, selection: SelectionConfig | None = None) -> T.Compose:
    """`analysis_transform` with the preprocessing of `selection` (a `SelectionConfig`; None: the defaults)."""
    p = selection or SelectionConfig()
    return analysis_transform(size, p.crop_pct, str(p.interpolation))


def fixed_images(dataset: Dataset, n: int, size: int, on_bad_image: str = "skip",
                 selection: SelectionConfig | None = None) -> tuple[torch.Tensor, np.ndarray, list[int]]:
    """The first `n` readable images of `dataset` in the order of `selection` (all when it holds fewer), as
    `images_of` gives them, and their indices in the split."""
    p = selection or SelectionConfig()
    if len(dataset) == 0:  # type: ignore[arg-type]
        raise BadValue("the validation split is empty: there is no image to diagnose")
    ((items, idx),) = select_items(dataset, [n], p, on_bad_image, up_to=True)
    return (*images_of(items, size, p), idx)
