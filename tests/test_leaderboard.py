"""The leaderboard against hand-made run folders with known numbers, and its HTML in a real headless browser."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import bar_heights
from omegaconf import OmegaConf

from vitsinks.config import load_config
from vitsinks.leaderboard import QUALITY, aggregate, build, collect, run_dirs

# (variant, seed) -> (online acc, linear top-1, synthetic mIoU, NOP sinks, broadcast sinks)
RUNS = {("base", 0): (0.50, 60.0, 0.20, 2.0, 0.5), ("base", 1): (0.54, 64.0, 0.24, 4.0, 0.5),
        ("gate+reg", 0): (0.60, 70.0, 0.30, 0.0, 1.0), ("gate+reg", 1): (0.62, 72.0, 0.34, 0.0, 3.0)}


def _summary(nop: float, broadcast: float) -> dict:
    locs = {"cls": nop, "register": broadcast, "patch": 0.0}
    spi = {"nop": {**locs, "all": nop}, "broadcast": {"cls": 0, "register": broadcast, "patch": 0, "all": broadcast},
           "unclassified": {"cls": 0, "register": 0, "patch": 0, "all": 0},
           "all": {"cls": nop, "register": broadcast, "patch": 0.0, "all": nop + broadcast}}
    return {"sinks_per_image": spi, "massive_activations": {"ratio_by_block": [1.5, 3.0 + nop]}}


def make_runs(root: Path) -> Path:
    for (exp, seed), (online, lin, miou, nop, bc) in RUNS.items():
        run = root / f"{exp}-s{seed}"
        (run / "results").mkdir(parents=True)
        (run / "diagnostics" / "final").mkdir(parents=True)
        (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config([f"exp={exp}", f"seed={seed}"]),
                                                           resolve=True))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 1.0}) + "\n"
                                           + json.dumps({"step": 10, "val/probe_acc": online}) + "\n")
        (run / "results" / "linear.json").write_text(json.dumps({"best": {"top1": lin}}))
        (run / "results" / "dense_synthetic.json").write_text(json.dumps({"mIoU": miou}))
        (run / "diagnostics" / "final" / "summary.json").write_text(json.dumps(_summary(nop, bc)))
    return root


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


def test_outputs_mark_the_best_and_carry_the_reference_block(tmp_path: Path, figures: list) -> None:
    out = tmp_path / "lb"
    table = build(make_runs(tmp_path / "runs"), out)
    md = (out / "leaderboard.md").read_text()
    assert "| gate+reg | 2 | - | **61.00 ± 1.41** | **71.00 ± 1.41** | **32.00 ± 2.83** |" in md
    assert "| base | 69.37 | 16.59 | 43.81 | 0.09 / 0.25 |" in md  # reference numbers, separate block
    rows = list(csv.DictReader((out / "leaderboard.csv").open()))
    assert [r["variant"] for r in rows] == ["base", "gate+reg"] and float(rows[0]["linear_top1_mean"]) == 62.0
    assert (out / "leaderboard.png").stat().st_size > 10_000
    quality, mechanism = figures[-1].axes[:2]  # the bars are the table's numbers
    shown = [k for k, _ in QUALITY if any(not math.isnan(t[k][0]) for t in table)]
    assert bar_heights(quality) == [t[k][0] for k in shown for t in table] and "linear_top1" in shown
    stacked = np.array(bar_heights(mechanism)).reshape(3, len(table))  # NOP, broadcast, unclassified per variant
    assert stacked[0].tolist() == [t["nop"][0] for t in table] and stacked[1].tolist() == \
        [t["broadcast"][0] for t in table]
    np.testing.assert_allclose(stacked.sum(0), [t["sinks"][0] for t in table])


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_html_renders_the_table_in_headless_chromium(tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("chromium is missing: CI must install it (apt-get install chromium)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    out = tmp_path / "lb"
    build(make_runs(tmp_path / "runs"), out)
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([browser, *flags, "--dump-dom", (out / "leaderboard.html").as_uri()], capture_output=True,
                         text=True, timeout=120).stdout
    assert '<table id="leaderboard">' in dom and "<td>gate+reg</td>" in dom
    assert '<td class="best">61.00 ± 1.41</td>' in dom
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, "--window-size=1200,900", f"--screenshot={shot}",
                    (out / "leaderboard.html").as_uri()], capture_output=True, timeout=120)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_cli_errors(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "vitsinks.leaderboard", f"runs={tmp_path / 'none'}"],
                         capture_output=True, text=True)
    assert out.returncode == 1 and "neither a run folder nor a sweep" in out.stderr
    usage = subprocess.run([sys.executable, "-m", "vitsinks.leaderboard", "rns=x"], capture_output=True, text=True)
    assert usage.returncode == 1 and "rns" in usage.stderr and "usage: python -m vitsinks.leaderboard" in usage.stderr


def test_new_variants_sit_beside_the_four_with_their_pathway_and_causal_columns(tmp_path: Path) -> None:
    """Variants come from configs/exp (no hand-kept list): the four first, then the rest by name; the pathway
    share, the attention's common-mode share and an intervention summary reach their columns."""
    for exp in ("global+pen", "base", "reg+global+pen", "gate"):
        run = tmp_path / exp
        (run / "diagnostics" / "final").mkdir(parents=True)
        (run / "interventions" / "last").mkdir(parents=True)
        (run / "config.yaml").write_text(OmegaConf.to_yaml(load_config([f"exp={exp}"]), resolve=True))
        (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/probe_acc": 0.5}) + "\n")
        summary = {**_summary(1.0, 0.0), "common_mode_by_block": [0.2, 0.4]}
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
