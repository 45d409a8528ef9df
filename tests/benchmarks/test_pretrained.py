"""The pretrained benchmark on a small image: one row per size, its per-image times and ratio consistent, and the
CLI names it and prints its table."""

from __future__ import annotations

import pytest

from vitsinks.bench import BENCHMARKS, bench_command
from vitsinks.benchmarks import pretrained
from vitsinks.benchmarks.pretrained import TIMM_MODELS, measure, run


def test_measure_one_round_ratio_is_the_time_ratio() -> None:
    m = measure("vit_small", batch=2, repeats=1, img_size=28)
    for what in ("diagnose", "intervene"):
        assert m["forward_s"] > 0 and m[f"{what}_s"] > 0
        ratio = m[f"{what}_ratio"]
        assert ratio == pytest.approx(m[f"{what}_s"] / m["forward_s"]) == m[f"{what}_lo"] == m[f"{what}_hi"]


def test_run_returns_one_row_per_size() -> None:
    out = run("vit_small", batch=2, repeats=1, img_size=28)
    assert out.count(TIMM_MODELS["vit_small"]) == 1
    assert BENCHMARKS["pretrained"] == "vit_small,vit_large"


def test_the_command_prints_the_table_the_benchmark_returns(monkeypatch, capsys) -> None:
    monkeypatch.setattr(pretrained, "run", lambda size, **kw: f"table of {size} {kw}")
    assert bench_command(["pretrained", "size=vit_small", "repeats=3"]) == 0
    assert capsys.readouterr().out == "table of vit_small {'repeats': 3}\n"
