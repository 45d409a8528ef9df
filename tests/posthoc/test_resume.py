"""A derived run cut short is finished by the command that made it (`vitsinks.posthoc.resume`): the processes are
really killed (SIGKILL, at a chosen point: the kill is planted in the command's own process), then the same command
runs again. The leaderboard leaves the half-written run out and names the command that finishes it."""

from __future__ import annotations

import json
import shlex
import signal
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import vitsinks.quant  # noqa: F401 - registers the w8a8 edit
import vitsinks.trainfree as tf
from tests.helpers.commands import run_module
from tests.helpers.killed import killed, staging
from tests.helpers.tiny import tiny_cfg
from tests.helpers.trainfree import mean_massive_args, run_status, source_checkpoint
from vitsinks.configs.cli import compose
from vitsinks.posthoc.method import METHODS
from vitsinks.posthoc.resume import edit_differences, finish_command
from vitsinks.report import build
from vitsinks.run.derive import derive, derived_run
from vitsinks.utils.errors import BadValue
from vitsinks.utils.rundir import RunDir


def source_run(runs: Path) -> Path:
    """`runs/src`, a run (config.yaml beside its checkpoint): the leaderboard tabulates it."""
    path = source_checkpoint(runs)
    RunDir(runs / "src").start(tiny_cfg(runs, "name=src", "model.depth=3"))
    return path


def test_the_same_edit_cut_short_is_derived_again_another_or_a_finished_one_is_kept(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = source_checkpoint(runs)
    cfg = tiny_cfg(runs, f"ckpt={path}", "trainfree.method=mean_massive", "trainfree.fit_images=4",
                   "trainfree.probes=false")
    run = derive(cfg)  # status `running`, and no process holds the run: a derivation cut short
    (run.results / "linear.json").parent.mkdir()
    (run.results / "linear.json").write_text("{}")  # a partial result of that derivation
    capsys.readouterr()
    assert derive(cfg).path == run.path  # the same command, no overwrite flag
    assert "holds this edit but did not finish (killed while it was written): deriving it again" in \
        capsys.readouterr().out
    assert not (run.results / "linear.json").exists() and run_status(run.path)["status"] == "running"
    with pytest.raises(BadValue, match=r"another edit \(trainfree.massive \(2 there, 3 now\)\)"):
        derive(tiny_cfg(runs, f"ckpt={path}", "trainfree.method=mean_massive", "trainfree.fit_images=4",
                        "trainfree.massive=3"))
    run.write_status("finished", method="mean_massive")
    with pytest.raises(BadValue, match="derived already with these settings and finished: .*overwrite=true"):
        derive(cfg)
    assert derive(cfg, overwrite=True).path == run.path
    # the command the leaderboard names is the same edit, into the same run
    recorded = OmegaConf.load(run.config)
    command = shlex.split(finish_command(run, recorded))
    assert command[:3] == ["python", "-m", "vitsinks.trainfree"] and "trainfree.probes=false" in command
    again = compose(command[3:], check=False)
    assert derived_run(again).path == run.path
    assert edit_differences(recorded, METHODS["mean_massive"], again.trainfree, str(again.ckpt)) == []


@pytest.mark.slow
def test_a_derivation_killed_while_diagnosing_is_finished_by_the_same_command(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = source_run(runs)
    argv = mean_massive_args(runs, path, "probes=false")
    run = runs / "src+mean_massive"
    out = killed("vitsinks.trainfree", argv, "fsync:summary.json")  # its diagnosis half-written
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert run_status(run)["status"] == "running" and staging(run)  # as the kill left it: a staging folder
    assert not (run / "diagnostics" / "final" / "summary.json").exists()

    board = build(runs, runs / "board")  # the half-written run is left out, and named with its command
    assert [t["variant"] for t in board] == ["base"]
    said = capsys.readouterr().out
    md = (runs / "board" / "leaderboard.md").read_text()
    note = next(line for line in md.splitlines() if line.startswith("Not finished: "))
    assert note.startswith("Not finished: src+mean_massive is left out (killed while it was written): finish it with "
                           f"`python -m vitsinks.trainfree ckpt={path} trainfree.method=mean_massive "
                           "trainfree.fit_images=4 trainfree.probes=false")
    assert note in said and note in (runs / "board" / "leaderboard.html").read_text()
    assert "src+mean_massive" not in (runs / "board" / "runs.csv").read_text()
    build(runs / "board" / "inputs", runs / "again")  # written again from its inputs: the same note
    assert note in (runs / "again" / "leaderboard.md").read_text()

    done = run_module("vitsinks.trainfree", *argv)  # the same command again
    assert done.returncode == 0, done.stderr[-2000:]
    assert "did not finish (killed while it was written): deriving it again" in done.stdout
    assert staging(runs) == [] and run_status(run)["status"] == "finished"
    assert json.loads((run / "diagnostics" / "final" / "summary.json").read_text())["shape"]["images"] == 4
    board = build(runs, runs / "board")
    assert len(board) == 2 and "Not finished" not in (runs / "board" / "leaderboard.md").read_text()
    with pytest.raises(SystemExit) as exit_:  # a third time: it is finished, and kept
        tf.cli(argv)
    assert exit_.value.code == 1 and "finished" in capsys.readouterr().err


@pytest.mark.slow
def test_a_quantization_killed_after_writing_its_quantized_copy_is_finished_by_the_same_command(
        runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = source_run(runs)
    argv = [f"ckpt={path}", f"runs_dir={runs}", "calib_images=4", "n_images=8", "probes=false"]
    derived = runs / "src" / "quant" / "w8a8"
    out = killed("vitsinks.quantize", argv, "vitsinks.quantize.feature_cosines")
    assert out.returncode == -signal.SIGKILL, out.stderr[-2000:]
    assert (derived / "checkpoints" / "last.pt").is_file() and run_status(derived)["status"] == "running"
    assert not (runs / "src" / "results" / "quant.json").exists()
    build(runs, runs / "board")
    md = (runs / "board" / "leaderboard.md").read_text()
    assert ("Not finished: the quantization of src (w8a8, killed while it was written): its quantization columns "
            f"are empty; finish it with `python -m vitsinks.quantize ckpt={path} quant.calib_images=4 quant.n_images=8 "
            "quant.probes=false`.") in md
    done = run_module("vitsinks.quantize", *argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert run_status(derived)["status"] == "finished" and (runs / "src" / "results" / "quant.json").is_file()
    assert staging(runs) == []
    build(runs, runs / "board")
    assert "Not finished" not in (runs / "board" / "leaderboard.md").read_text()
