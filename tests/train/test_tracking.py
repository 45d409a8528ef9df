"""metrics.jsonl: what a relaunch keeps, and reading it through `files.read_jsonl`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.tiny import tiny_cfg
from vitsinks.train.tracking import Tracker
from vitsinks.train.trainer import Trainer
from vitsinks.utils.files import BadFile
from vitsinks.utils.metrics_log import read_metrics


def test_relaunching_a_finished_run_appends_nothing_and_reports_its_numbers(runs: Path) -> None:
    cfg = tiny_cfg(runs, "name=done", "train.max_steps=2")
    first = Trainer(cfg).fit()
    metrics = runs / "done" / "metrics.jsonl"
    logged = metrics.read_bytes()
    assert sum("val/probe_acc" in m for m in read_metrics(runs / "done")) == 1  # the final validation
    again = Trainer(cfg).fit()
    assert metrics.read_bytes() == logged
    assert again["status"] == "finished" and again["val/probe_acc"] == first["val/probe_acc"]


def test_metrics_are_read_through_read_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')  # a kill mid-append
    assert read_metrics(tmp_path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    tracker = Tracker(tmp_path, _disabled(), "t", {}, resume_step=2)  # a resume drops the torn line too
    tracker.log({"loss": 1.0}, 3)
    assert [json.loads(ln)["step"] for ln in path.read_text().splitlines()] == [1, 2, 3]
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(BadFile, match="metrics.jsonl is torn or is not JSON lines .*line 2"):
        read_metrics(tmp_path)
    with pytest.raises(BadFile, match="line 2"):
        Tracker(tmp_path, _disabled(), "t", {}, resume_step=2)


def _disabled() -> object:
    from vitsinks.configs.schema import WandbConfig

    return WandbConfig(mode="disabled")
