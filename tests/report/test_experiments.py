"""A leaderboard row is one experiment (issue 38): runs are averaged into one row only when everything but the seed
matches; runs that differ in a model, data, objective or schedule setting, the steps they trained, the batch, an
edit's setting or checkpoint, the quantization format or the sink rule are separate rows named by what differs. And
every quantization column names its format: a W4A4 result never sits in a W8A8 column."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.helpers.figures import overlapping_labels
from tests.helpers.leaderboard import DEFAULT_RULE, cells, plant, quant
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.rules import SinkRules
from vitsinks.diagnostics.summary import rule_record
from vitsinks.quant.quant_results import QuantResult, change
from vitsinks.report import aggregate, build, collect, columns, run_dirs
from vitsinks.report.experiment import bookkeeping, config_keys
from vitsinks.utils.errors import BadValue

DEF1_RULE = rule_record(SinkRules(rule="def1", eps=0.1), 12)


def rows_of(root: Path) -> dict[str, dict]:
    """The aggregated rows of every run under `root`, by name."""
    return {t["variant"]: t for t in aggregate([collect(r) for r in run_dirs(root)])}


# each case: two runs of seeds 0 and 1 that differ in one thing (keyword arguments of `plant` each), and a key the
# row names must show
DIFFER = {
    "model setting": ({"overrides": ["model.mlp_ratio=2.0"]}, {}, "model.mlp_ratio"),
    "data setting": ({"overrides": ["data.train_size=512"]}, {}, "data.train_size"),
    "objective setting": ({"overrides": ["objective.lamb=0.1"]}, {}, "objective.lamb"),
    "schedule": ({"overrides": ["train.lr=0.001", "train.warmup_epochs=0"]}, {}, "train.lr"),
    "steps trained": ({"steps": 12}, {"steps": 30}, "steps trained=12"),
    "batch": ({"overrides": ["train.batch_size=8"]}, {}, "train.batch_size=8"),
    "quant format": ({"quant_json": quant(4, 4)}, {"quant_json": quant(8, 8)}, "quant=W4A4"),
    "diagnostics rule": ({"rule": DEF1_RULE}, {}, "sink rule=def1 eps 0.1"),
}


@pytest.mark.parametrize("case", list(DIFFER))
def test_runs_that_differ_in_anything_but_the_seed_are_not_one_row(tmp_path: Path, case: str) -> None:
    """Two runs (seeds 0 and 1) of one variant that differ in one setting are two rows of one run each, each named
    by what differs; a third run, seed 1 of the first one's experiment, joins it: n = 2."""
    first, second, shows = DIFFER[case]
    for name, seed, spec in (("a-s0", 0, first), ("b-s1", 1, second), ("a-s1", 1, first)):  # a-s1: a true seed
        plant(tmp_path, name, *spec.get("overrides", []), seed=seed,
              **{k: v for k, v in spec.items() if k != "overrides"})
    rows = rows_of(tmp_path)
    assert len(rows) == 2 and sorted(t["seeds"] for t in rows.values()) == [1, 2], list(rows)
    assert all(name.startswith("gate+reg (") for name in rows), list(rows)
    two = next(t for t in rows.values() if t["seeds"] == 2)
    assert shows in two["variant"] or shows.split("=")[0] in two["variant"]
    assert any(shows in name for name in rows), list(rows)


@pytest.mark.parametrize(("first", "second", "shows"), [
    ({"massive": 4}, {"massive": 2}, "trainfree.massive=4"),  # the edit's setting
    ({"checkpoint": "step_0000020.pt"}, {"checkpoint": ""}, "edited checkpoint=step_0000020.pt"),  # what it edited
])
def test_derived_runs_that_differ_in_the_edit_are_not_one_row(tmp_path: Path, first: dict, second: dict,
                                                               shows: str) -> None:
    """Edits of two seeds with another edit setting, or of another checkpoint, are two rows; their sources (two true
    seeds) one row of n = 2, and the edits' cells are still read against them (`unlike_source`)."""
    for s in (0, 1):
        plant(tmp_path, f"base-s{s}", seed=s, exp="base")
    for s, edit in ((0, first), (1, second)):
        ckpt = edit.get("checkpoint")
        over = [f"trainfree.massive={edit['massive']}"] if "massive" in edit else []
        plant(tmp_path, f"base-s{s}+mean_massive", *over, seed=s, exp="base", steps=None, rule=DEFAULT_RULE,
              source=f"base-s{s}/{ckpt}" if ckpt else f"base-s{s}")
    rows = rows_of(tmp_path)
    assert rows["base"]["seeds"] == 2
    edits = {k: t for k, t in rows.items() if k.startswith("base + ")}
    assert len(edits) == 2 and all(t["seeds"] == 1 for t in edits.values()), list(rows)
    assert any(shows in k for k in edits), list(edits)
    last = next(t for k, t in edits.items() if shows not in k)
    assert last["linear_top1"][0] == pytest.approx(60.0) and not last["not_comparable"]  # its source's last.pt
    if "checkpoint" in first:
        step = edits[next(k for k in edits if shows in k)]
        assert "is of last.pt, the edit of step_0000020.pt" in step["not_comparable"]["linear_top1"][0]


