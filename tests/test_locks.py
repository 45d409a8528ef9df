"""Derived results have one writer at a time: trainfree, quantize, diagnose and intervene take their output's lock
before they look for existing outputs; a second command at once is refused in one line that fits it, and nothing
the first wrote is replaced."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.helpers.commands import run_commands, run_module
from tests.helpers.tiny import TINY
from tests.helpers.trainfree import source_checkpoint
from vitsinks.utils import files
from vitsinks.utils.rundir import RunDir

FAST = ["diagnostics.n_images=4", "diagnostics.plots=false", "diagnostics.report=false"]


def snapshot(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".lock")}


def refused(proc, fix: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("error: ") and "is being written by pid" in lines[-1] and fix in lines[-1], lines[-1]
    return lines[-1]


def test_two_trainfree_commands_on_one_derived_run_never_replace_each_other(runs: Path) -> None:
    path = source_checkpoint(runs)
    first, second = run_commands([
        [sys.executable, "-m", "vitsinks.trainfree", f"ckpt={path}", "method=mean_massive",
         f"fit_images={n}", "probes=false", f"runs_dir={runs}", *FAST] for n in (4, 8)])
    done = [p for p in (first, second) if p.returncode == 0]
    assert len(done) == 1, (first.stderr, second.stderr)  # one wrote the run, the other was refused
    loser = second if done[0] is first else first
    line = [ln for ln in loser.stderr.splitlines() if ln.strip()][-1]
    assert line.startswith("error: ") and ("is being written by pid" in line or "exists already" in line), line
    assert "name=" not in line  # trainfree takes no name=
    run = RunDir(runs / "src+mean_massive")
    kept = OmegaConf.load(run.config).trainfree.fit_images
    assert kept == (4 if done[0] is first else 8)  # the run on disk is the one whose command succeeded
    assert (run.diagnostics("final") / "summary.json").is_file()


def test_trainfree_while_another_derives_the_run_is_refused_in_its_own_words(runs: Path) -> None:
    path = source_checkpoint(runs)
    run = RunDir(runs / "src+mean_massive")
    with files.FileLock(run.path / ".lock", "", ""):  # another process deriving it (another open of the lock)
        proc = run_module("vitsinks.trainfree", f"ckpt={path}", "method=mean_massive", "fit_images=4",
                          "probes=false", f"runs_dir={runs}", *FAST)
    refused(proc, "derive into another runs_dir=")
    assert not (run.path / "config.yaml").exists()  # the refused command wrote nothing


EXTRA = {"quantize": ["calib_images=8", "n_images=8", "quant.probes=false"],
         "intervene": ["intervene.n_images=4", "intervene.heldout_images=4"]}


@pytest.mark.parametrize("command", ["diagnose", "quantize", "intervene"])
def test_a_derived_command_while_another_writes_its_output_is_refused(runs: Path, command: str) -> None:
    path = source_checkpoint(runs)
    run = RunDir(runs / "src")
    args = [f"ckpt={path}", f"runs_dir={runs}", *TINY, *FAST, *EXTRA.get(command, [])]
    if command != "intervene":  # (an untrained model has no sink to intervene on: its outputs stay empty)
        first = run_module(f"vitsinks.{command}", *args)
        assert first.returncode == 0, first.stderr
    before = snapshot(run.path)
    lock = {"diagnose": run.diagnostics("last") / ".lock", "quantize": run.path / "quant" / "w8a8" / ".lock",
            "intervene": run.interventions_root / ".last.lock"}[command]
    with files.FileLock(lock, "", ""):
        proc = run_module(f"vitsinks.{command}", *args)
    refused(proc, "wait for it to finish")
    assert snapshot(run.path) == before
