"""Sweeps: every swept override reaches the run name, finished runs are extended when asked, manifests keep ids."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.commands import launch
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.configs.cli import compose
from vitsinks.launch import _absolute
from vitsinks.launch import status as launch_status
from vitsinks.run import sweep as sw
from vitsinks.train.trainer import Trainer
from vitsinks.utils.errors import ConfigError
from vitsinks.utils.runstate import write_manifest


def _named(overrides: list[str]) -> list[str]:
    combos = sw.expand(overrides)
    cfgs = [_absolute(compose(c)) for c in combos]  # as the sweep itself composes them
    sw.name_runs(combos, cfgs)
    return [c.name for c in cfgs]


@pytest.mark.slow
def test_every_swept_override_reaches_the_run_name() -> None:
    names = _named(["exp=base", "train.lr=0.001,0.0001", "seed=0"])
    assert names == ["base-vit_mini-synthetic-s0-lr0.001", "base-vit_mini-synthetic-s0-lr0.0001"]
    assert _named(["exp=base,gate", "seed=0,1"]) == [  # exp and seed are in the default name already
        "base-vit_mini-synthetic-s0", "base-vit_mini-synthetic-s1", "gate-vit_mini-synthetic-s0",
        "gate-vit_mini-synthetic-s1"]
    long = _named(["exp=base", "model.global_pathway.state_dim=8,16", "objective.cm_skip_blocks=0,1",
                   "model.layerscale_init=0.1,0.01", "objective.knots=9,17"])
    assert len(set(long)) == 16 and all(len(n) < 80 for n in long)


def test_a_fixed_name_in_a_sweep_is_refused() -> None:
    with pytest.raises(ConfigError, match="share the run directory 'mine'"):
        _named(["exp=base,gate", "name=mine"])


def test_a_finished_run_is_relaunched_when_it_is_asked_for_more_steps(runs: Path) -> None:
    cfg = tiny_cfg(runs, "name=ext", "train.max_steps=2")
    Trainer(cfg).fit()
    assert sw.is_finished(runs / "ext", cfg)
    assert not sw.is_finished(runs / "ext", tiny_cfg(runs, "name=ext", "train.max_steps=4"))
    assert not sw.is_finished(runs / "ext", tiny_cfg(runs, "name=ext", "train.max_steps=2", "train.epochs=3"))
    saved = OmegaConf.load(runs / "ext" / "config.yaml")  # as an older version wrote it: a field fewer, one retired
    del saved.objective["sigreg"]
    saved.sweep = None
    OmegaConf.save(saved, runs / "ext" / "config.yaml")
    assert sw.is_finished(runs / "ext", cfg)


def test_a_run_killed_during_its_probes_is_not_finished_for_a_sweep(runs: Path) -> None:
    import json

    cfg = tiny_cfg(runs, "name=ev", "train.max_steps=2")
    Trainer(cfg).fit()  # trained, not probed: status.json says finished without "evaluated"
    probed = tiny_cfg(runs, "name=ev", "train.max_steps=2", "eval.after_train=true")
    assert sw.is_finished(runs / "ev", cfg) and not sw.is_finished(runs / "ev", probed)
    status = runs / "ev" / "status.json"
    status.write_text(json.dumps({**json.loads(status.read_text()), "evaluated": True}))
    assert sw.is_finished(runs / "ev", probed)


def test_a_relaunch_keeps_the_job_ids_and_logs_of_runs_it_does_not_resubmit() -> None:
    old = {"array_job_id": "77", "runs": [
        {"run_dir": "/r/a", "job_id": "77_0", "stdout": "/l/77_0.out", "stderr": "/l/77_0.err"},
        {"run_dir": "/r/b", "job_id": "77_1", "stdout": "/l/77_1.out", "stderr": "/l/77_1.err"}]}
    entries = [{"run_dir": "/r/a"}, {"run_dir": "/r/b"}]
    meta = sw.carry_over(old, entries, todo=[1], cluster="slurm")
    assert entries[0] == {"run_dir": "/r/a", "job_id": "77_0", "stdout": "/l/77_0.out", "stderr": "/l/77_0.err",
                          "cluster": "slurm", "state": "finished (not relaunched)"}
    assert entries[1]["state"] == "pending" and meta == {"array_job_id": "77", "earlier_array_job_ids": ["77"]}


@pytest.mark.slow
def test_local_sweep_over_a_learning_rate_writes_one_directory_per_value(tmp_path: Path) -> None:
    out = launch("-m", "exp=base", "train.lr=0.001,0.0001", *TINY, "train.max_steps=2", f"runs_dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    manifest = json.loads(next(tmp_path.glob("sweeps/sweep-*/sweep.json")).read_text())
    dirs = [Path(r["run_dir"]) for r in manifest["runs"]]
    assert len(set(dirs)) == 2
    for d, lr in zip(dirs, (0.001, 0.0001), strict=True):
        assert OmegaConf.load(d / "config.yaml").train.lr == lr
        assert [json.loads(ln)["step"] for ln in (d / "metrics.jsonl").read_text().splitlines()
                if "loss" in json.loads(ln)] == [1, 2]


def test_a_run_killed_while_running_is_reported_killed_without_writing_to_it(
        runs: Path, capsys: pytest.CaptureFixture) -> None:
    Trainer(tiny_cfg(runs, "name=k9", "train.max_steps=3")).fit()  # checkpoints up to step 3
    run = runs / "k9"
    holder = subprocess.Popen(  # the process that trains it: holds the run's lock and says running, as the trainer
        [sys.executable, "-c", "import sys, time; from vitsinks.utils.rundir import RunDir; r = RunDir(sys.argv[1]); "
         "r.lock(); r.write_status('running', step=3, total_steps=8); print('ready', flush=True); time.sleep(120)",
         str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        assert sw.run_state(run)["status"] == "running"  # alive: as it says
    finally:
        holder.kill()  # kill -9: status.json still says running
        holder.wait()
        holder.stdout.close()
    said = (run / "status.json").read_bytes()
    state = sw.run_state(run)
    assert state["status"] == "killed" and state["note"] == "no process holds the run; last checkpoint step 3"
    sweep = runs / "sweeps" / "s"
    write_manifest(sweep / "sweep.json", [{"index": 0, "name": "k9", "run_dir": str(run), "job_id": None}],
                      sweep_dir=str(sweep))
    capsys.readouterr()
    assert launch_status(str(sweep)) == 1
    out = capsys.readouterr().out
    assert "--- k9 (local) killed (no process holds the run; last checkpoint step 3): relaunch the sweep to resume it" \
        in out
    assert (run / "status.json").read_bytes() == said  # read, never written
    (run / "status.json").write_text('{"status": "runn')  # torn: shown, not a crash
    assert launch_status(str(sweep)) == 0
    assert "k9: unreadable (" in capsys.readouterr().out


def test_a_running_run_locked_on_another_node_is_never_called_killed(tmp_path: Path) -> None:
    """flock may be local to a node: a `running` run whose lock records another host is reported as running."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "running", "step": 7}))
    (run / ".lock").write_text("pid 123 on some-other-node")
    assert sw.run_state(run)["status"] == "running"
    (run / ".lock").write_text(f"pid 123 on {__import__('socket').gethostname()}")  # here: the probe can tell
    assert sw.run_state(run)["status"] == "killed"


def test_a_failed_runs_step_is_its_last_saved_one_not_the_last_logged(tmp_path: Path) -> None:
    run = tmp_path / "r"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"status": "failed", "step": 8, "reached": 10}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in (5, 10)))
    assert sw.run_state(run)["step"] == 8
