"""From the user's side: head-wise RMSNorm, and a mitigation on the modern baseline (QK-norm and 2D RoPE), each
launched as a user does (`python -m vitsinks.launch exp=...`), train, are diagnosed and probed, and reach the
leaderboard under their variant names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.commands import run_module
from tests.helpers.tiny import TINY
from vitsinks.utils.rundir import RunDir

EVAL = ["eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
        "eval.dense_epochs=1", "eval.after_train=true"]
DIAGNOSE = ["diagnostics.enabled=true", "diagnostics.n_images=4", "diagnostics.plots=false",
            "diagnostics.report=false"]


@pytest.mark.slow
def test_headnorm_and_a_gate_on_the_modern_baseline_launch_train_diagnose_probe_and_reach_the_leaderboard(
        tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    common = [*TINY, f"runs_dir={runs}", "train.max_steps=2", *EVAL, *DIAGNOSE]
    launches = {"headnorm-vit_cpu-synthetic-s0": ("headnorm", ["exp=headnorm"]),  # run name: (variant, overrides)
                "modern": ("gate+qknorm+rope", ["exp=gate", "model.qk_norm=true", "model.rope=true", "name=modern"])}
    for name, (variant, args) in launches.items():
        proc = run_module("vitsinks.launch", *common, *args)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run = RunDir(runs / name)
        assert run.last.is_file() and run.result("linear").is_file(), name
        assert run.status_info()["variant"] == variant
        summary = json.loads((run.diagnostics("final") / "summary.json").read_text())
        assert summary["recompute_error_max"] < 1e-4, name
    proc = run_module("vitsinks.leaderboard", f"runs={runs}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    board = (runs / "leaderboard" / "leaderboard.md").read_text()
    assert "headnorm" in board and "gate+qknorm+rope" in board
