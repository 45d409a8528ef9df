"""Nothing of the user's is ever deleted: files the user keeps beside and inside every folder vitsinks writes into
(the runs folder, a run and its checkpoints, results and diagnoses, a derived run, the W8A8 copy, an interventions
report, a leaderboard, an export) survive every command that writes or replaces them, and a command pointed at a
folder of the user's is refused in one line with nothing written."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers.commands import run_module
from tests.helpers.tiny import TINY
from vitsinks.utils.rundir import RunDir

EVAL = ["eval.max_train_images=32", "eval.max_val_images=8", "eval.linear_epochs=1", "eval.linear_lrs=[0.01]",
        "eval.dense_epochs=1"]
FAST = ["diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]


def plant(folder: Path, planted: dict[Path, str]) -> None:
    """The user's notes and a photo in a folder of theirs, in `folder`, each with its own content."""
    for rel in ("my_notes.txt", "photos/cat.jpg"):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"the user's {path}")
        planted[path] = path.read_text()


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]


def refused(proc: subprocess.CompletedProcess, folder: Path) -> None:
    """The command refused `folder` in one line, before it wrote anything."""
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert "give an empty or new folder" in last and str(folder) in last and "Traceback" not in proc.stderr


def survived(planted: dict[Path, str]) -> None:
    lost = sorted(str(p) for p, text in planted.items() if not p.is_file() or p.read_text() != text)
    assert not lost, f"the user's files lost: {lost}"


@pytest.mark.slow
def test_the_users_files_survive_every_command(tmp_path: Path) -> None:
    runs, planted = tmp_path / "runs", {}
    plant(runs, planted)  # beside the run folders
    run = RunDir(runs / "r")
    ckpt = f"ckpt={run.last}"
    common = [*TINY, f"runs_dir={runs}", *EVAL, *FAST]
    launch = ["vitsinks.launch", *common, "exp=reg", "name=r", "train.max_steps=2", "eval.after_train=true"]
    ok(run_module(*launch))
    for folder in (run.path, run.ckpt_dir, run.results, run.diagnostics_root, run.diagnostics("final")):
        plant(folder, planted)
    ok(run_module(*launch))  # finished: evaluated again, its final diagnosis and probes replaced
    assert (run.diagnostics("final") / "summary.json").is_file() and run.result("linear").is_file()
    survived(planted)

    ok(run_module("vitsinks.diagnose", ckpt, *common))
    plant(run.diagnostics("last"), planted)
    ok(run_module("vitsinks.diagnose", ckpt, *common))
    assert (run.diagnostics("last") / "summary.json").is_file()

    intervene = ["vitsinks.intervene", ckpt, *common, "n_images=4", "heldout_images=0", "edits=[drop_registers]"]
    ok(run_module(*intervene))
    plant(run.interventions("last"), planted)
    ok(run_module(*intervene))
    assert (run.interventions("last") / "summary.json").is_file()
    notebook = tmp_path / "notebook"
    plant(notebook, planted)
    refused(run_module(*intervene, f"intervene.out={notebook}"), notebook)

    derived = RunDir(runs / "r+mean_massive")
    trainfree = ["vitsinks.trainfree", ckpt, *common, "method=mean_massive", "fit_images=4", "probes=false"]
    ok(run_module(*trainfree))
    for folder in (derived.path, derived.ckpt_dir, derived.diagnostics("final")):
        plant(folder, planted)
    ok(run_module(*trainfree, "trainfree.overwrite=true"))  # the derived run replaced
    assert derived.last.is_file() and (derived.diagnostics("final") / "summary.json").is_file()

    quantize = ["vitsinks.quantize", ckpt, *common, "calib_images=8", "n_images=8", "quant.probes=false"]
    ok(run_module(*quantize))
    plant(run.quantized("w8a8"), planted)
    ok(run_module(*quantize))  # its W8A8 copy, a derived run, replaced
    assert RunDir(run.quantized("w8a8")).last.is_file() and run.result("quant").is_file()

    ok(run_module("vitsinks.leaderboard", f"runs={runs}"))
    plant(runs / "leaderboard", planted)
    plant(runs / "leaderboard" / "inputs", planted)
    ok(run_module("vitsinks.leaderboard", f"runs={runs}"))
    assert (runs / "leaderboard" / "leaderboard.md").is_file()
    refused(run_module("vitsinks.leaderboard", f"runs={runs}", f"out={notebook}"), notebook)

    exports = tmp_path / "exports"
    plant(exports, planted)
    ok(run_module("vitsinks.export", ckpt, f"out={exports / 'r'}"))
    plant(exports / "r", planted)
    ok(run_module("vitsinks.export", ckpt, f"out={exports / 'r'}"))
    survived(planted)
    assert sorted(p.name for p in notebook.iterdir()) == ["my_notes.txt", "photos"]  # nothing written there