def test_the_issues_three_runs_of_seed_0_are_three_rows_and_w4a4_is_not_in_a_w8a8_column(tmp_path: Path,
                                                                                        figures: list) -> None:
    """The issue's case: gate+reg seed 0 trained 30 steps at batch 64 and quantized W4A4, 8 steps at batch 8 and
    quantized W8A8, and one re-diagnosed with Definition 1 at eps 0.1: three rows of one run each, the W4A4 change in
    its own columns, the W8A8 column holding only the W8A8 run's, and no row of "3 seeds"."""
    runs = tmp_path / "runs"
    plant(runs, "gr-30", "train.max_steps=30", "train.batch_size=64", steps=30, online=0.6, linear=70.0,
          quant_json=quant(4, 4, cosine=0.9, linear=-10.0))
    plant(runs, "gr-8", "train.max_steps=8", "train.batch_size=8", steps=8, online=0.1, linear=30.0,
          quant_json=quant(8, 8, cosine=0.999, linear=-0.5))
    plant(runs, "gr-def1", steps=120, online=0.8, rule=DEF1_RULE)
    table = build(runs, tmp_path / "lb")
    by = {t["variant"]: t for t in table}
    assert [t["seeds"] for t in table] == [1, 1, 1]
    assert list(by) == [
        "gate+reg (train.max_steps=8, train.batch_size=8, steps trained=8, quant=W8A8, sink rule=relaxed)",
        "gate+reg (train.max_steps=30, train.batch_size=64, steps trained=30, quant=W4A4, sink rule=relaxed)",
        "gate+reg (train.max_steps=none, train.batch_size=64, steps trained=120, sink rule=def1 eps 0.1)"]
    w4, w8 = (next(t for k, t in by.items() if f"quant={f}" in k) for f in ("W4A4", "W8A8"))
    assert w8["w8a8_cos_err"][0] == pytest.approx(0.001) and math.isnan(w4["w8a8_cos_err"][0])
    assert w4["w4a4_cos_err"][0] == pytest.approx(0.1) and math.isnan(w8["w4a4_cos_err"][0])
    assert w4["w4a4_d_linear"][0] == pytest.approx(-10.0) and w8["w8a8_d_linear"][0] == pytest.approx(-0.5)
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert [r["seeds"] for r in cells(md, "Quality").values()] == ["1", "1", "1"] and "A row is one experiment" in md
    quantization = cells(md, "Quantization")
    row4 = quantization[next(k for k in quantization if "W4A4" in k)]
    assert row4["W8A8 1 - feature cosine"] == "-" and row4["W4A4 1 - feature cosine"] == "0.1"
    assert row4["W4A4 change of linear top-1"] == "-10.00" and row4["W8A8 change of linear top-1"] == "-"
    csv_head = (tmp_path / "lb" / "leaderboard.csv").read_text().splitlines()[0].split(",")
    assert {"w8a8_cos_err_mean", "w4a4_cos_err_mean", "w4a4_d_linear_mean"} <= set(csv_head)
    labels = [t.get_text() for t in figures[-1].axes[0].get_yticklabels()]  # the names, wrapped, in the figure
    assert [name.replace("\n", " ") for name in labels] == list(by) and not overlapping_labels(figures[-1])


