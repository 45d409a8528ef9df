"""The package's register-count study (`study=registers`, vitsinks/configs/study/registers.yaml): a sweep of
`model.registers` over 0, 1, 4, 8, 16 and 32 from a fresh install, a user's file of the name still winning; its six
variants are six leaderboard rows; one tiny run of it with 32 registers trains and diagnoses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.commands import launch
from tests.helpers.leaderboard import cells, plant
from tests.helpers.tiny import TINY
from vitsinks.configs import search
from vitsinks.configs.schema import config_dir, load_config
from vitsinks.configs.usage import help_text
from vitsinks.launch import study_sweep
from vitsinks.leaderboard import leaderboard_command
from vitsinks.models import run_variant
from vitsinks.pages.options_page import group_options
from vitsinks.run import sweep as sw

COUNTS = [0, 1, 4, 8, 16, 32]  # the register counts the study is for
STUDY = config_dir() / "study" / "registers.yaml"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, no `$VITSINKS_CONFIGS` and no checkout: the package's configs alone."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv(search.ENV, raising=False)
    monkeypatch.setattr(search, "checkout_configs", lambda: None)
    return work


def test_the_package_ships_the_study_and_it_sweeps_the_six_register_counts(installed: Path) -> None:
    params = OmegaConf.load(STUDY).hydra.sweeper.params
    assert [int(n) for n in str(params["model.registers"]).split(",")] == COUNTS  # the file says it
    combos = sw.expand(study_sweep(["study=registers", "seed=0"]))
    cfgs = [load_config(c) for c in combos]
    assert [c.model.registers for c in cfgs] == COUNTS  # what the sweep composes, one run per count
    assert [run_variant(c) for c in cfgs] == ["base", "reg1", "reg", "reg8", "reg16", "reg32"]
    sw.name_runs(combos, cfgs)  # raises when two runs would share a directory
    assert [c.name for c in cfgs] == [f"base-vit_mini-synthetic-s0-registers{n}" for n in COUNTS]
    line = next(ln for ln in help_text("doc", {}).splitlines() if ln.strip().startswith("study:"))
    assert line.split(":", 1)[1].replace(" ", "").split(",") == ["registers"]  # --help lists it


def test_a_users_file_of_the_name_replaces_it_and_the_command_line_still_wins(installed: Path) -> None:
    mine = installed / "configs" / "study" / "registers.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("# @package _global_\nhydra:\n  sweeper:\n    params:\n      model.registers: 2,3\n"
                    "      seed: 0,1\n")
    assert study_sweep(["study=registers"]) == ["model.registers=2,3", "seed=0,1"]
    assert study_sweep(["study=registers", "seed=5"]) == ["model.registers=2,3", "seed=5"]
    mine.unlink()
    assert study_sweep(["study=registers", "exp=gate"]) == [f"model.registers={','.join(map(str, COUNTS))}",
                                                            "exp=gate"]


def test_the_options_page_lists_the_study_with_what_it_sets() -> None:
    rows = dict(group_options())["study"]
    row = next(r for r in rows if r[0] == "`study=registers`")  # the package's: not marked (configs/)
    assert row[2] == f"`model.registers={','.join(map(str, COUNTS))}`" and "registers" in row[1]


def test_its_six_variants_are_six_leaderboard_rows_with_the_concatenated_patches_column(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for i, n in enumerate(COUNTS):
        run = plant(runs, f"registers{n}", f"model.registers={n}", exp="base", linear=50.0 + i)
        run.result("linear_patches").write_text(json.dumps({"protocol": "patches", "best": {"top1": 70.0 + i}}))
    assert leaderboard_command([f"runs={runs}", f"out={tmp_path / 'board'}"]) == 0
    quality = cells((tmp_path / "board" / "leaderboard.md").read_text(), "Quality")
    names = ["base", "reg1", "reg", "reg8", "reg16", "reg32"]
    # one row each, none merged: the study's variants first, then by register count (reg8 before reg16)
    assert list(quality) == ["base", "reg", "reg1", "reg8", "reg16", "reg32"]
    patches = "linear top-1 (concatenated-patches linear probe)"
    assert [quality[v]["linear top-1"] for v in names] == [f"{50.0 + i:.2f}" for i in range(6)]
    assert [quality[v][patches] for v in names] == [f"{70.0 + i:.2f}" for i in range(6)]


@pytest.mark.slow
def test_a_tiny_run_of_the_study_with_32_registers_trains_and_diagnoses(tmp_path: Path) -> None:
    out = launch("-m", "study=registers", "model.registers=32", *TINY, "train.max_steps=2", f"runs_dir={tmp_path}",
                 "diagnostics.enabled=true", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads(next(tmp_path.glob("sweeps/sweep-*/sweep.json")).read_text())
    assert [r["state"] for r in manifest["runs"]] == ["finished"]
    run = Path(manifest["runs"][0]["run_dir"])
    assert "vitsinks: reg32 vit_cpu" in out.stdout and "49 tokens per image" in out.stdout  # [CLS] + 32 + 16 patches
    assert OmegaConf.load(run / "config.yaml").model.registers == 32
    summary = json.loads(next((run / "diagnostics").glob("step_*/summary.json")).read_text())
    assert summary["shape"]["registers"] == 32 and summary["shape"]["blocks"] == 2
    assert set(summary["sinks_per_image"]["all"]) == {"cls", "register", "patch", "all"}
    assert (run / "diagnostics" / "report.html").is_file()
