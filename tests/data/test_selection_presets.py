"""Every selection preset's preprocessing against its own reference script, written out here from the reference's
definition (KempnerInstitute/attention_sink, commit a83cd59), never imported from vitsinks:

- `selection=kempner_sinktable`: `lejepa_sinks/diagnose.py` `build_loader`: `Resize(256)` (torchvision's default
  interpolation: bilinear), `CenterCrop(224)`, `ToTensor`, ImageNet `Normalize`, on `Image.open(f).convert("RGB")`;
- `selection=kempner_causal`: `vit_causal/common.py` `val_transform`: `Resize(int(round(224 * 256 / 224)),
  BICUBIC)`, `CenterCrop(224)`, `ToTensor`, ImageNet `Normalize`;
- no preset: vitsinks' own rule (docs/sinks.md): the shorter side to round(224 / 0.875) = 256, bicubic, the same
  crop and normalisation.

The presets are read from `vitsinks/configs/selection/*.yaml`: a preset added without its reference's preprocessing
written out here fails."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from matplotlib import cbook
from PIL import Image, ImageDraw, ImageFilter

import vitsinks.configs
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics import images_of, selection_transform

PRESETS = sorted(p.stem for p in (Path(vitsinks.configs.__file__).parent / "selection").glob("*.yaml"))
SIZE = 224  # the reference's input size (both scripts)
MEAN, STD = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
# preset (None: no preset) -> (the shorter side the reference resizes to, the PIL filter torchvision hands to PIL)
REFERENCE = {
    "kempner_sinktable": (256, Image.Resampling.BILINEAR),  # Resize(256): InterpolationMode.BILINEAR by default
    "kempner_causal": (int(round(224 * 256 / 224)), Image.Resampling.BICUBIC),
    None: (round(224 / 0.875), Image.Resampling.BICUBIC),
}


def scene(height: int, width: int, seed: int = 0) -> Image.Image:
    """A photo-like landscape: a sky-to-ground gradient, textured regions, hard-edged objects with thin lines, sensor
    noise, then a JPEG round trip (8x8 block artefacts, chroma subsampling), as ADE20K / ImageNet JPEGs have."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    sky = np.stack([0.35 + 0.4 * y, 0.55 + 0.3 * y, 0.9 - 0.3 * y], -1)
    grass = np.stack([0.2 + 0.1 * np.sin(40 * x), 0.45 + 0.15 * np.sin(23 * x + 31 * y), 0.15 + 0 * x], -1)
    horizon = 0.55 + 0.05 * np.sin(9 * x)
    base = np.where((y > horizon)[..., None], grass, sky)
    img = Image.fromarray((np.clip(base, 0, 1) * 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(14):  # buildings, signs, poles: edges at every angle and scale
        x0, y0 = int(rng.integers(0, width - 20)), int(rng.integers(0, height - 20))
        x1, y1 = x0 + int(rng.integers(8, width // 3)), y0 + int(rng.integers(8, height // 3))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)((x0, y0, x1, y1), fill=color)
        draw.line((x0, y1, x1, y0), fill=tuple(255 - c for c in color), width=int(rng.integers(1, 4)))
    img = img.filter(ImageFilter.GaussianBlur(0.6))  # optics
    arr = np.asarray(img, dtype=np.float64) + rng.normal(0, 4, (height, width, 3))  # sensor noise
    buf = io.BytesIO()
    Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=85)
    return Image.open(io.BytesIO(buf.getvalue()))


def reference_view(img: Image.Image, short: int, resample: Image.Resampling, crop: int = SIZE) -> np.ndarray:
    """What the reference's transform makes of `img`, (crop, crop, 3) float64: torchvision's `Resize(short)` on a
    PIL image (shorter side to `short`, longer side `int(short * long / short_side)`, resized by PIL with
    `resample`), `CenterCrop(crop)` (top / left `int(round((side - crop) / 2))`), `ToTensor` (/ 255), `Normalize`."""
    img = img.convert("RGB")
    w, h = img.size
    new_w, new_h = (short, int(short * h / w)) if w <= h else (int(short * w / h), short)
    small = img.resize((new_w, new_h), resample)
    top, left = int(round((new_h - crop) / 2.0)), int(round((new_w - crop) / 2.0))
    arr = np.asarray(small, dtype=np.float64)[top : top + crop, left : left + crop] / 255.0
    return (arr - MEAN) / STD


def test_every_preset_has_its_reference_written_out() -> None:
    assert {"kempner_sinktable", "kempner_causal"} <= set(PRESETS)
    assert set(PRESETS) <= set(REFERENCE), f"write out the reference preprocessing of {set(PRESETS) - set(REFERENCE)}"


IMAGES = {
    "photo": lambda: Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)),  # a JPEG photo, 512 x 600
    "scene": lambda: scene(375, 500),  # landscape, ADE20K's most common size
}


@pytest.mark.parametrize("image", list(IMAGES))
@pytest.mark.parametrize("preset", [*PRESETS, None], ids=[*PRESETS, "default"])
def test_a_presets_preprocessing_is_its_reference_scripts(preset: str | None, image: str) -> None:
    """Bicubic in place of the sink table's bilinear moves the photo's inputs by up to 0.63 (normalised units)."""
    selection = load_config([f"selection={preset}"] if preset else []).selection
    img = IMAGES[image]()
    want = reference_view(img, *REFERENCE[preset])
    got = selection_transform(SIZE, selection)(img.convert("RGB"))
    assert got.dtype.is_floating_point and tuple(got.shape) == (3, SIZE, SIZE)
    assert np.abs(got.permute(1, 2, 0).double().numpy() - want).max() < 1e-6
    batch, shown = images_of([(img, 0)], SIZE, selection)  # the path diagnose / intervene take
    assert np.abs(batch[0].permute(1, 2, 0).double().numpy() - want).max() < 1e-6
    assert shown.shape == (1, SIZE, SIZE, 3)
