"""Train, then evaluate: the one path of local runs and SLURM tasks (the evaluations themselves: tests/eval)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import tiny_cfg
from vitsinks.run import pipeline
from vitsinks.train.trainer import Trainer


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
