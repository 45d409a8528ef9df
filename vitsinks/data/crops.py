"""Multi-crop views (lightly's DINO transforms, or the reference's torchvision ones), per-sample seeded so that a
resumed run sees the same views."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import numpy as np
import torch
import torchvision.transforms as T
from lightly.transforms.dino_transform import DINOViewTransform
from lightly.transforms.multi_view_transform import MultiViewTransform
from torch.utils.data import Dataset, Sampler

from vitsinks.configs.schema import ViewsConfig
from vitsinks.data.imagefolder import read_item
from vitsinks.utils.errors import BadValue

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def kempner_view(size: int, scale: Sequence[float], v: ViewsConfig) -> T.Compose:
    """One view of KempnerInstitute/attention_sink's `src/data.py` `MultiViewTransform` (commit a83cd59), with the
    run's probabilities (`recipe=paper`: the reference's); every draw from torch's global generator."""
    return T.Compose([
        T.RandomResizedCrop(size, scale=tuple(scale)),
        T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=v.color_jitter),
        T.RandomGrayscale(p=v.grayscale),
        T.RandomApply([T.GaussianBlur(kernel_size=7, sigma=(0.1, 2.0))], p=v.blur),
        T.RandomApply([T.RandomSolarize(threshold=128)], p=v.solarize),
        T.RandomHorizontalFlip(p=v.hflip),
        T.ToTensor(),
        T.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD),
    ])


def view_transform(v: ViewsConfig) -> MultiViewTransform:
    """`n_global` global and `n_local` local views: lightly's DINO views (`style=dino`) or the reference's
    (`kempner_view`, the same pipeline for every view)."""
    if v.style == "kempner":
        return MultiViewTransform([kempner_view(v.global_size, v.global_scale, v) for _ in range(v.n_global)]
                                  + [kempner_view(v.local_size, v.local_scale, v) for _ in range(v.n_local)])

    def one(size: int, scale: Sequence[float], blur: float, solarize: float) -> DINOViewTransform:
        return DINOViewTransform(crop_size=size, crop_scale=cast(tuple[float, float], tuple(scale)), hf_prob=v.hflip,
                                 cj_prob=v.color_jitter, random_gray_scale=v.grayscale, gaussian_blur=blur,
                                 solarization_prob=solarize)

    # DINO's asymmetry: the first global view is always blurred, the second sometimes solarized.
    globals_ = [one(v.global_size, v.global_scale, 1.0 if i == 0 else v.blur, 0.0 if i == 0 else v.solarize)
                for i in range(v.n_global)]
    locals_ = [one(v.local_size, v.local_scale, v.blur, 0.0) for _ in range(v.n_local)]
    return MultiViewTransform(globals_ + locals_)


def sample_seed(*keys: int) -> int:
    """A 32-bit seed that is a pure function of the keys (run seed, epoch, index)."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1)[0])


@contextmanager
def seeded_rngs(seed: int) -> Iterator[None]:
    """Seed the RNGs the view transforms draw from: torch's CPU generator, restored afterwards so that the training
    step's own draws do not depend on the images loaded, and numpy's global one (lightly's), left seeded (nothing
    else uses it, and restoring it costs more than a transform)."""
    gen = torch.random.default_generator
    state = gen.get_state()
    gen.manual_seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        gen.set_state(state)


class SeededViews(Dataset):
    """Views of `base[i]` (`transform`: `view_transform`'s or `device_crops.CropFlipViews`) drawn with RNGs seeded by
    (seed, epoch, i): independent of workers, ranks and resumes. A corrupt image yields None (`collate_views`
    counts it) or, with `on_bad_image="error"`, raises `BadImage`."""

    def __init__(self, base: Dataset, transform: Any, seed: int, on_bad_image: str = "skip") -> None:
        self.base, self.transform, self.seed, self.on_bad_image = base, transform, seed, on_bad_image
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.base)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> tuple[Any, int] | None:
        item = read_item(self.base, index, self.on_bad_image)
        if item is None:
            return None
        with seeded_rngs(sample_seed(self.seed, self.epoch, index)):
            return self.transform(item[0]), item[1]


def collate_views(batch: list[Any]) -> tuple[list[torch.Tensor], torch.Tensor, int]:
    """Stack each view over the batch; drop (and count) the images that could not be read."""
    good = [b for b in batch if b is not None]
    n_bad = len(batch) - len(good)
    if not good:
        return [], torch.zeros(0, dtype=torch.long), n_bad
    views = [torch.stack([b[0][v] for b in good]) for v in range(len(good[0][0]))]
    return views, torch.tensor([b[1] for b in good]), n_bad


class EpochSampler(Sampler[int]):
    """One seeded permutation per epoch, cut into global batches; yields this rank's slice of each batch, so the union
    over ranks of step k's batch is the single-process batch k. `set_epoch(e, start_batch)` resumes mid-epoch."""

    def __init__(self, n: int, global_batch: int, seed: int, rank: int = 0, world: int = 1) -> None:
        if global_batch % world:
            raise BadValue(f"train.batch_size {global_batch} is not divisible by the {world} ranks")
        if n < global_batch:
            raise BadValue(f"the dataset has {n} images, fewer than one batch of {global_batch}")
        self.n, self.batch, self.seed, self.rank, self.world = n, global_batch, seed, rank, world
        self.local = global_batch // world
        self.epoch, self.start_batch = 0, 0

    @property
    def batches_per_epoch(self) -> int:
        return self.n // self.batch

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        self.epoch, self.start_batch = epoch, start_batch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(sample_seed(self.seed, self.epoch, 0x5A))
        perm = torch.randperm(self.n, generator=g).tolist()
        for b in range(self.start_batch, self.batches_per_epoch):
            lo = b * self.batch + self.rank * self.local
            yield from perm[lo : lo + self.local]

    def __len__(self) -> int:
        return (self.batches_per_epoch - self.start_batch) * self.local
