"""A leaderboard's inputs: exactly the files it read, enough to write the same leaderboard again, in place too."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.leaderboard import make_runs, sinks_summary
from vitsinks.leaderboard import leaderboard_command
from vitsinks.report import build, writer
from vitsinks.report.leaderboard_inputs import INPUTS, RECORD, RUNS_DIR, record, recorded_title
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir, find_runs


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


def test_the_inputs_are_the_files_read_and_only_the_summary_picked(tmp_path: Path) -> None:
    runs = make_runs(tmp_path / "runs")
    run = runs / "base-s0"
    old = run / "diagnostics" / "last" / "summary.json"  # an older diagnosis of last.pt: not the one read
    old.parent.mkdir(parents=True)
    old.write_text(json.dumps(sinks_summary(9.0, 9.0)))
    os.utime(old, ns=(1, 1))
    (run / "diagnostics" / "step_0000010").mkdir()
    (run / "diagnostics" / "step_0000010" / "summary.json").write_text("{}")
    (run / "results" / "dense_synthetic.png").write_bytes(b"png")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"weights")
    (run / "interventions" / "step_0000010").mkdir(parents=True)
    (run / "interventions" / "step_0000010" / "summary.json").write_text("{}")
    dest = record(find_runs(runs), tmp_path / "lb", "a title")
    assert _files(dest / "base-s0") == {"config.yaml", "metrics.jsonl", "results/linear.json",
                                        "results/dense_synthetic.json", "diagnostics/final/summary.json",
                                        "interventions/step_0000010/summary.json"}
    assert (dest / "base-s0" / "diagnostics/final/summary.json").read_bytes() == \
        (run / "diagnostics/final/summary.json").read_bytes()
    assert sorted(p.name for p in dest.iterdir() if p.is_dir()) == sorted(p.name for p in runs.iterdir())
    assert recorded_title(dest) == "a title" and recorded_title(runs) is None


def test_two_runs_of_one_name_are_refused(tmp_path: Path) -> None:
    a, b = make_runs(tmp_path / "a"), make_runs(tmp_path / "b")
    with pytest.raises(BadValue, match="several runs are named base-s0, base-s1"):
        record([RunDir(a / "base-s0"), RunDir(b / "base-s0"), RunDir(a / "base-s1"), RunDir(b / "base-s1")],
               tmp_path / "lb", "t")
    assert not (tmp_path / "lb" / INPUTS).exists()


def test_a_leaderboard_of_two_runs_of_one_name_is_refused_before_any_table_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = make_runs(tmp_path / "a"), make_runs(tmp_path / "b")
    out = tmp_path / "lb"
    out.mkdir()
    (out / "leaderboard.md").write_text("the old leaderboard")
    # a sweep manifest may list runs of several folders: here two of one name
    monkeypatch.setattr(writer, "run_dirs", lambda source: [RunDir(a / "base-s0"), RunDir(b / "base-s0")])
    with pytest.raises(BadValue, match="several runs are named base-s0"):
        build(tmp_path, out, "t")
    assert (out / "leaderboard.md").read_text() == "the old leaderboard" and sorted(os.listdir(out)) == [
        "leaderboard.md"]


@pytest.mark.slow
def test_the_leaderboard_written_again_from_its_inputs_in_place_is_the_same(tmp_path: Path) -> None:
    out = tmp_path / "lb"
    build(make_runs(tmp_path / "runs"), out, "the study")
    tables = {n: (out / n).read_text() for n in ("leaderboard.md", "leaderboard.csv", "leaderboard.html", "runs.csv")}
    inputs = {f: (out / INPUTS / f).read_bytes() for f in _files(out / INPUTS)}
    assert tables["leaderboard.md"].startswith("# the study\n")
    assert leaderboard_command([f"runs={out / INPUTS}"]) == 0  # written where its inputs sit, with their title
    assert {n: (out / n).read_text() for n in tables} == tables
    assert {f: (out / INPUTS / f).read_bytes() for f in _files(out / INPUTS)} == inputs
    assert json.loads((out / INPUTS / RECORD).read_text()) == {"title": "the study"}


def test_the_copies_keep_no_machine_path_and_tabulate_the_same(tmp_path: Path) -> None:
    runs = make_runs(tmp_path / "runs")
    linear = runs / "base-s0" / "results" / "linear.json"
    result = json.loads(linear.read_text())
    linear.write_text(json.dumps({**result, "checkpoint": str(runs / "base-s0" / "checkpoints" / "last.pt")}))
    config = runs / "base-s0" / "config.yaml"
    cfg = OmegaConf.load(config)
    cfg.runs_dir = str(runs)
    OmegaConf.save(cfg, config)
    dest = record(find_runs(runs), tmp_path / "lb", "t")
    copied = [p for p in dest.rglob("*") if p.is_file()]
    assert not [p for p in copied if str(tmp_path) in p.read_text()]  # no absolute path of this machine is kept
    assert json.loads((dest / "base-s0/results/linear.json").read_text())["checkpoint"] == \
        f"{RUNS_DIR}/base-s0/checkpoints/last.pt"
    for source, out in ((runs, tmp_path / "a"), (dest, tmp_path / "b")):  # the tables do not read those paths
        assert leaderboard_command([f"runs={source}", f"out={out}", "title=t"]) == 0
    assert (tmp_path / "a/leaderboard.csv").read_text() == (tmp_path / "b/leaderboard.csv").read_text()
