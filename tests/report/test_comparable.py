"""A leaderboard column holds one probe protocol, and a derived run's row is read against its source run only where
both were measured by the same probe, with the same probe seed, on the checkpoint the edit was made from; else its
cell says "not comparable" (issue 33: the parent's online probe 80.86 beside the edit's linear probe 95.21)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.figures import bar_heights
from tests.helpers.leaderboard import cells
from vitsinks.configs.schema import load_config
from vitsinks.quant.quant_results import QuantResult, change
from vitsinks.report import aggregate, build, collect, columns, run_dirs, significant_best, to_markdown
from vitsinks.report.collect import NOT_COMPARABLE
from vitsinks.utils.results import RESULTS, Column, Result, result_types
from vitsinks.utils.rundir import RunDir

EDIT = "base + mean-fixed massive activations"  # the row of a `base` run's mean_massive edit


def plant(root: Path, name: str, seed: int = 0, source: str | None = None, online: float | None = None,
          results: dict[str, dict] | None = None, exp: str = "base") -> RunDir:
    """A run folder: `source` (a run name, or `<run>/<checkpoint file>`) makes it that run's mean_massive edit;
    `online` its training's last online-probe accuracy; `results` its `results/<kind>.json` files."""
    run = RunDir(root / name)
    run.results.mkdir(parents=True)
    over = [f"exp={exp}", f"seed={seed}"]
    if source is not None:
        parent, _, ckpt = source.partition("/")
        over += ["trainfree.method=mean_massive",
                 f"trainfree.source={root / parent / 'checkpoints' / (ckpt or 'last.pt')}"]
    run.config.write_text(OmegaConf.to_yaml(load_config(over), resolve=True))
    if source is not None:
        run.write_status("finished", method="mean_massive")  # a derived run that finished
    if online is not None:
        run.metrics.write_text(json.dumps({"step": 10, "val/probe_acc": online}) + "\n")
    for kind, obj in (results or {}).items():
        run.result(kind).write_text(json.dumps({"checkpoint": str(run.last), **obj}))
    return run


def linear(top1: float, seed: int | None) -> dict:
    return {"best": {"top1": top1}, **({} if seed is None else {"seed": seed})}


def board(root: Path) -> dict[str, dict]:
    """The aggregated rows of every run under `root`, by variant."""
    return {t["variant"]: t for t in aggregate([collect(r) for r in run_dirs(root)])}


def test_the_issues_case_online_probe_parent_and_linear_probe_edit_share_no_column(tmp_path: Path,
                                                                                    figures: list) -> None:
    """The parent has only its online probe (80.86), the edit only a linear probe (95.21): no column holds both, the
    edit's linear cell says not comparable and why, and nothing (table, CSV, figure) shows 95.21 beside 80.86."""
    runs = tmp_path / "runs"
    plant(runs, "base-s0", online=0.8086)
    plant(runs, "base-s0+mean_massive", source="base-s0", results={"linear": linear(95.21, 0)})
    table = build(runs, tmp_path / "lb")
    rows = {t["variant"]: t for t in table}
    assert list(rows) == ["base", EDIT]
    for c in columns(set(table[0])):  # the table itself: no column with a number in both rows
        assert math.isnan(rows["base"][c.key][0]) or math.isnan(rows[EDIT][c.key][0]), c.key
    assert rows["base"]["online_top1"][0] == pytest.approx(80.86) and math.isnan(rows[EDIT]["online_top1"][0])
    assert list(rows[EDIT]["not_comparable"]) == ["linear_top1"]
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    quality = cells(md, "Quality")
    assert quality["base"]["online probe top-1"] == "80.86" and quality[EDIT]["online probe top-1"] == "-"
    assert quality["base"]["linear top-1"] == "-" and quality[EDIT]["linear top-1"] == NOT_COMPARABLE
    assert "95.21" not in md
    assert f"{EDIT}, linear top-1: base-s0+mean_massive: its source base-s0 has no linear top-1" in md
    csv_rows = {r["variant"]: r for r in csv.DictReader((tmp_path / "lb" / "leaderboard.csv").open())}
    assert csv_rows[EDIT]["linear_top1_mean"] == NOT_COMPARABLE and csv_rows["base"]["linear_top1_mean"] == "nan"
    assert "95.21" not in (tmp_path / "lb" / "leaderboard.html").read_text()
    assert 95.21 not in [round(h, 2) for h in bar_heights(figures[-1].axes[0])]
    runs_csv = {r["run"]: r for r in csv.DictReader((tmp_path / "lb" / "runs.csv").open())}
    assert runs_csv["base-s0+mean_massive"]["source"] == "base-s0"  # the run's own value stays, with its source
    assert float(runs_csv["base-s0+mean_massive"]["linear_top1"]) == pytest.approx(95.21)


