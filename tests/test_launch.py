"""The main command, end to end as a user runs it (tiny settings), and its bad-input exits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.commands import launch
from tests.helpers.tiny import TINY
from vitsinks.utils.metrics_log import read_metrics


@pytest.mark.slow
def test_main_command_trains_writes_the_run_and_says_what_next(tmp_path: Path) -> None:
    out = launch("exp=gate+reg", *TINY, f"runs_dir={tmp_path}", "diagnostics.enabled=true", "diagnostics.plots=false")
    assert out.returncode == 0, out.stderr
    run = tmp_path / "gate+reg-vit_cpu-synthetic-s0"
    trained, numbers, page = out.stdout.strip().splitlines()[-3:]  # it ends with three lines
    assert f"run directory: {run}" in out.stdout
    assert trained.startswith("trained gate+reg vit_cpu on synthetic, seed 0: finished at step 8/8, loss ")
    losses = [m["loss"] for m in read_metrics(run) if "loss" in m]  # logged every step (TINY)
    assert f"loss {losses[0]:.3f} at step 1 -> {losses[-1]:.3f}" in trained
    online = [m for m in read_metrics(run) if "val/probe_acc" in m][-1]["val/probe_acc"]
    assert numbers == f"online probe {100 * online:.1f}%; no probes after training (eval.after_train=false)"
    assert page == f"page: {run / 'diagnostics' / 'report.html'}" and (run / "diagnostics" / "report.html").is_file()
    assert (run / "config.yaml").read_text().count("registers: 4") == 1
    assert (run / "checkpoints" / "last.pt").is_file() and (run / "metrics.jsonl").stat().st_size > 0
    assert (run / "diagnostics" / "step_0000008" / "summary.json").is_file()
    again = launch("exp=gate+reg", *TINY, f"runs_dir={tmp_path}", "train.epochs=3")  # resume and extend
    assert again.returncode == 0 and "finished at step 12" in again.stdout
    last_loss = [m for m in read_metrics(run) if "loss" in m][-1]["loss"]
    done = launch("exp=gate+reg", *TINY, f"runs_dir={tmp_path}", "train.epochs=3")  # nothing left: says the last loss
    assert done.returncode == 0 and "finished at step 12/12, loss " in done.stdout
    assert f"-> {last_loss:.3f}" in done.stdout
    assert "nan" not in done.stdout


@pytest.mark.slow
def test_bad_inputs_exit_non_zero_with_one_readable_line(tmp_path: Path) -> None:
    missing = launch(*TINY, "data=imagenet", f"data.root={tmp_path / 'nowhere'}")
    assert missing.returncode == 1
    assert f"error: data.root {tmp_path / 'nowhere'} does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr
    gate = launch(*TINY, "model.gate=sideways")
    assert gate.returncode == 1 and "'sideways', expected one of [none, elementwise, headwise]" in gate.stderr


@pytest.mark.slow
def test_local_sweep_runs_each_run_and_writes_the_manifest(tmp_path: Path) -> None:
    args = ["-m", "exp=base,gate", *TINY, "train.max_steps=1", f"runs_dir={tmp_path}"]
    out = launch(*args)
    assert out.returncode == 0, out.stderr
    manifest = json.loads(next(tmp_path.glob("sweeps/sweep-*/sweep.json")).read_text())
    assert [r["exp"] for r in manifest["runs"]] == ["base", "gate"]
    assert [r["state"] for r in manifest["runs"]] == ["finished", "finished"]
    assert all((Path(r["run_dir"]) / "checkpoints" / "last.pt").is_file() for r in manifest["runs"])
    again = launch(*args)  # relaunch: nothing to do
    assert again.returncode == 0 and "finished (not relaunched)" in again.stdout and "vitsinks: " not in again.stdout
    status = launch("status", f"sweep={Path(manifest['sweep_dir'])}")
    assert status.returncode == 0 and status.stdout.count("1/1") == 2


def test_the_closing_lines_name_the_run_its_numbers_and_its_page(tmp_path: Path) -> None:
    import json
    from types import SimpleNamespace

    from vitsinks.configs.schema import load_config
    from vitsinks.launch import closing_lines

    cfg = load_config(["exp=gate+reg", "seed=3"])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in [
        {"step": 10, "loss": 0.7}, {"step": 20, "loss": 0.55}, {"step": 20, "val/probe_acc": 0.8}]))
    trainer = SimpleNamespace(run_dir=tmp_path, total_steps=20)
    sinks = {"all": {"all": 0.25}, "nop": {"all": 0.25}, "broadcast": {"all": 0.0}}
    summary = {"status": "finished", "step": 20, "val/probe_acc": 0.8125, "page": "runs/x/diagnostics/report.html",
               "after_train": {"linear": {"top1": 93.75}, "dense": {"mIoU": 0.4466, "data": "synthetic"},
                               "sinks_per_image": sinks}}
    assert closing_lines(cfg, trainer, summary) == [
        "trained gate+reg vit_mini on synthetic, seed 3: finished at step 20/20, loss 0.700 at step 10 -> 0.550",
        "online probe 81.2%; linear probe 93.8%; mIoU 44.7 (synthetic, dinov2 dense probe); sink events per image "
        "0.25 (NOP 0.25, broadcast 0.00)",
        "page: runs/x/diagnostics/report.html"]
