"""A torn results file (cut short by a kill or a full disk) stops the leaderboard with one line naming the file and
the command that writes it again (`utils.files.BadFile`), not a JSONDecodeError traceback."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.leaderboard import plant, quant
from vitsinks.leaderboard import leaderboard_command
from vitsinks.report import build, collect
from vitsinks.report.leaderboard_inputs import INPUTS, RECORD, recorded_title
from vitsinks.utils.files import BadFile
from vitsinks.utils.rundir import RunDir

# file (relative to the run) -> the command its BadFile names to write it again
FIXES = {
    "results/quant.json": "python -m vitsinks.quantize ckpt=",
    "results/linear.json": "python -m vitsinks.eval.linear ckpt=",
    "results/dense_voc.json": "python -m vitsinks.eval.dense ckpt=",
    "results/dense_ade20k_kempner.json": "python -m vitsinks.eval.dense ckpt=",
    "metrics.jsonl": "train ",
}


def _run(root: Path) -> RunDir:
    run = plant(root, "gate+reg-s0", quant_json=quant(4, 4))
    run.result("dense_voc").write_text(json.dumps({"mIoU": 0.4, "seed": 0, "checkpoint": str(run.last)}))
    run.result("dense_ade20k_kempner").write_text(json.dumps({"protocol": "kempner", "mIoU": 0.2, "seed": 0}))
    run.metrics.write_text("".join(json.dumps({"step": s, "val/probe_acc": 0.5}) + "\n" for s in (10, 20, 30)))
    return run


def _cut(path: Path) -> None:
    """Cut `path` short: in the middle of its JSON (of a JSON-lines file, in the middle of its first line, since a
    torn last line is the append a kill cut short, and dropped)."""
    text = path.read_text()
    path.write_text(text[: len(text) // 2] if path.suffix == ".json" else text[:10] + "\n" + text[text.index("\n"):])


@pytest.mark.parametrize("name", list(FIXES))
def test_a_torn_results_file_is_a_bad_file_naming_it_and_the_fix(tmp_path: Path, name: str) -> None:
    run = _run(tmp_path)
    assert collect(run)["linear_top1"] == pytest.approx(60.0)  # whole: read
    _cut(run.path / name)
    with pytest.raises(BadFile, match=re.escape(str(run.path / name))) as err:
        collect(run)
    assert FIXES[name] in str(err.value) and len(str(err.value).splitlines()) == 1


def test_a_torn_last_metrics_line_is_dropped(tmp_path: Path) -> None:
    run = _run(tmp_path)
    run.metrics.write_text(run.metrics.read_text()[:-12])  # the last append cut short by a kill
    assert collect(run)["online_top1"] == pytest.approx(50.0)


@pytest.mark.parametrize("read", [recorded_title, lambda src: leaderboard_command([f"runs={src}"])])
def test_a_torn_inputs_record_is_a_bad_file(tmp_path: Path, read: Callable) -> None:
    _run(tmp_path / "runs")
    build(tmp_path / "runs", tmp_path / "lb", "a title")
    assert recorded_title(tmp_path / "lb" / INPUTS) == "a title"
    record = tmp_path / "lb" / INPUTS / RECORD
    _cut(record)
    with pytest.raises(BadFile, match=re.escape(str(record))) as err:
        read(tmp_path / "lb" / INPUTS)
    assert "python -m vitsinks.leaderboard runs=" in str(err.value)
