"""The fast path of the multi-crop views (`views.backend=device`, docs/data.md): the loader workers crop and flip
(uint8) and draw each view's photometric parameters (`CropFlipViews`); the training device applies jitter,
grayscale, blur, solarize and normalisation batched, per sample (`DeviceViews`). Every setting is read from the CPU
pipeline's own transforms (`view_specs`), so that the two backends cannot drift apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import kornia
import torch
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF
from PIL import Image

from vitsinks.configs.schema import ViewsConfig
from vitsinks.data.crops import collate_views, view_transform
from vitsinks.utils.errors import ConfigError

# The photometric parameters of one view, one row per view: flags are 0 / 1; `order*` the position of brightness
# (0), contrast (1), saturation (2) and hue (3) in the jitter; `hue` is a fraction of the colour circle.
PARAMS = ("jitter", "order0", "order1", "order2", "order3", "brightness", "contrast", "saturation", "hue", "gray",
          "blur", "sigma", "solarize")
COL = {name: i for i, name in enumerate(PARAMS)}


@dataclass(frozen=True)
class ViewSpec:
    """One view's settings, as the CPU pipeline's transforms hold them (the defaults: a transform it lacks)."""

    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]
    hflip: float = 0.0
    jitter: float = 0.0
    brightness: tuple[float, float] = (1.0, 1.0)
    contrast: tuple[float, float] = (1.0, 1.0)
    saturation: tuple[float, float] = (1.0, 1.0)
    hue: tuple[float, float] = (0.0, 0.0)
    gray: float = 0.0
    blur: float = 0.0
    sigmas: tuple[float, float] = (1.0, 1.0)
    solarize: float = 0.0
    threshold: int = 128  # solarize inverts the 8-bit values >= threshold
    mean: tuple[float, ...] = (0.0, 0.0, 0.0)
    std: tuple[float, ...] = (1.0, 1.0, 1.0)


def _pair(x: Any) -> tuple[float, float]:
    return (float(x[0]), float(x[1])) if x is not None else (1.0, 1.0)


def _spec(transforms: Sequence[Any]) -> ViewSpec:
    """The ViewSpec of one DINOViewTransform's composed transforms (torchvision v1 or v2 classes alike)."""
    got: dict[str, Any] = {}
    for t in transforms:
        name = type(t).__name__
        if name == "RandomResizedCrop":
            if t.interpolation != T.InterpolationMode.BICUBIC:
                raise ConfigError(f"views.backend=device crops bicubic; the CPU pipeline uses {t.interpolation}")
            got.update(size=tuple(t.size), scale=_pair(t.scale), ratio=_pair(t.ratio))
        elif name == "RandomHorizontalFlip":
            got["hflip"] = float(t.p)
        elif name in ("RandomVerticalFlip", "RandomRotate", "RandomRotateDegrees"):
            if float(getattr(t, "p", getattr(t, "prob", 0.0))) > 0:
                raise ConfigError(f"views.backend=device has no {name}: use views.backend=cpu")
        elif name == "RandomApply" and [type(j).__name__ for j in t.transforms] == ["ColorJitter"]:
            cj = t.transforms[0]
            got.update(jitter=float(t.p), brightness=_pair(cj.brightness), contrast=_pair(cj.contrast),
                       saturation=_pair(cj.saturation), hue=_pair(cj.hue) if cj.hue is not None else (0.0, 0.0))
        elif name == "RandomGrayscale":
            got["gray"] = float(t.p)
        elif name == "GaussianBlur":
            got.update(blur=float(t.prob), sigmas=_pair(t.sigmas))
        elif name == "RandomSolarization":
            got.update(solarize=float(t.prob), threshold=int(t.threshold))
        elif name == "Normalize":
            got.update(mean=tuple(float(m) for m in t.mean), std=tuple(float(s) for s in t.std))
        elif name != "ToTensor":
            raise ConfigError(f"views.backend=device does not implement the CPU pipeline's {name}: use "
                              f"views.backend=cpu")
    return ViewSpec(**got)


def view_specs(v: ViewsConfig) -> list[ViewSpec]:
    """Every view's settings (global views first), read from the CPU pipeline `view_transform(v)`."""
    if v.style != "dino":
        raise ConfigError(f"views.backend=device implements views.style=dino only, not {v.style}: set "
                          f"views.backend=cpu, or views.style=dino")
    return [_spec(view.transform.transforms) for view in view_transform(v).transforms]


