"""Train, then evaluate: the one path of local runs and SLURM tasks (the evaluations themselves: tests/eval)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.fsfaults import fill, small_fs
from tests.helpers.tiny import tiny_cfg
from vitsinks.run import pipeline
from vitsinks.run.sweep import is_finished
from vitsinks.train.callbacks import Callback
from vitsinks.train.trainer import Trainer
from vitsinks.utils.files import DiskFault
from vitsinks.utils.rundir import RunDir


@pytest.mark.parametrize(("after_train", "stop", "evaluated"), [(True, False, True), (False, False, False),
                                                                 (True, True, False)])
@pytest.mark.slow
def test_a_finished_run_is_evaluated_when_asked(runs: Path, monkeypatch: pytest.MonkeyPatch, after_train: bool,
                                                stop: bool, evaluated: bool) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(pipeline, "after_train", lambda cfg, run_dir: calls.append(run_dir) or {"linear": 0.5})
    cfg = tiny_cfg(runs, "name=p", "train.max_steps=2", f"eval.after_train={str(after_train).lower()}")
    trainer = Trainer(cfg)
    if stop:
        trainer.request_stop()  # a preempted run: stopped before the end, not evaluated
    summary = pipeline.train_and_evaluate(trainer)
    assert summary["status"] == ("interrupted" if stop else "finished")
    assert calls == ([runs / "p"] if evaluated else []) and ("after_train" in summary) == evaluated


def test_every_rank_evaluates_after_training_and_rank_0_alone_diagnoses_last(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    calls: list[object] = []
    monkeypatch.setattr(pipeline, "probes", lambda cfg, run_dir: calls.append("probes") or {"linear": 0.5})
    monkeypatch.setattr(pipeline, "diagnose_checkpoint",
                        lambda path, cfg, out_dir: calls.append(("diagnose", path, out_dir)) or {"sinks_per_image": 2})
    cfg = OmegaConf.create({"eval": {"after_train": True}, "diagnostics": {"enabled": True, "report": True},
                            "cluster": {"device": "cpu"}, "train": {"cpu_threads": None}, "data": {"num_workers": 0}})
    run = tmp_path / "r"  # no diagnosed step: no run page
    summaries = {}
    for rank in (1, 0):
        calls.clear()
        monkeypatch.setattr(pipeline, "rank_world", lambda rank=rank: (rank, 2))
        trainer = SimpleNamespace(cfg=cfg, run_dir=run, dist=SimpleNamespace(rank=rank, is_main=rank == 0),
                                  fit=lambda: {"status": "finished"},
                                  write_status=lambda status, **kw: calls.append(("status", status, kw)))
        summaries[rank] = (pipeline.train_and_evaluate(trainer), [c for c in calls if c[0] != "status"])
        statuses = [c[1:] for c in calls if c[0] == "status"]
        # rank 0 says "evaluating" until the probes and the final diagnosis are written, then "finished"
        assert statuses == ([("evaluating", {}), ("finished", {"evaluated": True})] if rank == 0 else [])
    # rank 1 joins the probes' collectives (a rank left out would hang rank 0 there) and skips the diagnostics
    assert summaries[1] == ({"status": "finished", "after_train": {"linear": 0.5}}, ["probes"])
    # rank 0 diagnoses after the probes, when no rank waits for it at a collective
    final = run / "diagnostics" / "final"
    assert summaries[0] == ({"status": "finished", "after_train": {"sinks_per_image": 2, "linear": 0.5}},
                            ["probes", ("diagnose", run / "checkpoints" / "last.pt", final)])


@pytest.mark.parametrize(("enabled", "report", "diagnosed", "page"), [
    (True, True, True, True), (True, False, True, False), (False, True, True, False), (True, True, False, False)])
def test_the_run_page_is_written_after_training_when_there_is_something_to_show(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool, report: bool, diagnosed: bool,
        page: bool) -> None:
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from vitsinks.utils.rundir import RunDir

    run = tmp_path / "r"
    if diagnosed:
        summary = RunDir(run).step_diagnostics(2) / "summary.json"
        summary.parent.mkdir(parents=True)
        summary.write_text("{}")
    written: list[Path] = []
    monkeypatch.setattr(pipeline, "run_page", lambda run_dir, cfg: written.append(run_dir) or run_dir / "page.html")
    cfg = OmegaConf.create({"eval": {"after_train": False}, "diagnostics": {"enabled": enabled, "report": report}})
    trainer = SimpleNamespace(cfg=cfg, run_dir=run, dist=SimpleNamespace(rank=0, is_main=True),
                              fit=lambda: {"status": "finished"})
    out = pipeline.train_and_evaluate(trainer)
    assert written == ([run] if page else []) and out.get("page") == (str(run / "page.html") if page else None)


def test_data_without_class_labels_or_masks_gets_no_probe_and_says_so(tmp_path: Path, capsys) -> None:
    from vitsinks.configs.schema import load_config

    cfg = load_config(["exp=base", "data=sinktask_nop", f"runs_dir={tmp_path}"])
    assert cfg.eval.after_train is False  # the sink tasks' preset: nothing to probe
    assert pipeline.probes(cfg, tmp_path / "nowhere") == {}  # nothing read: no checkpoint needed
    out = capsys.readouterr().out
    assert "linear probe skipped: data=sinktask_nop has no class labels" in out and "dense probe skipped" in out


AFTER = ("eval.after_train=true", "eval.max_train_images=16", "eval.max_val_images=8", "eval.linear_epochs=1",
         "eval.dense_epochs=1", "eval.linear_lrs=[0.01]", "eval.dense_examples=0", "diagnostics.plots=false",
         "diagnostics.n_images=4")


def _after_train_worker(rank: int, world: int, report, runs: str) -> None:  # noqa: ANN001 - run_ranks' report
    out = pipeline.after_train(tiny_cfg(Path(runs), "name=at", *AFTER), Path(runs) / "at")
    report(f"linear {out['linear']} dense {out['dense']} diagnosed {'sinks_per_image' in out}")


@pytest.mark.slow
def test_after_train_on_two_ranks_finishes_and_both_ranks_agree(runs: Path) -> None:
    from tests.helpers.distributed import run_ranks

    Trainer(tiny_cfg(runs, "name=at", "train.max_steps=1", *AFTER)).fit()
    reports = dict(r for r in run_ranks(_after_train_worker, str(runs)) if r[1].startswith("linear"))
    assert reports[0].endswith("diagnosed True") and reports[1].endswith("diagnosed False")
    assert reports[0].rsplit(" diagnosed", 1)[0] == reports[1].rsplit(" diagnosed", 1)[0]  # the same probes
    assert (runs / "at/results/linear.json").is_file() and (runs / "at/diagnostics/final/summary.json").is_file()
    assert json.loads((runs / "at/results/knn.json").read_text())["train_images"] == 16  # beside it, every shard's
    assert not list((runs / "at/eval_cache").glob("*rank*"))  # the shards were merged and removed


class FillOnClose(Callback):
    """Fills the disk of `folder` when training is over (its checkpoints saved), before the probes after training."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.filler = folder, None

    def close(self, trainer: Trainer) -> None:
        self.filler = fill(self.folder, leave_kb=8)  # room for status.json, not for the probes' features