@pytest.mark.parametrize(("parent_seed", "edit_seed", "why"), [
    (0, 0, None),  # the same probe, seed and checkpoint: the edit's value is shown
    (0, 1, "probed with seed 1, its source base-s0 with seed 0"),  # two seeds are never paired
    (1, 0, "probed with seed 0, its source base-s0 with seed 1"),
    (None, 0, "probe seed of it or of its source base-s0 is not recorded"),  # unrecorded: cannot be the same
    (None, None, "probe seed of it or of its source base-s0 is not recorded"),
])
def test_a_linear_probe_is_read_against_its_sources_only_with_the_same_seed(
        tmp_path: Path, parent_seed: int | None, edit_seed: int | None, why: str | None) -> None:
    plant(tmp_path, "base-s0", results={"linear": linear(60.0, parent_seed)})
    plant(tmp_path, "base-s0+mean_massive", source="base-s0", results={"linear": linear(61.0, edit_seed)})
    edit = board(tmp_path)[EDIT]
    if why is None:
        assert edit["linear_top1"][0] == pytest.approx(61.0) and not edit["not_comparable"]
    else:
        assert math.isnan(edit["linear_top1"][0]) and why in edit["not_comparable"]["linear_top1"][0]
        assert NOT_COMPARABLE in cells(to_markdown(list(board(tmp_path).values())), "Quality")[EDIT]["linear top-1"]


def test_an_unrecorded_linear_seed_is_its_runs_dense_probe_seed(tmp_path: Path) -> None:
    """A linear result written before seeds were recorded takes the seed its run's dense probe heads record: the
    committed studies' parents; a run whose probes record two seeds gives none."""
    dense = {"mIoU": 0.2, "probes": [{"seed": 1}]}
    plant(tmp_path, "base-s1", seed=1, results={"linear": linear(60.0, None), "dense_synthetic": dense})
    plant(tmp_path, "base-s1+mean_massive", seed=1, source="base-s1",
          results={"linear": linear(61.0, 1), "dense_synthetic": dense})
    edit = board(tmp_path)[EDIT]
    assert edit["linear_top1"][0] == pytest.approx(61.0) and edit["dense_synthetic"][0] == pytest.approx(20.0)
    RunDir(tmp_path / "base-s1").result("dense_synthetic").write_text(json.dumps({"mIoU": 0.2, "seed": 0}))
    edit = board(tmp_path)[EDIT]  # the parent's dense probe now says seed 0: its linear seed is unknown
    assert set(edit["not_comparable"]) == {"linear_top1", "dense_synthetic"}
    assert "seed 1, its source base-s1 with seed 0" in edit["not_comparable"]["dense_synthetic"][0]


def test_every_seed_of_a_derived_row_must_pair_and_the_source_must_be_in_the_leaderboard(tmp_path: Path) -> None:
    """Seed 0's edit pairs with its source, seed 1's was probed with seed 0: the row's mean would mix, so the cell is
    not comparable; an edit of a periodic checkpoint is not read against the source's last.pt probe; an edit
    tabulated without its source is not comparable either."""
    for s in (0, 1):
        plant(tmp_path, f"base-s{s}", seed=s, results={"linear": linear(60.0 + s, s)})
        plant(tmp_path, f"base-s{s}+mean_massive", seed=s, source=f"base-s{s}", results={"linear": linear(62.0, 0)})
    why = board(tmp_path)[EDIT]["not_comparable"]["linear_top1"]
    assert why == ["base-s1+mean_massive: probed with seed 0, its source base-s1 with seed 1 (probe both with one "
                   "seed)"]
    step = tmp_path / "step"
    plant(step, "base-s0", results={"linear": linear(60.0, 0)})
    plant(step, "base-s0@step_0000100+mean_massive", source="base-s0/step_0000100.pt",
          results={"linear": linear(62.0, 0)})
    assert "is of last.pt, the edit of step_0000100.pt" in board(step)[EDIT]["not_comparable"]["linear_top1"][0]
    alone = tmp_path / "alone"
    plant(alone, "base-s0+mean_massive", source="base-s0", results={"linear": linear(62.0, 0)})
    assert "its source base-s0 is not in this leaderboard" in board(alone)[EDIT]["not_comparable"]["linear_top1"][0]
    rows = [collect(r) for r in run_dirs(step)]
    rows[1]["data"] = "fashion_mnist"  # the edit of last.pt on other data (a data= override)
    rows[1]["_derived_from"] = rows[1]["_derived_from"].replace("step_0000100", "last")
    why = {t["variant"]: t for t in aggregate(rows)}[f"fashion_mnist / {EDIT}"]["not_comparable"]["linear_top1"]
    assert why == ["base-s0@step_0000100+mean_massive: its source base-s0 is of other data (synthetic, not "
                   "fashion_mnist)"]


