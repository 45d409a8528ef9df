"""The leaderboard against hand-made run folders with known numbers, and its HTML in a real headless browser."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex
from omegaconf import OmegaConf

from tests.helpers.commands import run_command, run_commands
from tests.helpers.figures import overlapping_labels
from tests.helpers.leaderboard import RUNS, make_runs, sinks_summary
from tests.helpers.requirements import require_chromium
from vitsinks.configs.schema import load_config
from vitsinks.diagnostics.rules import CLASSES, SinkRules
from vitsinks.diagnostics.summary import rule_record
from vitsinks.objectives.monitors import KNN, RANKME
from vitsinks.quant.quant_results import QuantResult
from vitsinks.report import aggregate, build, collect, columns, run_dirs, significant_best
from vitsinks.report.collect import quality as quality_columns
from vitsinks.utils.columns import SECTIONS, Column
from vitsinks.utils.errors import BadValue
from vitsinks.utils.plotting import CLASS_COLORS, CLASS_LABELS
from vitsinks.utils.results import RESULTS, Result
from vitsinks.utils.rundir import RunDir
from vitsinks.utils.stats import welch_p

KEMPNER_RULE = rule_record(SinkRules(ratio="ratio_head", use_stable_rank=False), 12)  # the reference's counting


@pytest.mark.slow
def test_aggregation_by_hand(tmp_path: Path) -> None:
    table = {t["variant"]: t for t in aggregate([collect(r) for r in run_dirs(make_runs(tmp_path))])}
    assert list(table) == ["base", "gate+reg"]
    base, gr = table["base"], table["gate+reg"]
    assert base["seeds"] == 2
    assert base["online_top1"][0] == pytest.approx(52.0) and base["online_top1"][1] == pytest.approx(2 ** 0.5 * 2)
    assert base["linear_top1"] == (pytest.approx(62.0), pytest.approx(2 ** 0.5 * 2))
    assert gr["dense_synthetic"][0] == pytest.approx(32.0)
    assert base["nop"][0] == pytest.approx(3.0) and gr["broadcast"][0] == pytest.approx(2.0)
    assert base["massive"][0] == pytest.approx(6.0)  # max over blocks of 3 + nop, averaged over seeds
    assert gr["sinks"][0] == pytest.approx(2.0)


@pytest.mark.slow
def test_outputs_with_two_seeds_mark_nothing_and_say_why(tmp_path: Path, figures: list) -> None:
    out = tmp_path / "lb"
    table = build(make_runs(tmp_path / "runs"), out)
    md = (out / "leaderboard.md").read_text()
    assert "| gate+reg | 2 | 61.00 ± 1.41 | 71.00 ± 1.41 | 32.00 ± 2.83 |" in md and "**" not in md
    assert "| gate+reg | 2 | - | 2.00 ± 1.41 | 0.00 ± 0.00 |" in md  # sinks table: where the strongest sits, counts
    assert ("Nothing is marked in online probe top-1, linear top-1, synthetic mIoU (DINOv2-style probe): some "
            "variant has fewer than 3") in md
    assert "| base | 69.37 | 16.59 | 43.81 |" in md  # reference quality numbers, separate block
    assert "Sink columns counted with: relaxed rule (routed_frac >= 0.9); NOP-like ratio_out <= 0.2" in md
    assert "0.09" not in md and "reference's sinks per image are left out" in md  # counted another way
    assert "fewer than 3" in figures[-1].get_supxlabel() and "ratio_out" in figures[-1].get_supxlabel()
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert [r["variant"] for r in rows] == ["base", "gate+reg"] and float(rows[0]["linear_top1_mean"]) == 62.0
    assert (out / "leaderboard.png").stat().st_size > 10_000
    shown = [c.key for c in quality_columns(columns()) if any(not math.isnan(t[c.key][0]) for t in table)]
    fig = figures[-1]
    quality, mechanism = fig.axes[:len(shown)], fig.axes[len(shown)]  # a panel per quality column, then sinks
    assert [ln.get_xdata().tolist() for ax in quality for ln in ax.lines[:1]] == [[t[k][0] for t in table]
                                                                                   for k in shown]
    assert "linear_top1" in shown
    stacked = np.array([p.get_width() for p in mechanism.patches]).reshape(3, len(table))  # NOP, broadcast, other
    assert stacked[0].tolist() == [t["nop"][0] for t in table] and stacked[1].tolist() == \
        [t["broadcast"][0] for t in table]
    np.testing.assert_allclose(stacked.sum(0), [t["sinks"][0] for t in table])
    assert [tx.get_text() for tx in mechanism.get_legend().get_texts()] == [CLASS_LABELS[c] for c in CLASSES]
    colours = {c: to_hex(mechanism.patches[i * len(table)].get_facecolor()) for i, c in enumerate(CLASSES)}
    page = (out / "leaderboard.html").read_text()  # the HTML legend: the figure's colours
    assert {c: re.search(f'data-class="{c}"><i style="[^"]*background:(#[0-9a-f]{{6}})', page)[1]
            for c in CLASSES} == colours == {c: CLASS_COLORS[c] for c in CLASSES}
    assert not overlapping_labels(fig)


@pytest.mark.slow
def test_html_renders_the_table_in_headless_chromium(tmp_path: Path) -> None:
    browser = require_chromium()
    out = tmp_path / "lb"
    build(make_runs(tmp_path / "runs"), out)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = run_command([browser, *flags, "--dump-dom", (out / "leaderboard.html").as_uri()]).stdout
    assert '<table id="leaderboard-quality">' in dom and '<table id="leaderboard-sinks">' in dom
    assert "<td>gate+reg</td><td>2</td><td class=\"\">61.00 ± 1.41</td>" in dom  # 2 seeds: no mark
    assert "Nothing is marked in online probe top-1" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, "--window-size=1200,900", f"--screenshot={shot}",
                    (out / "leaderboard.html").as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


@pytest.mark.slow
def test_cli_errors(tmp_path: Path) -> None:
    out, usage = run_commands([[sys.executable, "-m", "vitsinks.leaderboard", f"runs={tmp_path / 'none'}"],
                               [sys.executable, "-m", "vitsinks.leaderboard", "rns=x"]])
    assert out.returncode == 1 and "neither a run folder nor a sweep" in out.stderr
    assert usage.returncode == 1 and "rns" in usage.stderr and "usage: python -m vitsinks.leaderboard" in usage.stderr


@pytest.mark.slow
def test_new_variants_sit_beside_the_four_with_their_pathway_and_causal_columns(tmp_path: Path) -> None:
    """Variants come from vitsinks/configs/exp (no hand-kept list): the four first, then the rest by name; the pathway
    share, the attention's common-mode share and an intervention summary reach their columns."""
    for exp in ("global+pen", "base", "reg+global+pen", "gate"):
        run = tmp_path / exp
        (run / "diagnostics" / "final").mkdir(parents=True)
        (run / "interventions" / "last").mkdir(parents=True)
        (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config([f"exp={exp}"]), resolve=True))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/probe_acc": 0.5}) + "\n")
        summary = {**sinks_summary(1.0, 0.0), "common_mode_by_block": [0.2, 0.4]}
        if "global" in exp:
            summary["pathway"] = {"share_by_block": [0.5, None, 0.7]}
        (run / "diagnostics" / "final" / "summary.json").write_text(json.dumps(summary))
        by_class = {"blocks 1..L-1": {"nop": {"zero_sink_value": {"final_patch_relrms": 0.25}}},
                    "block 0": {"nop": {"zero_sink_value": {"final_patch_relrms": 9.0}}}}
        (run / "interventions" / "last" / "summary.json").write_text(json.dumps({"by_class": by_class}))
    table = build(tmp_path, tmp_path / "lb")
    assert [t["variant"] for t in table] == ["base", "gate", "global+pen", "reg+global+pen"]
    rows = {t["variant"]: t for t in table}
    assert rows["global+pen"]["pathway_share"][0] == pytest.approx(0.6) and math.isnan(rows["base"]["pathway_share"][0])
    assert rows["base"]["common_mode"][0] == pytest.approx(0.3)
    assert rows["gate"]["causal_zero_nop"][0] == pytest.approx(0.25)  # the main scope, not block 0
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "pathway share of update" in md and "zero v_s, NOP heads" in md