@pytest.mark.slow
def test_a_full_disk_during_the_probes_after_training_fails_the_run_with_its_cause(tmp_path: Path) -> None:
    """The issue's case: the disk fills after training, during the probes: the command ends in the one-line
    `DiskFault` and status.json says `failed` with that cause (not `evaluating`); with room again a relaunch
    evaluates the run, which then is finished."""
    with small_fs(tmp_path / "disk", 16384) as disk:
        cfg = tiny_cfg(disk / "runs", "name=full", "train.max_steps=2", "eval.after_train=true",
                       "diagnostics.plots=false")
        trainer, filling = Trainer(cfg), FillOnClose(disk)
        trainer.callbacks.append(filling)
        with pytest.raises(DiskFault) as err:
            pipeline.train_and_evaluate(trainer)
        status = json.loads(RunDir(disk / "runs" / "full").status.read_text())
        assert status["status"] == "failed" and status["evaluated"] is False, status
        assert status["error"] == str(err.value) and "no space left" in status["error"]
        assert not is_finished(disk / "runs" / "full", cfg)  # a sweep's relaunch evaluates it
        filling.filler.unlink()
        summary = pipeline.train_and_evaluate(Trainer(cfg))
        assert "linear" in summary["after_train"] and is_finished(disk / "runs" / "full", cfg)
