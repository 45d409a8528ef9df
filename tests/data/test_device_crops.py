"""The device path of the views against the CPU pipeline: settings read from it, parameter draws at the configured
probabilities and ranges, every photometric op against Pillow / torchvision on the same parameters, per-sample
views independent of the batch, and (slow) the two pipelines' view statistics over many seeded samples."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import torchvision.transforms.v2.functional as F
from PIL import Image, ImageFilter, ImageOps

from vitsinks.benchmarks.data import natural_image
from vitsinks.configs.schema import ViewsConfig
from vitsinks.data.crops import SeededViews, collate_views, view_transform
from vitsinks.data.device_crops import (
    COL,
    JITTER,
    PARAMS,
    CropFlipViews,
    DeviceViews,
    collate_crops,
    draw_photometric,
    pil_blur,
    view_specs,
)
from vitsinks.data.loading import EpochKeyed

CPU = torch.device("cpu")
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


class Images(torch.utils.data.Dataset):
    """`(PIL image, index)` items of a list of images."""

    def __init__(self, images: list[Image.Image]) -> None:
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Image.Image, int]:
        return self.images[i], i


def as_float(img: Image.Image) -> torch.Tensor:
    return F.pil_to_tensor(img).float() / 255


def denorm(x: torch.Tensor) -> torch.Tensor:
    """Normalised views back to [0, 1] pixels."""
    mean, std = (torch.tensor(m).view(1, 3, 1, 1) for m in IMAGENET)
    return x * std + mean


def neutral(n: int) -> torch.Tensor:
    """Parameter rows that change nothing: no jitter, grey, blur or solarize; identity factors."""
    p = torch.zeros(n, len(PARAMS))
    p[:, [COL["brightness"], COL["contrast"], COL["saturation"], COL["sigma"]]] = 1.0
    p[:, [COL[f"order{k}"] for k in range(4)]] = torch.arange(4.0)
    return p


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread: on a loaded machine small convolutions on two contended threads spin for long."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def binomial_ok(hits: float, n: int, p: float) -> bool:
    """The observed fraction within 4 standard errors of p (exact when p is 0 or 1)."""
    return abs(hits / n - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12


def test_settings_are_the_cpu_pipelines_with_dinos_asymmetry() -> None:
    v = ViewsConfig(n_global=3, global_size=48, global_scale=[0.2, 1.0], n_local=2, local_size=24,
                    local_scale=[0.05, 0.2], color_jitter=0.6, grayscale=0.15, blur=0.3, solarize=0.25, hflip=0.4)
    specs = view_specs(v)
    assert [s.size for s in specs] == [(48, 48)] * 3 + [(24, 24)] * 2
    assert [s.scale for s in specs] == [(0.2, 1.0)] * 3 + [(0.05, 0.2)] * 2
    # DINO: the first global view always blurred, the other global views sometimes solarized, local views never
    assert [s.blur for s in specs] == [1.0, 0.3, 0.3, 0.3, 0.3]
    assert [s.solarize for s in specs] == [0.0, 0.25, 0.25, 0.0, 0.0]
    for s in specs:
        assert (s.jitter, s.gray, s.hflip, s.threshold) == (0.6, 0.15, 0.4, 128)
        # lightly's DINO strengths: 0.5 x (brightness 0.8, contrast 0.8, saturation 0.4, hue 0.2)
        assert s.brightness == pytest.approx((0.6, 1.4)) and s.contrast == pytest.approx((0.6, 1.4))
        assert s.saturation == pytest.approx((0.8, 1.2)) and s.hue == pytest.approx((-0.1, 0.1))
        assert s.sigmas == (0.1, 2.0) and s.ratio == pytest.approx((3 / 4, 4 / 3))
        assert s.mean == pytest.approx(IMAGENET[0]) and s.std == pytest.approx(IMAGENET[1])


def test_parameters_are_drawn_at_the_configured_probabilities_and_ranges() -> None:
    spec = dataclasses.replace(view_specs(ViewsConfig())[1], jitter=0.7, gray=0.3, blur=0.45, solarize=0.15)
    torch.manual_seed(0)
    n = 4000
    p = torch.tensor([draw_photometric(spec) for _ in range(n)])
    for flag, prob in (("jitter", 0.7), ("gray", 0.3), ("blur", 0.45), ("solarize", 0.15)):
        assert set(p[:, COL[flag]].tolist()) == {0.0, 1.0}
        assert binomial_ok(p[:, COL[flag]].sum().item(), n, prob), flag
    for name, (lo, hi) in (("brightness", spec.brightness), ("contrast", spec.contrast),
                           ("saturation", spec.saturation), ("hue", spec.hue), ("sigma", spec.sigmas)):
        col = p[:, COL[name]].double()
        assert lo <= col.min() and col.max() <= hi and col.max() - col.min() > 0.95 * (hi - lo), name
        assert abs(col.mean() - (lo + hi) / 2) < 4 * (hi - lo) / math.sqrt(12 * n), name  # uniform's mean
    orders = [tuple(int(o) for o in row) for row in p[:, [COL[f"order{k}"] for k in range(4)]]]
    counts = {perm: orders.count(perm) for perm in itertools.permutations(range(4))}
    assert sum(counts.values()) == n  # every row is a permutation of the four ops
    assert all(binomial_ok(c, n, 1 / 24) for c in counts.values())


def test_crops_cover_the_configured_scales_and_ratios_and_flip_at_the_configured_rate() -> None:
    # an image that encodes its coordinates: red = x, green = y, blue = 128 (the crop box is read off the pixels)
    W, H = 240, 160
    ramp = np.zeros((H, W, 3), np.uint8)
    ramp[..., 0], ramp[..., 1], ramp[..., 2] = np.arange(W)[None], np.arange(H)[:, None], 128
    spec = dataclasses.replace(view_specs(ViewsConfig())[0], size=(40, 40), scale=(0.1, 0.9), hflip=0.3)
    n = 300
    ds = SeededViews(Images([Image.fromarray(ramp)] * n), CropFlipViews([spec]), seed=1)
    crops = torch.stack([ds[i][0][0][0] for i in range(n)]).float()  # (n, 3, 40, 40) uint8 values
    assert (crops[:, 2] == 128).all()  # no photometric op on the CPU
    x, y = crops[:, 0], crops[:, 1]
    flipped = x[:, :, -1].mean(1) < x[:, :, 0].mean(1)
    assert binomial_ok(flipped.sum().item(), n, 0.3)
    assert (y[:, -1].mean(1) > y[:, 0].mean(1)).all()  # never flipped vertically
    # the output pixel centres span (size - 1) / size of the box, each coordinate read to the pixel
    w = (x.amax((1, 2)) - x.amin((1, 2))) * 40 / 39 + 1
    h = (y.amax((1, 2)) - y.amin((1, 2))) * 40 / 39 + 1
    area, ratio = w * h / (W * H), w / h
    assert area.min() > 0.1 * 0.9 and area.max() < 0.9 * 1.05 and area.min() < 0.15 and area.max() > 0.8
    assert ratio.min() > 0.75 * 0.93 and ratio.max() < 4 / 3 * 1.07


@pytest.mark.parametrize(("op", "factor"), [("brightness", 0.6), ("brightness", 1.4), ("contrast", 0.6),
                                             ("contrast", 1.4), ("saturation", 0.8), ("saturation", 1.2),
                                             ("hue", -0.1), ("hue", 0.07)])
def test_each_jitter_op_matches_torchvision_on_pil_images(op: str, factor: float) -> None:
    imgs = [natural_image(i, 48, 40) for i in range(4)]
    x = torch.stack([as_float(im) for im in imgs])
    ref = torch.stack([as_float(getattr(F, f"adjust_{op}")(im, factor)) for im in imgs])
    p = neutral(4)
    p[:, COL[op]] = factor
    out = JITTER[("brightness", "contrast", "saturation", "hue").index(op)](x, p)
    err, effect = ((out - ref).abs().mean() * 255).item(), ((ref - x).abs().mean() * 255).item()
    # within Pillow's 8-bit rounding (its hue works in 8-bit HSV, its shift truncated to 1/255 turn) of a change
    assert err < (1.5 if op == "hue" else 0.6) and effect > 4 * err, (err, effect)


@pytest.mark.parametrize("sigma", [0.1, 0.3, 0.6, 1.0, 2.0])
def test_blur_matches_pillows_gaussian_blur_also_at_small_sigma(sigma: float) -> None:
    # white noise: every blur changes it by far more than Pillow's per-pass 8-bit rounding
    rng = np.random.default_rng(0)
    imgs = [Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)) for _ in range(4)]
    x = torch.stack([as_float(im) for im in imgs])
    ref = torch.stack([as_float(im.filter(ImageFilter.GaussianBlur(radius=sigma))) for im in imgs])
    out = pil_blur(x, torch.full((4,), sigma), half=3)
    err, effect = ((out - ref).abs().mean() * 255).item(), ((ref - x).abs().mean() * 255).item()
    assert err < 1.2, (err, effect)
    if sigma >= 0.3:
        assert effect > 8 * err, (err, effect)
    if sigma == 0.3:  # a sampled Gaussian kernel (what gaussian_blur2d computes) blurs far less than Pillow here
        import kornia

        sampled = kornia.filters.gaussian_blur2d(x, 7, (sigma, sigma), border_type="replicate")
        assert ((sampled - ref).abs().mean() * 255).item() > 4 * err


def float_reference(x: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
    """The CPU pipeline's photometric ops with one row's parameters on a float (3, H, W) image in [0, 1], free of
    Pillow's 8-bit rounding: torchvision's tensor kernels (written to PIL's definitions), the blur that
    `test_blur_matches_pillows_gaussian_blur_also_at_small_sigma` checks against Pillow."""
    if row[COL["jitter"]]:
        for k in range(4):
            op = ("brightness", "contrast", "saturation", "hue")[int(row[COL[f"order{k}"]])]
            x = getattr(F, f"adjust_{op}")(x, float(row[COL[op]]))
    if row[COL["gray"]]:
        x = F.rgb_to_grayscale(x, num_output_channels=3)
    if row[COL["blur"]]:
        x = pil_blur(x[None], row[COL["sigma"], None], half=3)[0]
    if row[COL["solarize"]]:
        x = F.solarize(x, 127.5 / 255)  # the 8-bit values >= 128
    return x


def test_device_views_compose_the_ops_as_the_cpu_pipeline_does(one_thread: None) -> None:
    spec = dataclasses.replace(view_specs(ViewsConfig())[1], jitter=0.7, gray=0.3, blur=0.6, solarize=0.4)
    torch.manual_seed(0)
    n = 40
    p = torch.tensor([draw_photometric(spec) for _ in range(n)])
    assert p[:, COL["jitter"]].sum() > 10 and all(p[:, COL[f]].sum() > 3 for f in ("gray", "blur", "solarize"))
    x = torch.stack([F.pil_to_tensor(natural_image(i, 40, 40)) for i in range(n)])
    out = denorm(DeviceViews([spec], CPU).photometric(x, p))
    ref = torch.stack([float_reference(xi.float() / 255, row) for xi, row in zip(x, p, strict=True)])
    err = (out - ref).abs().mean((1, 2, 3)) * 255
    assert err.max() < 0.1, err  # every sample, whatever its ops and their order; a level is 1


def test_the_jitter_order_is_each_samples_own() -> None:
    img = natural_image(3, 40, 40)
    p = neutral(2)
    p[:, COL["jitter"]], p[:, COL["brightness"]], p[:, COL["contrast"]] = 1, 1.4, 0.6
    p[1, [COL[f"order{k}"] for k in range(4)]] = torch.tensor([1.0, 0, 2, 3])  # contrast before brightness
    x = F.pil_to_tensor(img).expand(2, -1, -1, -1)
    out = denorm(DeviceViews(view_specs(ViewsConfig())[:1], CPU).photometric(x, p))
    ref = torch.stack([float_reference(as_float(img), row) for row in p])
    gap = (ref[0] - ref[1]).abs().mean() * 255  # clamping makes the order matter
    assert gap > 3 and ((out - ref).abs().mean((1, 2, 3)) * 255 < 0.1).all()


def test_solarize_inverts_the_values_pillow_inverts() -> None:
    img = natural_image(5, 40, 40)
    p = neutral(1)
    p[:, COL["solarize"]] = 1
    out = denorm(DeviceViews(view_specs(ViewsConfig())[:1], CPU).photometric(F.pil_to_tensor(img)[None], p))
    torch.testing.assert_close(out[0], as_float(ImageOps.solarize(img, 128)), atol=1e-5, rtol=0)


def test_a_samples_view_is_the_same_in_any_batch_and_a_function_of_seed_epoch_index() -> None:
    specs = view_specs(ViewsConfig(global_size=32, local_size=16))
    ds = EpochKeyed(SeededViews(Images([natural_image(i, 48, 40) for i in range(8)]), CropFlipViews(specs), seed=3))
    dv = DeviceViews(specs, CPU)
    a = dv(collate_crops([ds[(1, i)] for i in (0, 5, 2, 6)])[0])
    b = dv(collate_crops([ds[(1, i)] for i in (7, 2)])[0])
    for va, vb in zip(a, b, strict=True):
        torch.testing.assert_close(va[2], vb[1], atol=1e-5, rtol=0)
    (crops, params), _ = ds[(1, 2)]
    (_, params0), _ = ds[(0, 2)]
    again, _ = ds[(1, 2)]
    assert torch.equal(params, again[1]) and all(torch.equal(c, d) for c, d in zip(crops, again[0], strict=True))
    assert not torch.equal(params, params0)  # another epoch, other views


# ---- the two pipelines over many seeded samples ---------------------------------------------------------------

def view_stats(views: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """Per view and image, in [0, 1] pixels: brightness, contrast (std of grey), colourfulness (channel spread),
    sharpness (mean |horizontal step|), and whether the view is grey."""
    out = {}
    for v, x in enumerate(views):
        x = denorm(x)
        grey = x.mean(1)
        spread = x.amax(1) - x.amin(1)
        sharpness = (x[..., 1:] - x[..., :-1]).abs().mean((1, 2, 3))
        out.update({f"brightness{v}": x.mean((1, 2, 3)), f"contrast{v}": grey.std((1, 2)),
                    f"colour{v}": spread.mean((1, 2)), f"sharpness{v}": sharpness,
                    f"grey{v}": (spread.amax((1, 2)) < 1e-3).float()})
    return {k: t.numpy() for k, t in out.items()}


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov distance."""
    grid = np.sort(np.concatenate([a, b]))
    return float(np.abs(np.searchsorted(np.sort(a), grid, "right") / len(a)
                        - np.searchsorted(np.sort(b), grid, "right") / len(b)).max())


def mismatches(cpu: dict[str, np.ndarray], dev: dict[str, np.ndarray], n: int, v: ViewsConfig) -> list[str]:
    """The statistics on which the two pipelines differ: a KS distance beyond its 1e-4 critical value, or a grey
    fraction off the configured probability (binomial)."""
    crit = 2.146 * math.sqrt(2 / n)  # c(alpha = 1e-4)
    bad = [f"{k}: KS {ks(cpu[k], dev[k]):.3f} > {crit:.3f}" for k in cpu if not k.startswith("grey")
           and ks(cpu[k], dev[k]) > crit]
    bad += [f"{name} {k}: {s[k].mean():.3f} vs {v.grayscale}" for name, s in (("cpu", cpu), ("device", dev))
            for k in s if k.startswith("grey") and not binomial_ok(s[k].sum(), n, v.grayscale)]
    return bad


@pytest.mark.slow
def test_device_views_have_the_cpu_pipelines_statistics_and_a_broken_stage_does_not(one_thread: None) -> None:
    v = ViewsConfig(n_global=2, global_size=32, n_local=1, local_size=16)
    n = 600
    base = Images([natural_image(i, 64, 48) for i in range(n)])
    cpu_views, _, _ = collate_views([SeededViews(base, view_transform(v), seed=0)[i] for i in range(n)])
    cpu = view_stats(cpu_views)

    def device_stats(specs: list) -> dict[str, np.ndarray]:
        ds = SeededViews(base, CropFlipViews(specs), seed=1)
        return view_stats(DeviceViews(specs, CPU)(collate_crops([ds[i] for i in range(n)])[0]))

    specs = view_specs(v)
    assert mismatches(cpu, device_stats(specs), n, v) == []
    # a stage switched off, or solarize on every view at 0.5, must show
    for broken in ({"jitter": 0.0}, {"blur": 0.0}, {"gray": 0.0}, {"solarize": 0.5}):
        assert mismatches(cpu, device_stats([dataclasses.replace(s, **broken) for s in specs]), n, v), broken