def test_welch_p_against_closed_forms_and_the_integrated_density() -> None:
    """Welch's two-sided p by independent routes: [1, 2, 3] vs [4, 5, 6] has t^2 = 13.5 on 4 degrees of freedom,
    where the t distribution's CDF is closed (2F - 1 = sin(th) (1 + cos(th)^2 / 2), tan(th) = t / 2); unequal
    variances give fractional degrees of freedom, checked against Simpson's rule on the t density."""
    sin2 = 13.5 / (4 + 13.5)
    assert welch_p(2.0, 1.0, 3, 5.0, 1.0, 3) == pytest.approx(1 - math.sqrt(sin2) * (1 + (1 - sin2) / 2), rel=1e-10)
    a, b = np.array([1.0, 2.0, 3.0, 4.5]), np.array([10.0, 20.0, 30.0])
    va, vb = a.var(ddof=1) / 4, b.var(ddof=1) / 3
    t, df = (b.mean() - a.mean()) / math.sqrt(va + vb), (va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2)
    assert abs(df - round(df)) > 0.01  # really fractional
    x = np.linspace(0, t, 20001)
    dens = (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
            * (1 + x ** 2 / df) ** (-(df + 1) / 2))
    simpson = (x[1] - x[0]) / 3 * (dens[0] + dens[-1] + 4 * dens[1:-1:2].sum() + 2 * dens[2:-1:2].sum())
    assert welch_p(a.mean(), a.std(ddof=1), 4, b.mean(), b.std(ddof=1), 3) == pytest.approx(1 - 2 * simpson, rel=1e-8)
    assert welch_p(3.0, 0.0, 3, 3.0, 0.0, 3) == 1.0 and welch_p(3.0, 0.0, 3, 2.0, 0.0, 3) == 0.0


