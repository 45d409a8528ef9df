"""`python -m vitsinks.bench data`: its photo-like JPEGs and its side-by-side report (no speed is asserted)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitsinks.benchmarks.data import jpeg_folder, natural_image, run


def test_natural_images_are_seeded_textured_imagenet_size_jpegs(tmp_path: Path) -> None:
    a, b = np.asarray(natural_image(0)).astype(float), np.asarray(natural_image(1)).astype(float)
    assert a.shape == (375, 500, 3) and np.array_equal(a, np.asarray(natural_image(0)))
    assert not np.array_equal(a, b)
    assert a.std() > 20 and np.abs(np.diff(a, axis=1)).mean() > 1  # structure at coarse and fine scales
    (path,) = (jpeg_folder(tmp_path, 1) / "train" / "n00000000").iterdir()
    with Image.open(path) as img:
        assert img.format == "JPEG" and img.size == (500, 375)


@pytest.mark.slow
def test_report_puts_both_pipelines_side_by_side_with_their_ratio() -> None:
    out = run(batch=2, repeats=1)
    ms = [float(m) for m in re.findall(r"\| views\.backend=\w+[^|]*\| ([\d.]+) \|", out)]
    assert len(ms) == 3 and all(m > 0 for m in ms)
    ratio = float(re.search(r"device path's CPU part: ([\d.]+)x", out).group(1))
    assert ratio == pytest.approx(ms[0] / ms[1], rel=0.05)  # one round: the ratio of its two times
