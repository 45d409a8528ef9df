"""The dense-probe protocols: every fixed setting of each in one table, and the pieces of their recipes.

`dinov2`: BatchNorm + 1x1 conv on the final-norm patch tokens at the model's input size, cached unaugmented features,
AdamW with a plain cosine, evaluated once at the end with a sliding window at full label resolution.
`kempner`: the attention-sink reference's probe: a Linear layer per patch token at 512 x 512 (the position embedding
resampled to the grid of that size), trained on random resized crops + flips, evaluated on images and labels resized
to 512 x 512 before the first epoch and after every epoch; the best epoch is reported. VOC background is ignored.
`kempner_cached`: the reference's Table-1 variant of it: no augmentation (features cached once), longer schedules,
three probe seeds (mean and population std reported).

The protocols are registered in `DENSE_PROTOCOLS` (`eval.dense_protocol` selects one): a new protocol is a
`DenseProtocol` registered there from a module of `plugins=` (docs/extending.md).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from vitsinks.utils.errors import ConfigError
from vitsinks.utils.registry import Registry

# eval.* field -> protocol setting; the kempner protocols take only the first two (a CPU check needs small images).
OVERRIDES = {"dense_size": "size", "dense_epochs": "epochs", "dense_lr": "lr", "dense_weight_decay": "weight_decay",
             "dense_batch_size": "batch_size", "dense_augment": "augment"}


@dataclass(frozen=True)
class DenseProtocol:
    """One protocol's settings; `epochs_by_data` gives the epochs of named datasets, `epochs` those of the rest."""

    name: str
    batchnorm: bool  # BatchNorm before the per-patch linear map (a 1x1 conv is a Linear layer on each token)
    size: int | None  # input side in pixels; None: the model's own input size
    val: str  # "slide": full label resolution, sliding window | "resize": image and labels resized to size x size
    augment: bool  # train on random resized crops + flips (features recomputed); False: cached resized features
    crop_scale: tuple[float, float]
    crop_ratio: tuple[float, float]
    epochs: int
    epochs_by_data: tuple[tuple[str, int], ...]
    lr: float
    weight_decay: float
    batch_size: int
    warmup_iters: int  # linear warm-up from warmup_start x lr to lr over these iterations, then cosine
    warmup_start: float
    min_lr_ratio: float  # the cosine ends at lr x min_lr_ratio
    grad_clip: float | None  # max gradient norm; None: no clipping
    drop_last: bool  # drop an epoch's last partial batch (when there is a full one)
    best_over_epochs: bool  # val before the first epoch and after each, best reported; False: once, at the end
    probe_seeds: int  # heads trained with seeds seed, seed + 1, ...; mean and population std reported
    voc_background: bool  # False: VOC class 0 is ignored (20 classes)
    miou_classes: str  # "present": mean over classes in prediction or labels | "all": absent classes count as 0
    label: str = ""  # its name in tables (the leaderboard's dense columns)
    overrides: tuple[str, ...] = tuple(OVERRIDES)  # the eval.dense_* fields that may change its settings

    def for_data(self, name: str) -> DenseProtocol:
        """These settings with `epochs` resolved for the dataset `name`."""
        return replace(self, epochs=dict(self.epochs_by_data).get(name, self.epochs), epochs_by_data=())

    def settings(self) -> dict[str, Any]:
        """The settings as written into the result JSON."""
        return {k: v for k, v in asdict(self).items() if k not in ("name", "epochs_by_data", "label", "overrides")}


DENSE_PROTOCOLS: Registry[DenseProtocol] = Registry(
    "dense-probe protocol", "a `DenseProtocol` registered with `DENSE_PROTOCOLS.register` in a module of `plugins=` "
    "(docs/extending.md)", fields=("eval.dense_protocol",))