def _table(linear: dict[str, list[float]]) -> list[dict]:
    """Aggregated rows with only `linear_top1` measured: variant -> its seeds' values."""
    rows = [{"variant": v, "data": "synthetic", "seed": i, "sink_at": "-", "profile": [], "sink_rule": "-",
             **{c.key: math.nan for c in columns()}, "linear_top1": x}
            for v, xs in linear.items() for i, x in enumerate(xs)]
    return aggregate(rows)


@pytest.mark.parametrize(("linear", "marked", "few"), [
    ({"base": [60, 61, 62], "gate": [70, 71, 72], "reg": [50, 51, 52]}, "gate", []),  # t^2 = 150, df 4: p ~ 3e-4
    ({"base": [80, 84, 86], "gate": [84, 88, 93]}, None, []),  # gate ahead by 5 inside the spread: p ~ 0.2
    ({"base": [70, 71, 72], "gate": [71, 72.5, 74], "reg": [50, 51, 52]}, None, []),  # beats reg, not base
    ({"base": [60, 61], "gate": [70, 71]}, None, ["linear top-1"]),  # clear, but 2 seeds: too few for the test
    ({"base": [100, 100, 100], "gate": [100, 100, 100]}, None, []),  # all equal: a tie, never marked
    ({"base": [100, 100, 100], "gate": [100 - 1e-9] * 3}, None, []),  # no spread, p = 0, but both show 100.00
    ({"base": [100, 100, 100], "gate": [90, 90, 90]}, "base", []),  # no spread at all, different values
])
def test_welch_marks(linear: dict, marked: str | None, few: list) -> None:
    best, too_few = significant_best(_table(linear))
    assert best.get("linear_top1") == marked and too_few == few


