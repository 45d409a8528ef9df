"""SLURM through submitit against a real single-node SLURM (bash slurm/local-cluster.sh start; CI starts it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers.commands import run_command, run_commands
from tests.helpers.requirements import require_slurm
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.run.sweep import run_state
from vitsinks.train.trainer import Trainer
from vitsinks.utils.metrics_log import read_metrics
from vitsinks.utils.runstate import read_manifest

CLUSTER = ["cluster=local_slurm"]


@pytest.fixture(autouse=True)
def _slurm() -> None:
    require_slurm()


def launch(*args: str, idle_s: float = 300) -> subprocess.CompletedProcess:
    return run_command([sys.executable, "-m", "vitsinks.launch", *args], idle_s=idle_s)


def job_ids() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i"], capture_output=True, text=True).stdout
    return set(out.split())


def wait_progress(done, progress, what: str, stall: float = 300.0, cap: float = 3600.0) -> None:
    """Wait until `done()`, failing only when `progress()` (e.g. the run's step) has not changed for `stall` seconds:
    a loaded machine makes the job slower, not stuck. `cap` only guards against a job that moves forever."""
    start = changed = time.time()
    last = progress()
    while not done():
        now, current = time.time(), progress()
        if current != last:
            last, changed = current, now
        if now - changed > stall or now - start > cap:
            raise AssertionError(f"no progress for {now - changed:.0f}s ({now - start:.0f}s in all) waiting for "
                                 f"{what}; last progress: {current}")
        time.sleep(0.3)


def finished(run_dir: Path) -> bool:
    return run_state(run_dir)["status"] in ("finished", "failed")


def final_loss(run_dir: Path) -> float:
    return [m for m in read_metrics(run_dir) if "loss" in m][-1]["loss"]


@pytest.mark.slow
def test_single_job_trains_to_the_end(runs: Path) -> None:
    out = launch("exp=gate", *TINY, *CLUSTER, f"runs_dir={runs}", "name=one")
    assert out.returncode == 0, out.stderr
    assert "submitted SLURM job" in out.stdout
    wait_progress(lambda: finished(runs / "one"), lambda: run_state(runs / "one"), "the job to finish")
    assert run_state(runs / "one")["status"] == "finished"
    assert (runs / "one" / "checkpoints" / "last.pt").is_file()


@pytest.mark.slow
def test_array_of_four_variants_then_relaunch_and_status(runs: Path) -> None:
    before = job_ids()
    out = launch("-m", "exp=base,gate,reg,gate+reg", *TINY, *CLUSTER, f"runs_dir={runs}", "train.epochs=1")
    assert out.returncode == 0, out.stderr
    assert "as SLURM job array" in out.stdout
    sweep = Path(out.stdout.split("manifest: ")[1].split()[0]).parent
    manifest = read_manifest(sweep)
    ids = [r["job_id"] for r in manifest["runs"]]
    assert len({i.split("_")[0] for i in ids}) == 1 and sorted(i.split("_")[1] for i in ids) == ["0", "1", "2", "3"]
    assert len(job_ids() - before) >= 1  # one array
    names = subprocess.run(["squeue", "-h", "-t", "all", "-j", manifest["array_job_id"], "-o", "%j"],
                           capture_output=True, text=True).stdout.split()
    assert names and set(names) == {f"vitsinks-{sweep.name}"}  # the array is named after the sweep, not one exp
    runs_dirs = [Path(r["run_dir"]) for r in manifest["runs"]]
    wait_progress(lambda: all(finished(d) for d in runs_dirs), lambda: [run_state(d) for d in runs_dirs],
                  "the four array tasks")
    for d, exp in zip(runs_dirs, ["base", "gate", "reg", "gate+reg"], strict=True):
        assert run_state(d)["status"] == "finished" and run_state(d)["variant"] == exp
        assert (d / "checkpoints" / "last.pt").is_file()
    status = launch("status", f"sweep={sweep}")
    assert status.returncode == 0 and status.stdout.count("finished") == 4 and "4/4" in status.stdout
    # relaunching the sweep leaves the finished runs alone and keeps their job ids and logs
    again = launch("-m", "exp=base,gate,reg,gate+reg", *TINY, *CLUSTER, f"runs_dir={runs}", "train.epochs=1")
    assert again.returncode == 0 and "submitted" not in again.stdout
    kept = read_manifest(sweep)
    assert [r["job_id"] for r in kept["runs"]] == ids and kept["array_job_id"] == manifest["array_job_id"]
    assert all(Path(r["stdout"]).is_file() for r in kept["runs"])
    # with nothing left to submit, the partition is still checked
    bad = launch("-m", "exp=base,gate,reg,gate+reg", *TINY, *CLUSTER, f"runs_dir={runs}", "train.epochs=1",
                 "cluster.partition=nope")
    assert bad.returncode == 1 and "partition 'nope' does not exist" in bad.stderr


def _uninterrupted(runs: Path, *overrides: str) -> float:
    Trainer(tiny_cfg(runs, "name=reference", *overrides)).fit()
    return final_loss(runs / "reference")


# 768 cheap steps (8 images, the two global views; ~0.06 s each on 2 cores): long enough that the interruption lands
# mid-run, also after `scontrol requeue`, whose SIGTERM submitit ignores, so the job trains on until SIGKILL comes
# KillWait (5 s) later: ~9x margin here
LONG = ["data.train_size=3072", "train.batch_size=8", "views.n_local=0", "train.epochs=2", "train.ckpt_every=8"]
TOTAL = 768


def resumed_at(log: Path) -> list[int]:
    """Steps the job resumed from, read from its log ("resuming from <last.pt> at step k")."""
    return [int(line.rsplit(" ", 1)[1]) for line in log.read_text().splitlines() if "resuming from" in line]


def _interrupt_and_finish(runs: Path, name: str, interrupt: list[str]) -> tuple[Path, Path]:
    out = launch(*TINY, *LONG, *CLUSTER, f"runs_dir={runs}", f"name={name}")
    assert out.returncode == 0, out.stderr
    job = out.stdout.split("submitted SLURM job ")[1].split(":")[0]
    run = runs / name
    wait_progress(lambda: run_state(run)["step"] >= 10, lambda: run_state(run), "the job to pass step 10")
    subprocess.run([*interrupt, job], check=True)
    log = runs / "slurm_logs" / job / f"{job}_0_log.out"
    wait_progress(lambda: resumed_at(log) and finished(run) and run_state(run)["step"] == TOTAL,
                  lambda: (run_state(run), resumed_at(log) if log.exists() else []), "the job to restart and finish")
    assert 0 < resumed_at(log)[0] < TOTAL  # it really stopped mid-run and resumed from a checkpoint
    return run, log


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory: pytest.TempPathFactory) -> float:
    """The final loss of the LONG run trained here without interruption (once for both resume tests)."""
    return _uninterrupted(tmp_path_factory.mktemp("reference"), *LONG)


@pytest.mark.slow
def test_scontrol_requeue_mid_run_resumes_to_the_same_final_loss(runs: Path, long_reference: float) -> None:
    run, log = _interrupt_and_finish(runs, "requeued", ["scontrol", "requeue"])
    assert resumed_at(log)[0] % 8 == 0  # killed without a signal: back to the last periodic checkpoint
    assert final_loss(run) == long_reference


@pytest.mark.slow
def test_preemption_signal_saves_requeues_and_resumes_exactly(runs: Path, long_reference: float) -> None:
    run, log = _interrupt_and_finish(runs, "preempted", ["scancel", "--signal=USR2"])
    err = log.with_name(log.name.replace("_log.out", "_log.err")).read_text()
    assert "Caught signal SIGUSR2" in err
    assert resumed_at(log)[0] >= 10  # saved when the signal came (after step 10), not at an older checkpoint
    assert final_loss(run) == long_reference


@pytest.mark.slow
@pytest.mark.parametrize("exp", ["base", "global+pen"])  # the penalty sums its terms over ranks before the ratio
def test_two_task_job_runs_ddp_over_gloo(runs: Path, exp: str) -> None:
    out = launch(*TINY, *CLUSTER, f"exp={exp}", "cluster.tasks_per_node=2", "train.max_steps=3", f"runs_dir={runs}",
                 "name=ddp")
    assert out.returncode == 0, out.stderr
    wait_progress(lambda: finished(runs / "ddp"), lambda: run_state(runs / "ddp"), "the 2-task job")
    state = run_state(runs / "ddp")
    assert state["status"] == "finished" and state["world_size"] == 2
    Trainer(tiny_cfg(runs, f"exp={exp}", "name=single", "train.max_steps=3")).fit()
    a = torch.load(runs / "ddp/checkpoints/last.pt", weights_only=False)["model"]
    b = torch.load(runs / "single/checkpoints/last.pt", weights_only=False)["model"]
    torch.testing.assert_close(a["backbone.blocks.1.mlp.fc2.weight"], b["backbone.blocks.1.mlp.fc2.weight"],
                               atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize(("override", "message"), [
    ("cluster.partition=nonexistent", "partition 'nonexistent' does not exist"),
    ("cluster.time_min=1", "leaves no time to train and save a checkpoint"),
    ("runs_dir=/proc/vitsinks-unwritable", "cannot write to /proc/vitsinks-unwritable"),
])
@pytest.mark.slow
def test_bad_cluster_settings_fail_before_submitting(runs: Path, override: str, message: str) -> None:
    before = job_ids()
    args = [sys.executable, "-m", "vitsinks.launch", *TINY, *CLUSTER, f"runs_dir={runs}", override]
    for out in run_commands([args, [*args, "-m", "exp=base,gate"]]):  # one run and a sweep
        assert out.returncode == 1 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    assert not job_ids() - before  # nothing new was submitted (old jobs may age out of squeue meanwhile)


@pytest.mark.slow
def test_after_train_diagnoses_and_evaluates_the_final_checkpoint(runs: Path) -> None:
    out = launch(*TINY, *CLUSTER, "train.max_steps=2", "eval.after_train=true", "diagnostics.plots=false",
                 "eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.dense_epochs=1",
                 f"runs_dir={runs}", "name=after")
    assert out.returncode == 0, out.stderr
    written = [runs / "after/results/dense_synthetic.json", runs / "after/diagnostics/final/summary.json"]
    wait_progress(lambda: all(p.exists() for p in written),  # the probes first (every rank), then the diagnosis
                  lambda: sorted(str(f) for f in (runs / "after").rglob("*")), "the after-train evaluations")
    assert json.loads((runs / "after/diagnostics/final/summary.json").read_text())["shape"]["blocks"] == 2
    assert json.loads((runs / "after/results/linear.json").read_text())["val_images"] == 8


@pytest.mark.slow
def test_intervention_shards_run_as_one_job_array_then_merge(runs: Path, sinktask_run) -> None:
    shutil.rmtree(sinktask_run(runs, "base", "nop", name="nop") / "diagnostics")  # the shards compute stage 1
    args = [f"run={runs / 'nop'}", "n_images=32", "heldout_images=8", "intervene.min_events=10",
            "edits=[zero_sink_value,redirect_sink_attention]", f"runs_dir={runs}"]
    before = job_ids()
    out = run_command([sys.executable, "-m", "vitsinks.intervene", *args, "nshards=2", *CLUSTER])
    assert out.returncode == 0, out.stderr
    assert "submitted SLURM job array" in out.stdout
    folder = runs / "nop" / "interventions" / "last"
    ids = json.loads((folder / "shards" / "array.json").read_text())["job_ids"]
    assert len(ids) == 2 and set(ids).isdisjoint(before)
    metas = [folder / "shards" / f"{k}-of-2" / "meta.json" for k in (0, 1)]
    # wait on the cluster's own progress: until both tasks have left the queue (a safety cap only for a hang)

    def queued() -> list[str]:
        out = subprocess.run(["squeue", "-h", "-o", "%i %t"], capture_output=True, text=True).stdout.splitlines()
        # a pending array shows as one line `<array>_[0-1]`, running tasks as `<array>_<k>`: match the array id
        return sorted(line for line in out if line.split()[0].split("_")[0] == ids[0].split("_")[0])

    wait_progress(lambda: not queued(), lambda: (queued(), [m.is_file() for m in metas]), "the array to finish")
    assert all(m.is_file() for m in metas), [p.read_text()[-2000:] for p in (runs / "slurm_logs").rglob("*.err")]
    merged = run_command([sys.executable, "-m", "vitsinks.intervene", f"merge={folder}"])
    assert merged.returncode == 0, merged.stderr
    local = run_command([sys.executable, "-m", "vitsinks.intervene", *args, f"intervene.out={runs / 'local'}"])
    assert local.returncode == 0, local.stderr
    assert sorted((folder / "interventions.csv").read_text().splitlines()) == \
        sorted((runs / "local" / "interventions.csv").read_text().splitlines())