def test_a_row_is_named_only_for_what_its_runs_have(tmp_path: Path) -> None:
    """Two seeds of one experiment, only seed 0 quantized W4A4, beside an experiment quantized W8A8 and one never
    quantized: the first row says that one of its two runs holds the W4A4 result, the unquantized row names no
    quantization (the issue's row named `quant=W4A4` for runs without a quantization result)."""
    plant(tmp_path, "a-s0", seed=0, quant_json=quant(4, 4))
    plant(tmp_path, "a-s1", seed=1)
    plant(tmp_path, "b-s0", "train.batch_size=8", seed=0, quant_json=quant(8, 8))
    plant(tmp_path, "c-s0", "train.batch_size=16", seed=0)
    rows = rows_of(tmp_path)
    assert sorted(rows) == ["gate+reg (train.batch_size=16)",
                            "gate+reg (train.batch_size=64, quant=W4A4 in 1 of 2 runs)",
                            "gate+reg (train.batch_size=8, quant=W8A8)"], list(rows)
    assert rows["gate+reg (train.batch_size=64, quant=W4A4 in 1 of 2 runs)"]["seeds"] == 2


def test_w4a4_and_w8a8_results_sit_in_their_own_columns(tmp_path: Path) -> None:
    """Two variants, one quantized W8A8 and one W4A4 (with a dense change each): each format's values in the
    columns that name it, labelled by it; the W8A8 columns keep their keys and labels."""
    plant(tmp_path, "base-s0", exp="base", quant_json={**quant(8, 8), "dense": {"dense_voc": change(40.0, 39.0)}})
    plant(tmp_path, "gate-s0", exp="gate", quant_json={**quant(4, 4, cosine=0.95), "dense": {
        "dense_voc": change(40.0, 30.0)}})
    rows = [collect(r) for r in run_dirs(tmp_path)]
    cols = {c.key: c for c in columns({k for r in rows for k in r})}
    assert cols["w8a8_cos_err"].label == "W8A8 1 - feature cosine"
    assert cols["w4a4_cos_err"].label == "W4A4 1 - feature cosine"
    assert cols["w4a4_d_dense_voc"].label == "W4A4 change of VOC mIoU (DINOv2-style probe)"
    assert cols["w4a4_d_dense_voc"].probe == cols["w8a8_d_dense_voc"].probe == cols["dense_voc"].probe
    assert cols["w4a4_d_online"].probe == cols["w8a8_d_online"].probe
    by = {t["variant"]: t for t in aggregate(rows)}
    assert by["base"]["w8a8_d_dense_voc"][0] == pytest.approx(-1.0) and math.isnan(by["base"]["w4a4_d_dense_voc"][0])
    assert by["gate"]["w4a4_d_dense_voc"][0] == pytest.approx(-10.0) and math.isnan(by["gate"]["w8a8_d_dense_voc"][0])
    assert by["gate"]["w4a4_cos_err"][0] == pytest.approx(0.05) and math.isnan(by["gate"]["w8a8_cos_err"][0])
    assert by["gate"]["kurtosis_max"][0] == 3.0  # the float model's inputs: one column for every format
    assert [c.key for c in QuantResult.columns()] == ["w8a8_cos_err", "w8a8_d_linear", "w8a8_d_online",
                                                      "kurtosis_max", "inf_norm_max"]


def test_two_runs_of_one_experiment_and_one_seed_are_refused(tmp_path: Path) -> None:
    plant(tmp_path, "gr-a")
    plant(tmp_path, "gr-b")
    with pytest.raises(BadValue, match="runs gr-a, gr-b are one experiment with one seed"):
        rows_of(tmp_path)


def test_only_bookkeeping_is_left_out_and_a_new_key_counts() -> None:
    """The experiment is the config minus a short list: the seed, names, paths, logging and switches are left out,
    every setting of the model, data, objective and schedule is in, and so is any key the list does not name."""
    keys = config_keys(load_config(["exp=gate+reg"]))
    for key in ("model.gate", "model.registers", "data.train_size", "objective.lamb", "train.lr", "train.batch_size",
                "train.max_steps", "train.warmup_epochs", "views.n_local", "trainfree.method", "trainfree.massive"):
        assert key in keys, key
    for key in ("seed", "name", "runs_dir", "wandb.mode", "cluster.nodes", "train.cpu_threads", "data.root",
                "data.num_workers", "eval.after_train", "trainfree.source"):
        assert key not in keys and bookkeeping(key), key
    assert not bookkeeping("train.some_new_setting") and not bookkeeping("seedling")