@pytest.mark.slow
def test_three_separated_seeds_are_marked_in_every_output(tmp_path: Path, figures: list) -> None:
    runs = {("base", s): (0.50 + s / 100, 60.0 + s, 0.2, 0.0, 0.0) for s in range(3)}
    runs |= {("gate", s): (0.51 - s / 100, 70.0 + s, 0.2, 0.0, 0.0) for s in range(3)}
    out = tmp_path / "lb"
    build(make_runs(tmp_path / "runs", runs), out)
    md = (out / "leaderboard.md").read_text()
    assert "| gate | 3 | 50.00 ± 1.00 | **71.00 ± 1.00** | 20.00 ± 0.00 |" in md  # online: inside the spread
    assert "two-sided Welch t-test (unequal variances), p < 0.05 in each comparison, with >= 3 seeds" in md
    assert '<td class="best">71.00 ± 1.00</td>' in (out / "leaderboard.html").read_text()
    stars = [t for ax in figures[-1].axes for t in ax.texts if t.get_text() == "*"]
    assert [t.axes.get_title().replace("\n", " ") for t in stars] == ["linear top-1 (%)"]
    assert len(stars) == 1 and "Welch" in figures[-1].get_supxlabel()


def test_one_table_per_section_every_column_once(tmp_path: Path) -> None:
    """The Markdown shows each shown column in exactly one table, the one its `Column.table` names, the tables in
    SECTIONS order and each with every variant; a column naming no table is refused when it is made."""
    runs = make_runs(tmp_path / "runs")
    quant = QuantResult(checkpoint="last.pt", weight_bits=8, act_bits=8, calib_images=4, n_images=4,
                        by_block={"kurtosis": {"fc1": [3.0]}, "inf_norm": {"fc1": [2.0]}}, feature_cosine=0.999,
                        feature_cosine_by_block=[0.999], online_top1=None, linear_top1=None, dense={})
    run_dirs(runs)[0].result("quant").write_text(json.dumps(quant.to_json()))
    table = build(runs, tmp_path / "lb")
    md = (tmp_path / "lb" / "leaderboard.md").read_text().split("## Reference numbers")[0]
    found: dict[str, list[str]] = {}  # section title -> its table's header labels
    for block in md.split("\n## ")[1:]:
        title, _, body = block.partition("\n")
        lines = [r for r in body.splitlines() if r.startswith("| ")]
        found[title] = [h.strip() for h in lines[0].strip("|").split(" | ")]
        assert [r.split(" | ")[0].lstrip("| ") for r in lines[1:]] == [t["variant"] for t in table]
    shown = [c for c in columns(set(table[0])) if any(not math.isnan(t[c.key][0]) for t in table)]
    assert list(found) == [SECTIONS[k] for k in SECTIONS if any(c.table == k for c in shown)]
    assert {"Quality", "Quantization", "Sinks per image", "Residual stream"} <= set(found)
    for key, title in SECTIONS.items():
        want = [c.label.replace("|", "\\|") for c in shown if c.table == key]
        lead = ["variant", "seeds", *(["strongest sink at"] if key == "sinks" else [])]
        assert found.get(title, lead) == lead + want
    with pytest.raises(ValueError, match="no leaderboard table 'tables'"):
        Column("x", "x", "quality", section="tables")


