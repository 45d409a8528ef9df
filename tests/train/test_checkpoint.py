"""Checkpoints: never NaN weights on disk, resuming from the newest usable file, clear messages for bad files."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.helpers.commands import run_command
from tests.helpers.distributed import run_ranks
from tests.helpers.tiny import TINY, tiny_cfg
from vitsinks.train import checkpoint as ckpt
from vitsinks.train.checkpoint import CheckpointMismatch, load_backbone
from vitsinks.train.trainer import NonFiniteLoss, Trainer
from vitsinks.utils import files
from vitsinks.utils.distributed import gather_objects
from vitsinks.utils.errors import BadValue, NonFinite


def finite(path: Path) -> bool:
    return not ckpt.non_finite(ckpt.load(path)["model"])


def test_weights_that_became_nan_are_never_saved_and_the_message_names_a_real_checkpoint(runs: Path) -> None:
    trainer = Trainer(tiny_cfg(runs, "name=nanw", "train.ckpt_every=2"))

    def diverging_update(optimizer, args, kwargs) -> None:  # the update blows the weights up; the loss was finite
        if trainer.progress.step == 3:  # the step about to become step 4, a checkpoint step
            with torch.no_grad():
                trainer.model.backbone.blocks[1].mlp.fc1.weight.fill_(float("inf"))

    trainer.optimizer.register_step_post_hook(diverging_update)
    with pytest.raises(NonFiniteLoss, match="weights are not finite at step 4") as err:
        trainer.fit()
    message = str(err.value)
    named = Path(message.split(" is the last good checkpoint")[0].split("; ")[-1])
    assert named.is_file() and named.name == "last.pt" and finite(named)
    assert ckpt.load(named)["progress"]["step"] == 2
    assert not (runs / "nanw/checkpoints/step_0000004.pt").exists()


def test_message_when_no_checkpoint_exists_yet(runs: Path) -> None:
    trainer = Trainer(tiny_cfg(runs, "name=early"))

    def poison(tr: Trainer) -> None:
        with torch.no_grad():
            tr.model.backbone.blocks[0].attn.qkv.weight.fill_(float("nan"))

    with pytest.raises(NonFiniteLoss, match="no checkpoint was written yet") as err:
        trainer.fit(on_step=poison)
    assert "checkpoints/last.pt" not in str(err.value)


@pytest.mark.slow
def test_huge_learning_rate_exits_with_one_line_and_no_nan_checkpoint(tmp_path: Path) -> None:
    out = run_command([sys.executable, "-m", "vitsinks.launch", *TINY, "train.lr=1e6", "name=huge",
                          f"runs_dir={tmp_path}"])
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "non-finite" in [ln for ln in out.stderr.splitlines() if ln.startswith("error: ")][0]
    for path in (tmp_path / "huge" / "checkpoints").glob("*.pt"):
        assert finite(path), path


def _nan_checkpoint(runs: Path) -> Path:
    Trainer(tiny_cfg(runs, "name=good", "train.max_steps=1")).fit()
    state = ckpt.load(runs / "good/checkpoints/last.pt")
    state["model"]["backbone.blocks.0.attn.qkv.weight"].fill_(float("nan"))
    bad = runs / "bad" / "checkpoints" / "last.pt"
    bad.parent.mkdir(parents=True)
    torch.save(state, bad)
    return bad


@pytest.mark.slow
def test_evaluation_and_diagnostics_refuse_a_checkpoint_with_nan_weights(runs: Path) -> None:
    bad = _nan_checkpoint(runs)
    with pytest.raises(NonFinite, match="non-finite weights"):
        load_backbone(bad)
    for module in ("vitsinks.eval.linear", "vitsinks.eval.dense", "vitsinks.diagnose"):
        out = run_command([sys.executable, "-m", module, f"ckpt={bad}", *TINY])
        assert out.returncode == 1 and "non-finite weights" in out.stderr and "Traceback" not in out.stderr, module
    assert not (runs / "bad" / "results").exists()


def test_non_finite_features_are_refused_and_never_cached(tmp_path: Path) -> None:
    from vitsinks.probes.features import extract

    data = [(torch.zeros(2), 0)] * 4
    with pytest.raises(NonFinite, match="features are not finite"):
        extract(data, lambda items: {"x": torch.full((len(items), 2), float("nan"))}, tmp_path / "c.pt", 2, "test")
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_resume_falls_back_to_the_newest_step_checkpoint_and_never_restarts(runs: Path) -> None:
    Trainer(tiny_cfg(runs, "name=fb", "train.max_steps=7")).fit()  # step_3, step_6, last (7)
    d = runs / "fb" / "checkpoints"
    step3 = (d / "step_0000003.pt").read_bytes()
    (d / "last.pt").unlink()
    tr = Trainer(tiny_cfg(runs, "name=fb", "train.max_steps=7"))
    assert tr.resume() and tr.progress.step == 6
    (d / "last.pt").write_bytes((d / "step_0000006.pt").read_bytes()[:1000])  # a torn last.pt
    tr = Trainer(tiny_cfg(runs, "name=fb", "train.max_steps=8"))
    summary = tr.fit()
    assert summary["step"] == 8 and (d / "step_0000003.pt").read_bytes() == step3
    assert ckpt.load(d / "last.pt")["progress"]["step"] == 8


def test_no_usable_checkpoint_is_refused_without_touching_the_files(runs: Path) -> None:
    d = runs / "broken" / "checkpoints"
    d.mkdir(parents=True)
    (d / "last.pt").write_bytes(b"PK\x03\x04 torn")
    (d / "step_0000003.pt").write_text("not a checkpoint")
    with pytest.raises(BadValue, match="no usable checkpoint"):
        Trainer(tiny_cfg(runs, "name=broken")).fit()
    assert (d / "last.pt").read_bytes() == b"PK\x03\x04 torn"


def test_unreadable_files_are_named_for_what_they_are(tmp_path: Path) -> None:
    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(BadValue, match="is not a PyTorch checkpoint") as err:
        ckpt.load(text)
    assert "delete" not in str(err.value)
    torn = tmp_path / "torn.pt"
    torch.save({"a": torch.zeros(1000)}, torn)
    torn.write_bytes(torn.read_bytes()[:200])
    with pytest.raises(BadValue, match="truncated or corrupt"):
        ckpt.load(torn)


def test_killed_saves_leave_no_temp_files_behind(runs: Path) -> None:
    d = runs / "tmp" / "checkpoints"
    d.mkdir(parents=True)
    leftover = d / ".last.pt.x1y2z3.tmp"
    leftover.write_bytes(b"half a checkpoint")
    Trainer(tiny_cfg(runs, "name=tmp", "train.max_steps=1")).fit()
    assert not leftover.exists() and (d / "last.pt").is_file()


def test_a_run_name_reused_with_other_data_is_refused_by_name(runs: Path, capsys: pytest.CaptureFixture) -> None:
    Trainer(tiny_cfg(runs, "name=reuse", "train.max_steps=1")).fit()
    capsys.readouterr()
    with pytest.raises(CheckpointMismatch, match="data.num_classes: 4 vs 6"):
        Trainer(tiny_cfg(runs, "name=reuse", "data.num_classes=6")).fit()
    assert "resuming from" not in capsys.readouterr().out  # said only of a checkpoint that fits


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def draws() -> tuple[Any, ...]:
    """One draw of every global generator (what a drop-path mask or a view's augmentation draws from)."""
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def _rng_worker(rank: int, world: int, report: Callable[[str], None], path: str) -> None:
    seed_all(100 + rank)  # each rank its own stream, as the trainer seeds them
    states = ckpt.rng_states_by_rank()
    assert len(states) == world
    expected = draws()
    if rank == 0:
        files.torch_save({"rng_by_rank": states, "rng": states[0]}, Path(path))
    dist.barrier()
    seed_all(0)  # perturbed, the same on every rank: what restoring rank 0's state everywhere amounts to
    assert ckpt.restore_rng(torch.load(path, weights_only=False), rank, world, fallback_seed=7) is None
    got = draws()
    assert got == expected
    both = gather_objects(got)
    assert both[0] != both[1]  # the ranks' streams stay apart after the resume
    report("restored")


@pytest.mark.slow
def test_each_of_two_ranks_restores_its_own_random_state(tmp_path: Path) -> None:
    reports = run_ranks(_rng_worker, str(tmp_path / "rng.pt"))
    assert sorted(r for r, what in reports if what == "restored") == [0, 1]
    assert len(torch.load(tmp_path / "rng.pt", weights_only=False)["rng_by_rank"]) == 2


def test_a_checkpoint_of_other_ranks_restores_what_it_can_and_says_so() -> None:
    seed_all(1)
    st0, exp0 = ckpt.rng_state(), draws()
    seed_all(2)
    st1, exp1 = ckpt.rng_state(), draws()
    seed_all(77)
    fresh = draws()  # what a rank without a saved state draws from its fallback seed

    assert ckpt.restore_rng({"rng_by_rank": [st0, st1]}, 1, 2, fallback_seed=77) is None and draws() == exp1
    old = {"rng": st0}  # an older checkpoint: rank 0's states only
    note = ckpt.restore_rng(old, 0, 2, fallback_seed=77)
    assert draws() == exp0
    assert note is not None and "\n" not in note and "rank 0's random state only" in note
    assert "rank 0 restored its own random state, rank 1 started new streams" in note
    assert ckpt.restore_rng(old, 1, 2, fallback_seed=77) == note and draws() == fresh != exp0
    assert ckpt.restore_rng(old, 0, 1, fallback_seed=77) is None and draws() == exp0  # one process: as before
    note = ckpt.restore_rng({"rng_by_rank": [st0, st1, st0, st1]}, 1, 2, fallback_seed=77)  # 4 ranks, resumed on 2
    assert draws() == exp1 and "written by 4 rank(s) on 2 rank(s)" in note and "ranks 2-3 were dropped" in note
