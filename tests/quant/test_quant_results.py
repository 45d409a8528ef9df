"""`results/quant.json` as a typed result: its JSON, its leaderboard values and a run without it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from vitsinks.quant.quant_results import QuantResult, change
from vitsinks.utils.results import result_types
from vitsinks.utils.rundir import RunDir


def _result() -> QuantResult:
    return QuantResult(checkpoint="runs/a/checkpoints/last.pt", weight_bits=8, act_bits=8, calib_images=32,
                       n_images=64, by_block={"kurtosis": {"qkv": [3.5, 40.0], "fc1": [7.0, None]},
                                              "inf_norm": {"qkv": [2.0, 9.0], "fc1": [120.0, None]}},
                       feature_cosine=0.98, feature_cosine_by_block=[0.999, 0.98],
                       online_top1=change(50.0, 47.5), linear_top1=None,
                       dense={"dense_voc": change(40.0, 39.0), "dense_ade20k": change(20.0, 18.0)})


def test_the_json_round_trips_with_the_agreed_keys(tmp_path: Path) -> None:
    res = _result()
    obj = json.loads(json.dumps(res.to_json()))
    assert list(obj) == ["checkpoint", "weight_bits", "act_bits", "calib_images", "n_images", "by_block",
                         "feature_cosine", "feature_cosine_by_block", "online_top1", "linear_top1", "dense"]
    assert QuantResult.from_json(obj) == res
    assert obj["online_top1"] == {"fp32": 50.0, "quant": 47.5, "delta": -2.5}


def test_the_leaderboard_reads_the_columns_from_the_file(tmp_path: Path) -> None:
    assert QuantResult in result_types()
    run = RunDir(tmp_path / "run")
    assert all(math.isnan(v) for v in QuantResult.collect(run).values())  # no result: every column NaN
    assert set(QuantResult.collect(run)) == {c.key for c in QuantResult.columns()}
    run.results.mkdir(parents=True)
    run.result("quant").write_text(json.dumps(_result().to_json()))
    got = QuantResult.collect(run)
    assert got["w8a8_cos_err"] == pytest.approx(0.02) and got["w8a8_d_online"] == -2.5
    assert math.isnan(got["w8a8_d_linear"])
    assert got["w8a8_d_dense_ade20k"] == pytest.approx(-2.0) and got["w8a8_d_dense_voc"] == pytest.approx(-1.0)
    assert got["kurtosis_max"] == 40.0 and got["inf_norm_max"] == 120.0  # over blocks and layers, None skipped