def test_the_ssl_monitors_have_their_own_table_and_protocols(tmp_path: Path) -> None:
    """k-NN top-1 and RankMe (the last validation's, from metrics.jsonl) in a table of their own, under their own
    protocols, beside no probe; the k-NN can be marked (a quality column), RankMe never (no better direction)."""
    runs = make_runs(tmp_path / "runs")
    logged = {("base", 0): (0.70, 20.0), ("base", 1): (0.74, 22.0), ("gate+reg", 0): (0.80, 30.0),
              ("gate+reg", 1): (0.90, 34.0)}
    for (exp, seed), (knn, rank) in logged.items():
        with (runs / f"{exp}-s{seed}" / "metrics.jsonl").open("a") as f:  # an earlier validation, then the last
            f.write(json.dumps({"step": 5, KNN: 0.1, RANKME: 1.0}) + "\n" + json.dumps({"step": 10, KNN: knn,
                                                                                       RANKME: rank}) + "\n")
    table = {t["variant"]: t for t in build(runs, tmp_path / "lb")}
    assert table["base"]["knn_top1"] == (pytest.approx(72.0), pytest.approx(2 ** 0.5 * 2))
    assert table["gate+reg"]["rankme"] == (pytest.approx(32.0), pytest.approx(2 ** 0.5 * 2))
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert ("## SSL monitors (validation, during training)\n\n| variant | seeds | k-NN top-1 | RankMe |\n"
            "|---|---|---|---|\n| base | 2 | 72.00 ± 2.83 | 21.00 ± 1.41 |\n"
            "| gate+reg | 2 | 85.00 ± 7.07 | 32.00 ± 2.83 |") in md
    assert "k-NN" not in md.split("## Quality")[1].split("\n## ")[0]  # never beside the probes
    rows = list(csv.DictReader((tmp_path / "lb" / "leaderboard.csv").open()))
    assert [float(r["knn_top1_mean"]) for r in rows] == [72.0, 85.0] and float(rows[1]["rankme_mean"]) == 32.0
    monitors = {c.key: c.probe for c in columns() if c.table == "monitors"}
    assert monitors == {"knn_top1": "knn@val", "rankme": "rankme@val"}  # no probe's column shares their table
    assert {c.probe for c in columns() if c.key not in monitors}.isdisjoint(monitors.values())
    assert [c.key for c in quality_columns(columns()) if c.key in monitors] == ["knn_top1"]


@pytest.mark.slow
def test_reference_sinks_only_beside_counts_made_the_same_way(tmp_path: Path) -> None:
    build(make_runs(tmp_path / "kempner", rule=KEMPNER_RULE), tmp_path / "a")
    md = (tmp_path / "a" / "leaderboard.md").read_text()
    assert "| gate (Gating) | 3.80 | 0.00 | 3.88 | 2.02 |" in md and "left out" not in md
    assert "NOP-like ratio_head <= 0.2, broadcast-like ratio_head >= 0.5, no stable-rank test; blocks 1..L-1" in md
    assert 'id="reference-sinks"' in (tmp_path / "a" / "leaderboard.html").read_text()
    one_block = rule_record(SinkRules(ratio="ratio_head", use_stable_rank=False), 1)  # same classes, block 0 counted
    for name, rule in (("old", None), ("oneblock", one_block)):
        build(make_runs(tmp_path / name, rule=rule), tmp_path / f"lb-{name}")
        md = (tmp_path / f"lb-{name}" / "leaderboard.md").read_text()
        assert "3.80" not in md and "reference's sinks per image are left out" in md
    assert "rule not recorded" in (tmp_path / "lb-old" / "leaderboard.md").read_text()


@pytest.mark.slow
def test_dense_numbers_carry_the_protocol_that_made_them(tmp_path: Path) -> None:
    runs = make_runs(tmp_path / "runs")
    run = run_dirs(runs)[0]
    run.result("dense_ade20k_kempner").write_text(json.dumps({"protocol": "kempner", "mIoU": 0.25}))
    row = collect(run)
    assert row["dense_ade20k_kempner"] == 25.0 and math.isnan(row["dense_ade20k"])
    md = (tmp_path / "lb" / "leaderboard.md")
    build(runs, md.parent)
    text = md.read_text()
    assert "ADE20K mIoU (reference probe)" in text and "comparable with the '(reference probe)'" in text
    run.result("dense_ade20k_kempner").write_text(json.dumps({"protocol": "dinov2", "mIoU": 0.25}))
    with pytest.raises(BadValue, match="dense protocol"):
        collect(run)