def draw_photometric(s: ViewSpec) -> list[float]:
    """One view's photometric parameters (a row of `PARAMS`), drawn from torch's global generator."""
    u = torch.rand(9, dtype=torch.float64).tolist()
    order = torch.randperm(4).tolist()

    def between(lo_hi: tuple[float, float], x: float) -> float:
        return lo_hi[0] + (lo_hi[1] - lo_hi[0]) * x

    return [float(u[0] < s.jitter), *order, between(s.brightness, u[1]), between(s.contrast, u[2]),
            between(s.saturation, u[3]), between(s.hue, u[4]), float(u[5] < s.gray), float(u[6] < s.blur),
            between(s.sigmas, u[7]), float(u[8] < s.solarize)]


class CropFlipViews:
    """The workers' part: the views of one image as uint8 (3, s, s) crops (bicubic random resized crop, then flip) and
    their photometric parameters (V, len(PARAMS)), drawn from torch's global generator (`SeededViews` seeds it)."""

    def __init__(self, specs: Sequence[ViewSpec]) -> None:
        self.specs = list(specs)

    def __call__(self, img: Image.Image | torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        x = img if isinstance(img, torch.Tensor) else TF.pil_to_tensor(img if img.mode == "RGB" else img.convert("RGB"))
        views, rows = [], []
        for s in self.specs:
            i, j, h, w = T.RandomResizedCrop.get_params(x, list(s.scale), list(s.ratio))
            crop = TF.resize(x[:, i : i + h, j : j + w], list(s.size), T.InterpolationMode.BICUBIC, antialias=True)
            if torch.rand(1) < s.hflip:
                crop = crop.flip(-1)
            views.append(crop.contiguous())
            rows.append(draw_photometric(s))
        return views, torch.tensor(rows, dtype=torch.float32)


class ViewBatch(NamedTuple):
    """A loader batch of the device path: the uint8 crops of every view and their parameters."""

    views: list[torch.Tensor]  # per view (B, 3, s, s) uint8
    params: torch.Tensor  # (B, V, len(PARAMS)) float32

    def to(self, device: torch.device, non_blocking: bool = False) -> ViewBatch:
        """The crops on `device`; the parameters stay on the host, where `DeviceViews` chooses rows from them."""
        return ViewBatch([v.to(device, non_blocking=non_blocking) for v in self.views], self.params)


def collate_crops(batch: list[Any]) -> tuple[ViewBatch | list, torch.Tensor, int]:
    """`collate_views` for `CropFlipViews` items: a `ViewBatch`; unreadable images dropped and counted."""
    stacked, labels, n_bad = collate_views([None if b is None else ([*b[0][0], b[0][1]], b[1]) for b in batch])
    return (ViewBatch(stacked[:-1], stacked[-1]) if stacked else []), labels, n_bad


def _brightness(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kornia.enhance.adjust_brightness_accumulative(y, q[:, COL["brightness"]])


def _contrast(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kornia.enhance.adjust_contrast_with_mean_subtraction(y, q[:, COL["contrast"]])


def _saturation(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kornia.enhance.adjust_saturation_with_gray_subtraction(y, q[:, COL["saturation"]])


def _hue(y: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return kornia.enhance.adjust_hue(y, q[:, COL["hue"]] * (2 * math.pi))  # kornia's hue is an angle


# torchvision's ColorJitter: brightness, contrast, saturation, hue (PIL's definitions, each clamped to [0, 1])
JITTER = (_brightness, _contrast, _saturation, _hue)
BLUR_PASSES = 3  # Pillow's GaussianBlur: three extended box blurs


def box_radius(sigma: torch.Tensor, passes: int = BLUR_PASSES) -> torch.Tensor:
    """The fractional box radius of one of the `passes` "extended box" blurs of Pillow's GaussianBlur(radius=sigma)
    (Gwosdek et al. 2011, as Pillow's BoxBlur.c computes it)."""
    s2 = sigma.double() ** 2 / passes
    whole = torch.floor((torch.sqrt(12 * s2 + 1) - 1) / 2)
    return whole + (2 * whole + 1) * (whole * (whole + 1) - 3 * s2) / (6 * (s2 - (whole + 1) ** 2))


def box_kernels(sigma: torch.Tensor, half: int) -> torch.Tensor:
    """(B, 2 half + 1) 1-D kernels of one box pass: weight 1 / (2 R + 1) within the integer radius, the rest shared by
    the two pixels just outside it."""
    radius = box_radius(sigma)[:, None]
    inner = torch.floor(radius)
    w_in = 1 / (2 * radius + 1)
    w_edge = (1 - (2 * inner + 1) * w_in) / 2
    o = torch.arange(-half, half + 1, dtype=torch.float64, device=sigma.device).abs()
    return torch.where(o <= inner, w_in, torch.where(o == inner + 1, w_edge, 0.0)).float()


def box_half(sigma_max: float) -> int:
    """The half-width of `box_kernels` that holds the kernel of every sigma up to `sigma_max`."""
    return int(box_radius(torch.tensor([sigma_max]))) + 1


def pil_blur(x: torch.Tensor, sigma: torch.Tensor, half: int) -> torch.Tensor:
    """Pillow's GaussianBlur per sample on (B, C, H, W), edges replicated at every pass as Pillow does."""
    k = box_kernels(sigma, half)
    for _ in range(BLUR_PASSES):
        x = kornia.filters.filter2d_separable(x, k, k, border_type="replicate")
    return x


class DeviceViews:
    """The device part: uint8 crops (a `ViewBatch`) in, normalised float32 views out, each sample with its own
    photometric parameters; views of one size are processed as one batch."""

    def __init__(self, specs: Sequence[ViewSpec], device: torch.device) -> None:
        if len({(s.mean, s.std, s.threshold) for s in specs}) != 1:
            raise ConfigError("views.backend=device needs one normalisation and solarize threshold for all views")
        self.specs, self.device = list(specs), device
        self.mean = torch.tensor(specs[0].mean, device=device)
        self.std = torch.tensor(specs[0].std, device=device)
        # the 8-bit pipeline inverts the values that round to >= threshold
        self.threshold = (specs[0].threshold - 0.5) / 255
        self.half = box_half(max(s.sigmas[1] for s in specs))  # fixed: a sample's blur never depends on its batch

    def _put(self, t: torch.Tensor) -> torch.Tensor:
        """A host tensor on the device, without waiting for the device (pinned, asynchronous)."""
        return t.pin_memory().to(self.device, non_blocking=True) if self.device.type == "cuda" else t.to(self.device)

    def _apply(self, x: torch.Tensor, p: torch.Tensor, mask: torch.Tensor,
               fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        """`fn(rows, their parameters)` on the rows of `x` (in place) where the host mask (B,) is set."""
        rows = mask.nonzero().flatten()
        if len(rows):
            idx = self._put(rows)
            x.index_copy_(0, idx, fn(x.index_select(0, idx), p.index_select(0, idx)).contiguous())

    def photometric(self, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Jitter, grayscale, blur, solarize, normalise (B, 3, H, W) uint8 images; `p` (B, len(PARAMS)) on the host."""
        x = x.to(self.device, non_blocking=True).float().div_(255)
        pd = self._put(p)
        on = p[:, COL["jitter"]] > 0
        for k in range(4):  # position k of the jitter: each sample's own op there
            for j, op in enumerate(JITTER):
                self._apply(x, pd, on & (p[:, COL[f"order{k}"]] == j), op)
        self._apply(x, pd, p[:, COL["gray"]] > 0, lambda y, _: kornia.color.rgb_to_grayscale(y).expand_as(y))
        self._apply(x, pd, p[:, COL["blur"]] > 0, lambda y, q: pil_blur(y, q[:, COL["sigma"]], self.half))
        self._apply(x, pd, p[:, COL["solarize"]] > 0, lambda y, _: kornia.enhance.solarize(y, self.threshold))
        return kornia.enhance.normalize(x, self.mean, self.std)

    def __call__(self, batch: ViewBatch) -> list[torch.Tensor]:
        views, params = batch.views, batch.params.cpu()  # the parameters stay on the host (`ViewBatch.to`)
        out: list[torch.Tensor | None] = [None] * len(views)
        for size in dict.fromkeys(v.shape[-2:] for v in views):
            idx = [i for i, v in enumerate(views) if v.shape[-2:] == size]
            y = self.photometric(torch.cat([views[i] for i in idx]),
                                 torch.cat([params[:, i] for i in idx]))
            for i, part in zip(idx, y.split(views[idx[0]].shape[0]), strict=True):
                out[i] = part
        return out  # type: ignore[return-value]
