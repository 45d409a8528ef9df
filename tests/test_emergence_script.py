"""eval/emergence/make_emergence.sh, the study that spans sessions: a trial of it (one variant, tiny runs) run as a
first session, then as a later one on a fresh runs folder that has only the committed bank."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.requirements import require_fashion_mnist

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "eval" / "emergence" / "make_emergence.sh"
TINY = "model.embed_dim=48 model.num_heads=3 model.depth=2 train.max_steps=2 train.ckpt_every=2 diagnostics.n_images=4"
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # the script's python is this one


def study(tmp: Path, runs: str, *stage: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PATH": PATH, "RUNS": str(tmp / runs), "OUT": str(tmp / "out"), "BOARD": str(tmp / "board"),
            "PAGES": str(tmp / "pages"), "VARIANTS": "base", "SEEDS": "0", "METHODS": "zero_massive",
            "EXTRA": TINY, **env}
    return subprocess.run(["bash", str(SCRIPT), *stage], env=full, capture_output=True, text=True, cwd=tmp)


def rows(board: Path) -> list[str]:
    with (board / "runs.csv").open() as f:
        return sorted(r["run"] for r in csv.DictReader(f))


def title(board: Path) -> str:
    return json.loads((board / "inputs" / "leaderboard.json").read_text())["title"]


def test_a_trial_must_not_write_into_the_committed_study(tmp_path: Path) -> None:
    # all but one of its folders given (here in tmp, so that a broken check writes nothing into the repository)
    env = {**os.environ, "PATH": PATH, "EXTRA": "train.max_steps=4", "RUNS": str(tmp_path / "runs"),
           "OUT": str(tmp_path / "out"), "BOARD": str(tmp_path / "board")}
    out = subprocess.run(["bash", str(SCRIPT), "report"], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "EXTRA, VARIANTS, SEEDS or METHODS make a trial, not the study: give it its own RUNS, OUT, BOARD and PAGES"]
    assert not list(tmp_path.iterdir())


# A stand-in for `python` on the script's PATH: it records each `-m vitsinks.<command>` it is asked for (with the run
# name a training gets) and each findings page (with its board), and writes only the files the script checks;
# `python -c` goes to the real interpreter.
FAKE_PYTHON = f"""#!/usr/bin/env bash
case $1 in -m) ;; */findings.py) echo "findings $2" >> "$CALLS"; exit 0;; *) exec {sys.executable} "$@";; esac
mod=$2; shift 2; name=; runs=; ckpt=; run=
for a in "$@"; do case $a in name=*) name=${{a#name=}};; runs_dir=*) runs=${{a#runs_dir=}};;
                              ckpt=*) ckpt=${{a#ckpt=}};; run=*) run=${{a#run=}};; esac; done
echo "$mod $name" >> "$CALLS"
case $mod in
  vitsinks.launch) mkdir -p "$runs/$name/checkpoints" && touch "$runs/$name/checkpoints/last.pt" &&
                   echo '{{"status": "finished"}}' > "$runs/$name/status.json";;
  vitsinks.diagnose)
    if [ -n "$run" ]; then mkdir -p "$run/diagnostics" && touch "$run/diagnostics/over_training.png"
    else d=$(dirname "$(dirname "$ckpt")")/diagnostics/last; mkdir -p "$d" && touch "$d/report.html"; fi;;
esac
"""


@pytest.mark.parametrize("parallel", [1, 2])
def test_the_driver_trains_every_run_once_seed_by_seed_and_reports_after_each(tmp_path: Path, parallel: int) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python").write_text(FAKE_PYTHON)
    (bin_ / "python").chmod(0o755)
    calls = tmp_path / "calls"
    out = study(tmp_path, "runs", VARIANTS="base gate", SEEDS="0 1", PARALLEL=str(parallel), CALLS=str(calls),
                PATH=f"{bin_}{os.pathsep}{PATH}")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = calls.read_text().splitlines()
    trained = [line.split()[1] for line in lines if line.startswith("vitsinks.launch ")]
    order = ["emergence-base-s0", "emergence-gate-s0", "emergence-base-s1", "emergence-gate-s1"]
    # one at a time: in seed-major order, and both boards written after each run; in parallel: once, at the end
    assert (trained if parallel == 1 else sorted(trained)) == (order if parallel == 1 else sorted(order))
    assert sum(line.startswith("vitsinks.leaderboard") for line in lines) == (8 if parallel == 1 else 2)
    assert lines.count(f"findings {tmp_path / 'board'}") == (4 if parallel == 1 else 1)  # with the board


@pytest.mark.slow
def test_each_run_is_banked_and_a_later_session_tabulates_it_without_training_it_again(tmp_path: Path) -> None:
    require_fashion_mnist()
    first = study(tmp_path, "runs1")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "emergence-base-s0: training" in first.stdout
    bank = tmp_path / "board" / "inputs"
    assert sorted(p.name for p in bank.iterdir() if p.is_dir()) == ["emergence-base-s0",
                                                                    "emergence-base-s0+zero_massive"]
    assert {p.name for p in (bank / "emergence-base-s0" / "results").iterdir()} >= {"linear.json", "quant.json"}
    assert (tmp_path / "out" / "over_training_emergence-base-s0.png").is_file()
    assert (tmp_path / "pages" / "emergence-base-s0" / "report.html").is_file()
    assert rows(tmp_path / "out" / "leaderboard") == ["emergence-base-s0"]  # the trained runs only
    assert rows(tmp_path / "board") == ["emergence-base-s0", "emergence-base-s0+zero_massive"]
    assert "| emergence-base-s0 |" in (tmp_path / "board" / "findings.md").read_text()
    assert not title(tmp_path / "board").endswith("so far")
    board_before = (tmp_path / "board" / "leaderboard.md").read_text()

    # a later session: its runs folder is gone, the bank is committed; seed 1 has a run that has not finished
    shutil.rmtree(tmp_path / "runs1")
    unfinished = tmp_path / "runs2" / "emergence-base-s1"
    unfinished.mkdir(parents=True)
    shutil.copy(bank / "emergence-base-s0" / "config.yaml", unfinished / "config.yaml")
    (unfinished / "status.json").write_text('{"status": "running", "step": 1}')
    later = study(tmp_path, "runs2", "report", SEEDS="0 1")
    assert later.returncode == 0, later.stderr[-3000:]
    assert "emergence-base-s1: not trained yet, left out" in later.stderr
    assert rows(tmp_path / "board") == ["emergence-base-s0", "emergence-base-s0+zero_massive"]  # not the unfinished
    assert title(tmp_path / "board").endswith(" - 1 of 2 runs so far")
    assert title(tmp_path / "out" / "leaderboard").endswith(" - 1 of 2 runs so far")
    shutil.rmtree(unfinished)

    # the banked run is not trained again, and its tables are written from the bank as they were
    again = study(tmp_path, "runs2")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "emergence-base-s0: banked (its inputs are committed), not trained again" in again.stdout
    assert "training" not in again.stdout and not (tmp_path / "runs2" / "emergence-base-s0.log").exists()
    assert (tmp_path / "board" / "leaderboard.md").read_text() == board_before
