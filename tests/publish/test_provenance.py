"""What an export reads: `run=` is the run's last checkpoint, with its step and its run; one of `ckpt=` and `run=`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.exported_runs import STEP, make_run
from vitsinks.publish.provenance import checkpoint_path, read
from vitsinks.utils import files
from vitsinks.utils.errors import BadValue, InputNotFound


def test_run_names_its_last_checkpoint_read_with_its_progress(runs: Path) -> None:
    run = make_run(runs, "gr", "exp=gate+reg")
    path = checkpoint_path(None, str(run.path))
    assert path == run.last
    source = read(path)
    assert (source.step, source.epoch, source.run.path, source.stem) == (STEP, 1, run.path, "last")
    assert source.sha256 == files.sha256(run.last) and source.model.variant == "gate+reg"
    assert not source.model.training


def test_one_of_ckpt_and_run_and_it_must_exist(runs: Path, tmp_path: Path) -> None:
    with pytest.raises(BadValue, match="one of ckpt=<checkpoint file> or run=<run folder>"):
        checkpoint_path(None, None)
    with pytest.raises(BadValue, match="one of ckpt="):
        checkpoint_path("a.pt", "runs/a")
    with pytest.raises(InputNotFound, match="has no checkpoints/last.pt"):
        checkpoint_path(None, str(tmp_path))
    with pytest.raises(InputNotFound, match="no such checkpoint file"):
        checkpoint_path(str(tmp_path / "missing.pt"), None)
