"""The pretrained benchmark on a small image: one row per size, its per-image times and ratio consistent, and the
CLI names it."""

from __future__ import annotations

import pytest

from vitsinks.bench import BENCHMARKS
from vitsinks.benchmarks.pretrained import TIMM_MODELS, measure, run


def test_measure_one_round_ratio_is_the_time_ratio() -> None:
    m = measure("vit_small", batch=2, repeats=1, img_size=28)
    for what in ("diagnose", "intervene"):
        assert m["forward_s"] > 0 and m[f"{what}_s"] > 0
        ratio = m[f"{what}_ratio"]
        assert ratio == pytest.approx(m[f"{what}_s"] / m["forward_s"]) == m[f"{what}_lo"] == m[f"{what}_hi"]


def test_run_prints_one_row_per_size(capsys: pytest.CaptureFixture[str]) -> None:
    out = run("vit_small", batch=2, repeats=1, img_size=28)
    assert out in capsys.readouterr().out and out.count(TIMM_MODELS["vit_small"]) == 1
    assert BENCHMARKS["pretrained"] == "vit_small,vit_large"