def test_a_not_comparable_value_is_never_marked_best(tmp_path: Path) -> None:
    """Three seeds of an edit far above every trained row, its sources probed with other seeds: no Welch mark."""
    for s in range(3):
        plant(tmp_path, f"base-s{s}", seed=s, results={"linear": linear(60.0 + s, s + 10)})
        plant(tmp_path, f"base-s{s}+mean_massive", seed=s, source=f"base-s{s}", results={"linear": linear(90.0 + s, s)})
    best, _ = significant_best(list(board(tmp_path).values()))
    assert "linear_top1" not in best


def test_dense_protocols_and_their_w8a8_changes_are_separate_columns(tmp_path: Path) -> None:
    """A DINOv2-style and a reference (kempner) ADE20K probe, and the W8A8 change of each, land in four columns, each
    naming one probe protocol; an edit probed with one protocol is not read against a source probed with the
    other."""
    quant = {"checkpoint": "last.pt", "weight_bits": 8, "act_bits": 8, "calib_images": 4, "n_images": 4,
             "by_block": {"kurtosis": {"fc1": [3.0]}, "inf_norm": {"fc1": [2.0]}}, "feature_cosine": 0.999,
             "feature_cosine_by_block": [0.999]}
    plant(tmp_path, "base-s0", results={"dense_ade20k": {"mIoU": 0.30, "seed": 0},
                                        "quant": {**quant, "dense": {"dense_ade20k": change(30.0, 29.0)}}})
    plant(tmp_path, "gate-s0", exp="gate",
          results={"dense_ade20k_kempner": {"protocol": "kempner", "mIoU": 0.20, "seed": 0},
                   "quant": {**quant, "dense": {"dense_ade20k_kempner": change(20.0, 17.0)}}})
    plant(tmp_path, "base-s0+mean_massive", source="base-s0",
          results={"dense_ade20k_kempner": {"protocol": "kempner", "mIoU": 0.25, "seed": 0}})
    rows = [collect(r) for r in run_dirs(tmp_path)]
    table = aggregate(rows)
    by = {t["variant"]: t for t in table}
    assert [r["run"] for r in rows if "w8a8_d_dense_ade20k" in r] == ["base-s0"]
    assert by["base"]["w8a8_d_dense_ade20k"][0] == pytest.approx(-1.0)
    assert math.isnan(by["gate"]["w8a8_d_dense_ade20k"][0])
    assert by["gate"]["w8a8_d_dense_ade20k_kempner"][0] == pytest.approx(-3.0)
    cols = {c.key: c for c in columns({k for r in rows for k in r})}
    probes = {k: cols[k].probe for k in ("dense_ade20k", "dense_ade20k_kempner", "w8a8_d_dense_ade20k",
                                         "w8a8_d_dense_ade20k_kempner")}
    assert probes["dense_ade20k"] == probes["w8a8_d_dense_ade20k"] != probes["dense_ade20k_kempner"]
    assert probes["dense_ade20k_kempner"] == probes["w8a8_d_dense_ade20k_kempner"] == "dense probe (kempner)"
    assert cols["w8a8_d_dense_ade20k_kempner"].label == "W8A8 change of ADE20K mIoU (reference probe)"
    assert "its source base-s0 has no ADE20K mIoU (reference probe)" in \
        by[EDIT]["not_comparable"]["dense_ade20k_kempner"][0]
    md = to_markdown(table)
    assert "W8A8 change of ADE20K mIoU (DINOv2-style probe)" in md and "W8A8 change of mIoU |" not in md
    assert {c.key: c.probe for c in columns() if c.key in ("online_top1", "linear_top1")} == {
        "online_top1": "online probe", "linear_top1": "linear probe (DINOv2 protocol)"}


def test_two_result_types_giving_one_column_are_refused() -> None:
    """One key, one column, one protocol: a result type that reuses another's key is refused, naming it."""

    class Twin(Result):
        kind, rank = "twin", 99

        def to_json(self) -> dict:
            return {}

        @classmethod
        def from_json(cls, obj: dict) -> Twin:
            return cls()

        @classmethod
        def columns(cls) -> list[Column]:
            return [Column("linear_top1", "linear top-1 (another probe)", "quality", probe="another probe")]

        @classmethod
        def collect(cls, run: RunDir) -> dict:
            return {}

    RESULTS.register(Twin)
    try:
        assert Twin in result_types()
        with pytest.raises(ValueError, match="several leaderboard columns are keyed linear_top1"):
            columns()
    finally:
        RESULTS.unregister(Twin.kind)


def test_quant_result_has_one_column_per_dense_kind() -> None:
    res = QuantResult(checkpoint="x", weight_bits=8, act_bits=8, calib_images=1, n_images=1, by_block={},
                      feature_cosine=1.0, feature_cosine_by_block=[], dense={"dense_voc": change(40.0, 39.0),
                                                                             "dense_voc_kempner_cached": change(1, 3)})
    got = res.values()
    assert got["w8a8_d_dense_voc"] == -1.0 and got["w8a8_d_dense_voc_kempner_cached"] == 2.0
    assert "w8a8_d_dense" not in got