DENSE_PROTOCOLS.register(DenseProtocol(
    name="dinov2", batchnorm=True, size=None, val="slide", augment=False, crop_scale=(0.25, 1.0),
    crop_ratio=(3 / 4, 4 / 3), epochs=10, epochs_by_data=(), lr=1e-3, weight_decay=1e-4, batch_size=16,
    warmup_iters=0, warmup_start=1.0, min_lr_ratio=0.0, grad_clip=None, drop_last=False, best_over_epochs=False,
    probe_seeds=1, voc_background=True, miou_classes="present", label="DINOv2-style probe"))
_KEMPNER = DENSE_PROTOCOLS.register(DenseProtocol(
    name="kempner", batchnorm=False, size=512, val="resize", augment=True, crop_scale=(0.5, 1.0),
    crop_ratio=(0.75, 1.33), epochs=10, epochs_by_data=(("ade20k", 10), ("voc", 25)), lr=5e-3, weight_decay=1e-2,
    batch_size=32, warmup_iters=100, warmup_start=0.01, min_lr_ratio=0.01, grad_clip=1.0, drop_last=True,
    best_over_epochs=True, probe_seeds=1, voc_background=False, miou_classes="all", label="reference probe",
    overrides=("dense_size", "dense_epochs")))
DENSE_PROTOCOLS.register(replace(_KEMPNER, name="kempner_cached", augment=False, epochs=25,
                                 epochs_by_data=(("ade20k", 25), ("voc", 100)), probe_seeds=3,
                                 label="reference cached probe"))
DEFAULT_PROTOCOL = "dinov2"  # its results are written without a protocol suffix (`dense_<data>.json`)


def resolve(e: Any, data_name: str) -> tuple[DenseProtocol, dict[str, Any]]:
    """(the protocol `e.dense_protocol` for `data_name` with the `eval.dense_*` overrides applied, the overrides that
    changed a setting). `ConfigError` for an override the protocol does not take (an unknown protocol: `BadValue`)."""
    name = str(e.dense_protocol)
    proto = DENSE_PROTOCOLS.get(name).for_data(data_name)
    given = {k: getattr(e, k) for k in OVERRIDES if getattr(e, k, None) is not None}
    fixed = [k for k in given if k not in proto.overrides]
    if fixed:
        sets = ", ".join(f"eval.{k}={given[k]}" for k in fixed)
        own = ", ".join(f"{OVERRIDES[k]} {getattr(proto, OVERRIDES[k])}" for k in fixed)
        free = ", ".join(f"eval.{k}" for k in proto.overrides) or "none"
        raise ConfigError(f"{sets}: eval.dense_protocol={name} fixes {own} (only {free} may change); tune them "
                          f"under dense_protocol={DEFAULT_PROTOCOL}")
    changed = {OVERRIDES[k]: v for k, v in given.items() if getattr(proto, OVERRIDES[k]) != v}
    return replace(proto, **changed), changed


def lr_factor(step: int, total: int, proto: DenseProtocol) -> float:
    """The learning rate of iteration `step` (0-based) of `total`, as a fraction of the base rate: a linear warm-up
    from `warmup_start` to 1 over `warmup_iters` (at most total - 1), then a cosine from 1 to `min_lr_ratio`."""
    warm = max(0, min(proto.warmup_iters, total - 1))
    if step < warm:
        return proto.warmup_start + (1 - proto.warmup_start) * step / warm
    t = min(step - warm, max(total - warm, 1)) / max(total - warm, 1)
    return proto.min_lr_ratio + (1 - proto.min_lr_ratio) * (1 + math.cos(math.pi * t)) / 2


def scheduler(opt: torch.optim.Optimizer, total: int, proto: DenseProtocol) -> torch.optim.lr_scheduler.LambdaLR:
    """`lr_factor` as a scheduler stepped once per iteration."""
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, total, proto))


def best_epoch(curve: list[float]) -> int:
    """The index of the best value of a validation curve (the first on ties; NaN never wins; 0 if all are NaN)."""
    best = 0
    for i, v in enumerate(curve):
        if not math.isnan(v) and (math.isnan(curve[best]) or v > curve[best]):
            best = i
    return best
