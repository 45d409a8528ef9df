"""Training against a file system that refuses writes, and a diagnosis that a kill interrupted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.commands import run_module
from tests.helpers.fsfaults import fill, read_only, small_fs
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.train.checkpoint import load
from vitsinks.train.trainer import Trainer
from vitsinks.utils.files import BadFile, DiskFault, FileLock
from vitsinks.utils.rundir import RunDir


def test_full_disk_stops_with_one_line_and_status_names_the_last_saved_step(tmp_path: Path) -> None:
    with small_fs(tmp_path / "disk", 8192) as disk:
        cfg = tiny_cfg(disk / "runs", "name=full", "train.epochs=1")  # 4 steps, saved at step 3 (ckpt_every=3)
        filled: list[Path] = []

        def fill_after_first_save(tr: Trainer) -> None:
            if tr.progress.step == 3 and not filled:
                filled.append(fill(disk, leave_kb=16))  # room for status.json, not for a checkpoint

        with pytest.raises(DiskFault) as err:
            Trainer(cfg).fit(on_step=fill_after_first_save)
        run = RunDir(disk / "runs" / "full")
        message = str(err.value)
        assert "\n" not in message and "no space left" in message and str(run.ckpt_dir) in message
        assert load(run.last)["progress"]["step"] == 3  # the old checkpoint is whole
        status = json.loads(run.status.read_text())
        assert (status["status"], status["step"], status["reached"]) == ("failed", 3, 4)
        assert "no space left" in status["error"]
        assert not [p for p in run.ckpt_dir.iterdir() if p.name.startswith(".")]  # no temp file left behind
        filled[0].unlink()
        out = Trainer(cfg).fit()  # with room again, the run resumes from step 3 and finishes
        assert out["status"] == "finished" and load(run.last)["progress"]["step"] == 4


def test_launch_into_a_read_only_runs_folder_is_one_line(tmp_path: Path) -> None:
    with read_only(tmp_path / "runs") as runs:
        proc = run_module("vitsinks.launch", *TINY, f"runs_dir={runs}", "name=ro")
    assert proc.returncode == 1, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: cannot write") and "read-only file system" in lines[-1]
    assert not any(ln.startswith("Traceback") for ln in lines)


def test_diagnose_into_a_read_only_run_is_one_line_and_keeps_its_files(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=r", "train.epochs=1")).fit()
    run = RunDir(runs / "r")
    before = {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()}
    with read_only(run.path):
        proc = run_module("vitsinks.diagnose", f"ckpt={run.last}", "n_images=4", "diagnostics.plots=false",
                          f"runs_dir={runs}")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: cannot write")
    assert "Traceback" not in proc.stderr
    assert {p: p.read_bytes() for p in run.path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("keep", [True, False])
def test_an_interrupted_diagnosis_is_redone_on_relaunch_or_named_missing(runs: Path, keep: bool, capsys) -> None:
    cfg = tiny_cfg(runs, "name=d", "diagnostics.enabled=true", "diagnostics.plots=false", "diagnostics.n_images=4",
                   "train.ckpt_every=2", "train.epochs=1", f"train.keep_periodic={str(keep).lower()}")
    Trainer(cfg).fit()  # 4 steps: diagnoses of steps 2 and 4
    run = RunDir(runs / "d")
    done = {s: json.loads(p.read_text()) for s, p in run.diagnosed_steps().items()}
    assert sorted(done) == [2, 4]
    for step in (2, 4):  # as a kill mid-diagnosis leaves them: a folder without its summary
        run.summary(f"step_{step:07d}").unlink()
    capsys.readouterr()
    Trainer(cfg).fit()  # the relaunch of the finished run
    said = capsys.readouterr().out
    redone = {s: json.loads(p.read_text()) for s, p in run.diagnosed_steps().items()}
    assert redone[4]["sinks_per_image"] == done[4]["sinks_per_image"]  # the resumed weights are step 4's
    if keep:
        assert redone[2]["sinks_per_image"] == done[2]["sinks_per_image"]  # from step_0000002.pt
        assert "redoing the diagnosis of step 2" in said
    else:
        assert 2 not in redone and "step 2 is missing" in said


def test_failure_status_write_on_a_full_disk_is_a_warning_not_a_second_error(tmp_path: Path, capsys) -> None:
    with small_fs(tmp_path / "disk", 1024) as disk:
        run = RunDir(disk / "r")
        run.path.mkdir()
        run.write_status("running", step=0)
        fill(disk, leave_kb=0)
        with pytest.raises(DiskFault):
            run.write_status("running", step=1)
        run.write_status("failed", quiet=True, step=1)
        assert json.loads(run.status.read_text())["status"] == "running"
        assert "still says what it said before" in capsys.readouterr().err


def test_a_diagnosis_that_cannot_be_made_is_a_warning_and_training_goes_on(runs: Path, capsys) -> None:
    cfg = tiny_cfg(runs, "name=busy", "diagnostics.enabled=true", "diagnostics.plots=false", "diagnostics.n_images=4",
                   "train.ckpt_every=2", "train.epochs=1")
    run = RunDir(runs / "busy")
    with FileLock(run.step_diagnostics(2) / ".lock", "", ""):  # another command diagnosing step 2 right now
        out = Trainer(cfg).fit()
    assert out["status"] == "finished"
    said = capsys.readouterr().out
    assert "warning: step_0000002 not diagnosed" in said and "is being written by" in said
    assert sorted(run.diagnosed_steps()) == [4]


def test_a_torn_metrics_file_fails_the_run_in_its_status(runs: Path) -> None:
    cfg = tiny_cfg(runs, "name=torn", "train.max_steps=2")
    Trainer(cfg).fit()
    run = RunDir(runs / "torn")
    lines = run.metrics.read_text().splitlines()
    run.metrics.write_text("\n".join([lines[0][:10], *lines[1:]]) + "\n")  # a line torn in the middle
    with pytest.raises(BadFile, match="metrics.jsonl is torn"):
        Trainer(tiny_cfg(runs, "name=torn", "train.max_steps=3")).fit()
    status = json.loads(run.status.read_text())
    assert status["status"] == "failed" and "metrics.jsonl is torn" in status["error"]
