"""A run's metric log, `metrics.jsonl` (one JSON line per log step, `vitsinks.train.tracking`), read back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitsinks.utils import files
from vitsinks.utils.rundir import RunDir

RERUN = "delete it and relaunch the run (its curves then start at the resumed step)"  # the fix for a torn file


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All metric lines of a run (a torn last line dropped); a bad line elsewhere is a `BadFile`."""
    path = RunDir(run_dir).metrics
    return files.read_jsonl(path, RERUN) if path.exists() else []
