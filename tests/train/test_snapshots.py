"""Periodic checkpoints: serialised once (last.pt linked to step_X.pt, later saves leave it alone), and the
weights-only snapshots that the diagnostics read and resuming passes over."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers.tiny import tiny_cfg
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.trainer import Trainer
from vitsinks.utils.errors import BadValue


def _count_serialisations(monkeypatch) -> list[Path]:
    written: list[Path] = []
    save = ckpt.files.torch_save

    def counting(obj, path) -> None:
        written.append(Path(path))
        save(obj, path)

    monkeypatch.setattr(ckpt.files, "torch_save", counting)
    return written


@pytest.mark.parametrize("links", [True, False])  # a file system with hard links, and one without (a copy)
def test_a_periodic_save_writes_once_and_a_later_last_pt_leaves_the_step_file_alone(runs: Path, monkeypatch,
                                                                                  links: bool) -> None:
    if not links:
        def no_links(src, dst) -> None:
            raise OSError(1, "Operation not permitted")

        monkeypatch.setattr(ckpt.os, "link", no_links)
    written = _count_serialisations(monkeypatch)
    tr = Trainer(tiny_cfg(runs, "name=once", "train.max_steps=4"))  # periodic at 3, last.pt again at 4
    seen = {}

    def look(t: Trainer) -> None:
        if t.progress.step == 3:
            d = t.rundir
            seen["same_file"] = os.path.samefile(d.last, d.step_checkpoint(3))
            seen["bytes"] = d.step_checkpoint(3).read_bytes()
            assert d.last.read_bytes() == seen["bytes"]

    tr.fit(on_step=look)
    d = tr.rundir
    assert written.count(d.step_checkpoint(3)) == 0 and written.count(d.last) == 2  # step 3 and step 4
    assert seen["same_file"] is links
    step3, last = ckpt.load(d.step_checkpoint(3)), ckpt.load(d.last)
    assert d.step_checkpoint(3).read_bytes() == seen["bytes"]  # the write of step 4 replaced last.pt, not it
    assert step3["progress"]["step"] == 3 and last["progress"]["step"] == 4
    key = "backbone.blocks.0.attn.qkv.weight"
    assert not torch.equal(step3["model"][key], last["model"][key])
    assert not list(d.ckpt_dir.glob(".*.tmp"))


def test_weights_only_snapshots_are_read_by_the_backbone_loader_and_passed_over_by_resume(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=w", "train.max_steps=3", "train.periodic_weights_only=true")).fit()
    d = runs / "w" / "checkpoints"
    snap, full = ckpt.load(d / "step_0000003.pt"), ckpt.load(d / "last.pt")
    assert snap["weights_only"] and "optimizer" not in snap and "rng_by_rank" not in snap
    assert snap["progress"] == full["progress"] and snap["model"].keys() == full["model"].keys()
    assert all(torch.equal(snap["model"][k], full["model"][k]) for k in full["model"])
    assert (d / "step_0000003.pt").stat().st_size < 0.5 * (d / "last.pt").stat().st_size
    model, _ = ckpt.load_backbone(d / "step_0000003.pt")  # what the diagnostics, probes and derived runs read
    expected = ckpt.backbone_state(full["model"])
    assert all(torch.equal(v, expected[k]) for k, v in model.state_dict().items())

    (d / "last.pt").unlink()  # a snapshot is no training state: the run is not restarted from it, nor from 0
    with pytest.raises(BadValue, match="no usable checkpoint .*weights-only snapshot"):
        Trainer(tiny_cfg(runs, "name=w", "train.max_steps=4", "train.periodic_weights_only=true")).fit()
    assert (d / "step_0000003.pt").is_file()
