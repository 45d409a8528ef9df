"""A derived run says `finished` only once its last result is written; `failed` or `stopped` (SIGINT, SIGTERM)
otherwise. The probes it will run are said first, with the switch that skips them."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vitsinks.trainfree as tf
from tests.helpers.tiny import tiny_cfg, tiny_vit
from tests.helpers.trainfree import mean_massive_args, run_status, source_checkpoint
from vitsinks.posthoc import plan
from vitsinks.utils.rundir import RunDir

ROOT = Path(__file__).resolve().parents[2]


def test_running_while_analysed_and_finished_only_after(runs: Path, monkeypatch, capsys) -> None:
    path = source_checkpoint(runs)
    seen = []
    monkeypatch.setattr(tf, "analyse", lambda run, probes: seen.append(run_status(run.path)) or {"probes": probes})
    tf.cli(mean_massive_args(runs, path))
    run = runs / "src+mean_massive"
    assert seen[0]["status"] == "running" and seen[0]["method"] == "mean_massive"  # the probes still to come
    assert run_status(run) == {**seen[0], "status": "finished"}  # the source and method kept
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("probes to run: "))  # said before they ran
    assert "linear (synthetic, 64 train + 32 val images, " in line and "dense (synthetic, 64 train + 32 val" in line
    assert "min here" in line and line.endswith("probes=false skips them")


def test_a_failure_before_the_last_result_is_failed(runs: Path, monkeypatch, capsys) -> None:
    path = source_checkpoint(runs)

    def boom(run: RunDir, probes: bool) -> None:
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(tf, "analyse", boom)
    with pytest.raises(RuntimeError, match="probe exploded"):
        tf.cli(mean_massive_args(runs, path, "probes=false"))
    said = run_status(runs / "src+mean_massive")
    assert said["status"] == "failed" and said["error"] == "probe exploded" and said["method"] == "mean_massive"
    assert "probes to run" not in capsys.readouterr().out  # probes=false: nothing announced


def test_sigint_is_stopped(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    with pytest.raises(KeyboardInterrupt), run.working(method="m"):
        raise KeyboardInterrupt
    assert run_status(run.path)["status"] == "stopped" and "SIGINT" in run_status(run.path)["error"]
    with run.working():  # the info is kept from the last status
        pass
    assert run_status(run.path) == {"status": "finished", "method": "m"}


def test_a_derived_run_killed_by_sigterm_before_its_results_is_stopped(runs: Path) -> None:
    """The real command in a fresh interpreter; its analysis sends itself SIGTERM (as `kill` or SLURM would) before
    writing anything: the process still ends by SIGTERM, and the run says `stopped`."""
    path = source_checkpoint(runs)
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        import vitsinks.trainfree as tf
        def analyse(run, probes):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # SIGTERM ends the process before this returns
            (run.path / "results").mkdir()
        tf.analyse = analyse
        tf.cli({mean_massive_args(runs, path)!r})
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == -signal.SIGTERM, out.stderr[-2000:]
    run = runs / "src+mean_massive"
    said = run_status(run)
    assert said["status"] == "stopped" and "SIGTERM" in said["error"] and not (run / "results").exists()


def test_the_plan_counts_the_capped_images_and_an_image_folder_is_unknown(runs: Path) -> None:
    cfg = tiny_cfg(runs, "eval.max_train_images=40", "eval.dense_protocol=kempner", "eval.dense_size=64")
    assert plan.probe_images(cfg) == {"linear": ("synthetic", 40, 32), "dense": ("synthetic", 40, 32)}
    line = plan.describe(cfg, tiny_vit().eval(), "probes=false")
    assert "kempner protocol, 10 epochs" in line and "min here" in line
    folder = tiny_cfg(runs, "data=imagenet", "data.root=/nowhere")
    assert plan.probe_images(folder) == {"linear": ("imagenet", None, None)}  # no masks: no dense probe
    assert "the whole split of an image folder" in plan.describe(folder, tiny_vit().eval(), "probes=false")


def test_the_plan_of_data_without_labels_or_masks_runs_no_probe(runs: Path) -> None:
    from vitsinks.configs.schema import load_config

    cfg = load_config(["exp=base", "data=sinktask_nop", f"runs_dir={runs}", "eval.after_train=true"])
    assert plan.probe_images(cfg) == {}  # as the pipeline: no class labels, no masks
    assert plan.describe(cfg, tiny_vit().eval(), "probes=false") == (
        "no probes to run: data=sinktask_nop has no class labels and no masks")