def test_every_dense_result_the_probe_writes_reaches_the_leaderboard(tmp_path: Path) -> None:
    """No hand-kept dataset list: a Fashion-MNIST mosaic result (what `eval.dense data=fashion_mnist` writes) and a
    result of data the leaderboard has never heard of both get a column, with their numbers."""
    runs = make_runs(tmp_path / "runs", {("base", 0): RUNS[("base", 0)]})
    run = run_dirs(runs)[0]
    run.result("dense_fashion_mnist").write_text(json.dumps({"data": "fashion_mnist", "mIoU": 0.41}))
    run.result("dense_cityscapes_kempner").write_text(json.dumps({"protocol": "kempner", "mIoU": 0.12}))
    table = build(runs, tmp_path / "lb")
    assert table[0]["dense_fashion_mnist"][0] == pytest.approx(41.0)
    assert table[0]["dense_cityscapes_kempner"][0] == pytest.approx(12.0)
    md = (tmp_path / "lb" / "leaderboard.md").read_text()
    assert "Fashion-MNIST mosaics mIoU (DINOv2-style probe)" in md and "cityscapes mIoU (reference probe)" in md
    rows = list(csv.DictReader((tmp_path / "lb" / "runs.csv").open()))
    assert float(rows[0]["dense_fashion_mnist"]) == pytest.approx(41.0)


def test_a_run_is_named_by_its_architecture_not_its_exp_config(tmp_path: Path) -> None:
    """`exp=base model.gate=elementwise` trains the gate variant: the leaderboard says gate, as status.json does."""
    run = tmp_path / "runs" / "odd"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config(["exp=base", "model.gate=elementwise"]),
                                                       resolve=True))
    assert collect(run)["variant"] == "gate"


class _Throwaway(Result):
    """A result registered by a test: one column no run has, one that one run has."""

    kind, rank = "throwaway", 999

    def to_json(self) -> dict:
        return {}

    @classmethod
    def from_json(cls, obj: dict) -> _Throwaway:
        return cls()

    @classmethod
    def columns(cls) -> list[Column]:
        return [Column("throwaway_none", "no run has it", "mechanism"),
                Column("throwaway_some", "one run has it", "mechanism")]

    @classmethod
    def collect(cls, run: RunDir) -> dict:
        return {**cls.missing(), **({"throwaway_some": 7.0} if run.name == "base-s0" else {})}


def test_a_column_no_run_has_is_not_in_the_csvs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A newly registered column (a new result's, a new mitigation's) leaves the CSVs of runs without it as they
    were: only a column some run has a value for is written."""
    monkeypatch.setitem(RESULTS._items, _Throwaway.kind, _Throwaway)
    build(make_runs(tmp_path / "runs", {k: RUNS[k] for k in [("base", 0), ("gate+reg", 0)]}), tmp_path / "lb")
    with (tmp_path / "lb" / "leaderboard.csv").open() as f:
        board = list(csv.DictReader(f))
    with (tmp_path / "lb" / "runs.csv").open() as f:
        runs = {r["run"]: r for r in csv.DictReader(f)}
    assert "throwaway_none_mean" not in board[0] and "throwaway_none" not in runs["base-s0"]
    assert [r["throwaway_some_mean"] for r in board] == ["7.0000", "nan"]
    assert [runs[r]["throwaway_some"] for r in ("base-s0", "gate+reg-s0")] == ["7.0", "nan"]
    assert "linear_top1_mean" in board[0] and "dense_ade20k_mean" not in board[0]  # the registered ones alike
    assert "source" in runs["base-s0"]  # a run's own fields stay, value or not
